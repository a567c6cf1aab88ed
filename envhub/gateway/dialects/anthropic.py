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
from envhub.gateway.messages import BILLING_HEADER, BadRequest, content_text, tool_call

NAME = "anthropic"
_DROPPED_BLOCKS = ("thinking", "redacted_thinking")


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadRequest(f"{where}.content must be a string or a list of content blocks", param=where)
    return [b for b in content if isinstance(b, dict)]


def _system(body: dict[str, Any]) -> str:
    """The ``system`` field as vLLM's Anthropic route joins it: text blocks concatenated, empty ones and Claude
    Code's billing-header block left out."""
    system = body.get("system")
    if not system:
        return ""
    if isinstance(system, str):
        return system
    parts = []
    for j, b in enumerate(_blocks(system, "system")):
        if b.get("type") != "text":
            raise BadRequest(f"system[{j}] is a {b.get('type')!r} block; system takes text blocks only",
                             param=f"system[{j}]")
        text = b.get("text")
        if isinstance(text, str) and text and not text.startswith(BILLING_HEADER):
            parts.append(text)
    return "".join(parts)


def _tool_result(b: dict[str, Any], where: str) -> str:
    """A ``tool_result``'s content as text (text blocks joined with ``"\n"``, as vLLM does); an image or any other
    block is refused, never dropped."""
    content = b.get("content")
    if content is None or isinstance(content, str):
        return content or ""
    return content_text(_blocks(content, where), f"{where}.content")


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Anthropic messages as chat messages, block for block as vLLM's ``/v1/messages`` converts them (so the prompt
    is the one vLLM's server renders): ``tool_result`` blocks become ``tool`` messages where they stand (before the
    text of the same turn); text blocks are joined with ``"\n"`` (empty ones skipped); ``tool_use`` blocks become
    the assistant's tool calls. An ``is_error`` result is rendered as its text, as vLLM renders it."""
    out: list[dict[str, Any]] = []
    system = _system(body)
    if system:
        out.append({"role": "system", "content": system})
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("messages must be a non-empty list", param="messages")
    for i, m in enumerate(msgs):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("user", "assistant", "system"):
            raise BadRequest(f"messages[{i}].role must be user or assistant, got {role!r}", param=f"messages[{i}]")
        texts, calls = [], []
        for j, b in enumerate(_blocks(m.get("content"), f"messages[{i}]")):
            kind, where = b.get("type"), f"messages[{i}].content[{j}]"
            if kind == "text":
                if not isinstance(b.get("text"), str):
                    raise BadRequest(f"{where}.text must be a string", param=where)
                if b["text"]:
                    texts.append(b["text"])
            elif kind == "tool_result" and role == "user":
                out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id") or ""),
                            "content": _tool_result(b, where)})
            elif kind == "tool_use" and role == "assistant":
                calls.append(tool_call(str(b.get("id") or ""), str(b.get("name") or ""), b.get("input") or {}))
            elif kind in _DROPPED_BLOCKS:
                continue
            else:
                raise BadRequest(f"messages[{i}] has a {kind!r} block, which this gateway does not serve (text, "
                                 "tool_use, tool_result, thinking)", param=f"messages[{i}].content")
        if role == "system":
            text = "".join(t for t in texts if not t.startswith(BILLING_HEADER))
            if text:
                out.append({"role": "system", "content": text})
        elif role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": "\n".join(texts)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
        elif texts:
            out.append({"role": role, "content": "\n".join(texts)})
    return out


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """Custom tools as the chat tools vLLM's Anthropic route builds (``input_schema`` is the function's
    ``parameters``; ``description``, ``strict``, ``defer_loading`` kept as vLLM keeps them); server tools
    (``web_search_...``, ``bash_...``: a ``type`` other than ``custom``) are left out."""
    if not isinstance(tools, list):
        return chat.function_tools(tools)  # None, or the error for a non-list
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type") not in (None, "custom"):
            continue
        if not isinstance(t.get("name"), str) or not t["name"]:
            raise BadRequest(f"tools[{i}].name is required", param=f"tools[{i}].name")
        if not isinstance(t.get("input_schema"), dict):
            raise BadRequest(f"tools[{i}].input_schema (an object) is required", param=f"tools[{i}].input_schema")
        fn = {"name": t["name"], "description": t.get("description"), "parameters": t["input_schema"],
              "strict": t.get("strict"), "defer_loading": t.get("defer_loading")}
        out.append(chat.vllm_tool(fn, None, f"tools[{i}]"))
    return out or None


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


def too_long(tokens: int, limit: int) -> str:
    """Anthropic's own message for a prompt over the context (Claude Code compacts its history on it)."""
    return f"prompt is too long: {tokens} tokens > {limit} maximum"


ERROR_TYPES = {401: "authentication_error", 402: "billing_error", 403: "permission_error", 404: "not_found_error",
               413: "request_too_large", 429: "rate_limit_error", 504: "timeout_error", 529: "overloaded_error"}


def error(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """Anthropic's error body (its documented types by status; any other 4xx is ``invalid_request_error``, any other
    5xx ``api_error``)."""
    kind = ERROR_TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}
