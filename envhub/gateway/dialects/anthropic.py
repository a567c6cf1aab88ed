"""Anthropic Messages: ``POST /v1/messages`` (JSON or the ``message_start`` .. ``message_stop`` SSE sequence) and
``POST /v1/messages/count_tokens``.

``system`` (a string or text blocks) is the leading system message; ``tool_result`` blocks become ``tool`` messages
(before the text of the same user turn); ``tool_use`` blocks become the assistant's tool calls (``input`` as JSON
arguments); ``thinking`` blocks are dropped (the gateway never issues them). Server tools (``web_search_...``,
``bash_...``) are left out: only custom tools reach the model.
"""
from __future__ import annotations

import json
from typing import Any

from envhub.gateway.core import ChatRequest, ChatResult
from envhub.gateway.dialects import chat, refuse_choices, sampling, sse
from envhub.gateway.matching import text_of
from envhub.gateway.messages import BadRequest, tool_call

NAME = "anthropic"
_DROPPED_BLOCKS = ("thinking", "redacted_thinking")


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of content blocks", param=where)
    return [b for b in content if isinstance(b, dict)]


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        text = system if isinstance(system, str) else "\n\n".join(text_of([b]) for b in _blocks(system, "system"))
        out.append({"role": "system", "content": text})
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages must be a non-empty list", param="messages")
    for i, m in enumerate(msgs):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant", "system"):
            raise BadRequest(f"messages[{i}].role must be user or assistant, got {role!r}", param=f"messages[{i}]")
        texts, calls = [], []
        for b in _blocks(m.get("content"), f"messages[{i}]"):
            kind = b.get("type")
            if kind == "text":
                texts.append(str(b.get("text") or ""))
            elif kind == "tool_result" and role == "user":
                content = b.get("content")
                text = content if isinstance(content, str) else text_of(_blocks(content or [], f"messages[{i}]"))
                out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id") or ""),
                            "content": ("[error] " if b.get("is_error") else "") + text})
            elif kind == "tool_use" and role == "assistant":
                calls.append(tool_call(str(b.get("id") or ""), str(b.get("name") or ""), b.get("input") or {}))
            elif kind in _DROPPED_BLOCKS:
                continue
            else:
                raise BadRequest(f"messages[{i}] has a {kind!r} block, which this gateway does not serve (text, "
                                 "tool_use, tool_result, thinking)", param=f"messages[{i}].content")
        if role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif texts or role == "system":
            out.append({"role": role, "content": "\n".join(texts) if role == "system" else "".join(texts)})
    return out


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """Custom tools as chat tools; server tools (``web_search_...``, ``bash_...``: a ``type`` other than ``custom``)
    are left out. Anthropic's ``input_schema`` is the function's ``parameters``."""
    if not isinstance(tools, list):
        return chat.function_tools(tools)  # None, or the error for a non-list
    flat = [{"type": "function", "name": t.get("name"), "description": t.get("description"),
             "parameters": t.get("input_schema") or {"type": "object"}}
            if isinstance(t, dict) and t.get("type") in (None, "custom") else {"type": "server-tool"} for t in tools]
    return chat.function_tools(flat, flat=True)


def parse(body: dict[str, Any], *, counting: bool = False) -> ChatRequest:
    refuse_choices(body)
    if not counting and body.get("max_tokens") is None:
        raise BadRequest("max_tokens: Field required", param="max_tokens")
    params, given = sampling(body, ("max_tokens",), "stop_sequences") if not counting else sampling({}, (), "x")
    choice = body.get("tool_choice") or {}
    tools = None if isinstance(choice, dict) and choice.get("type") == "none" else _tools(body.get("tools"))
    return ChatRequest(NAME, _messages(body), tools, params, given, bool(body.get("stream")),
                       str(body.get("model") or ""))


def _content(r: ChatResult) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": r.text}] if r.text or not r.tool_calls else []
    for c in r.tool_calls:
        try:
            args = json.loads(c["function"]["arguments"] or "{}")
        except json.JSONDecodeError:
            args = {}
        blocks.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"], "input": args})
    return blocks


def _stop(r: ChatResult, req: ChatRequest) -> tuple[str, str | None]:
    if r.tool_calls:
        return "tool_use", None
    if r.finish_reason == "length":
        return "max_tokens", None
    hit = next((s for s in req.params.stop if s and r.text.endswith(s)), None)
    return ("stop_sequence", hit) if hit else ("end_turn", None)


def _usage(r: ChatResult) -> dict[str, int]:
    return {"input_tokens": r.prompt_tokens, "output_tokens": r.completion_tokens,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}


def reply(r: ChatResult, req: ChatRequest, body: dict[str, Any]) -> dict[str, Any]:
    reason, seq = _stop(r, req)
    return {"id": r.call.call_id, "type": "message", "role": "assistant", "model": req.model or "envhub",
            "content": _content(r), "stop_reason": reason, "stop_sequence": seq, "usage": _usage(r)}


def stream(r: ChatResult, req: ChatRequest, body: dict[str, Any]) -> list[bytes]:
    reason, seq = _stop(r, req)
    start = {"id": r.call.call_id, "type": "message", "role": "assistant", "model": req.model or "envhub",
             "content": [], "stop_reason": None, "stop_sequence": None, "usage": {**_usage(r), "output_tokens": 0}}
    out = [sse({"type": "message_start", "message": start}, "message_start")]
    for i, block in enumerate(_content(r)):
        if block["type"] == "text":
            first, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            first = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"], ensure_ascii=False)}
        out.append(sse({"type": "content_block_start", "index": i, "content_block": first}, "content_block_start"))
        out.append(sse({"type": "content_block_delta", "index": i, "delta": delta}, "content_block_delta"))
        out.append(sse({"type": "content_block_stop", "index": i}, "content_block_stop"))
    out.append(sse({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                    "usage": {"output_tokens": r.completion_tokens}}, "message_delta"))
    out.append(sse({"type": "message_stop"}, "message_stop"))
    return out


def error(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
            404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
            529: "overloaded_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
