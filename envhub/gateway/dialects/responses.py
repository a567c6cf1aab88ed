"""OpenAI Responses: ``POST /v1/responses`` (JSON, or the full SSE event sequence Codex CLI and the SDK parse).

Input items map to chat messages: ``message`` items by role, ``function_call`` items onto the assistant message
before them (the gateway issues a reply as a ``message`` item followed by its ``function_call`` items, and Codex
echoes them verbatim), ``function_call_output`` to ``tool`` messages; ``reasoning`` items are dropped (the gateway
never issues them). Every SSE event carries ``type`` and ``sequence_number`` (the openai SDK validates both; Codex
needs ``response.output_item.done`` and ``response.completed``).
"""
from __future__ import annotations

import time
from typing import Any

from envhub.gateway.core import ChatRequest, ChatResult
from envhub.gateway.dialects import chat, refuse_choices, sampling, sse
from envhub.gateway.messages import BadRequest, content_text, tool_call

NAME = "responses"
error = chat.error
_SKIPPED = ("reasoning",)


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    msgs: list[dict[str, Any]] = []
    if body.get("instructions"):
        msgs.append({"role": "system", "content": content_text(body["instructions"], "instructions")})
    inp = body.get("input")
    if isinstance(inp, str):
        return msgs + [{"role": "user", "content": inp}]
    if not isinstance(inp, list):
        raise BadRequest("input must be a string or a list of items", param="input")
    open_assistant = False  # the previous item was (part of) an assistant turn: function calls attach to it
    for i, item in enumerate(inp):
        if not isinstance(item, dict):
            raise BadRequest(f"input[{i}] must be an object", param=f"input[{i}]")
        kind = item.get("type") or "message"
        if kind == "message":
            role = item.get("role")
            msgs.append({"role": role, "content": content_text(item.get("content"), f"input[{i}].content")})
            open_assistant = role == "assistant"
        elif kind == "function_call":
            call = tool_call(str(item.get("call_id") or item.get("id") or ""), str(item.get("name") or ""),
                             item.get("arguments") or "{}")
            if not open_assistant:
                msgs.append({"role": "assistant", "content": ""})
                open_assistant = True
            msgs[-1].setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            msgs.append({"role": "tool", "tool_call_id": str(item.get("call_id") or ""),
                         "content": content_text(item.get("output"), f"input[{i}].output")})
            open_assistant = False
        elif kind in _SKIPPED:
            continue
        else:
            raise BadRequest(f"input[{i}] has type {kind!r}, which this gateway does not serve (message, "
                             "function_call, function_call_output, reasoning)", param=f"input[{i}].type")
    return msgs


def parse(body: dict[str, Any]) -> ChatRequest:
    refuse_choices(body)
    if body.get("previous_response_id"):
        raise BadRequest("previous_response_id is not supported (the gateway stores nothing server-side for a "
                         "client to refer to): send the whole input with store=false", param="previous_response_id")
    params, given = sampling(body, ("max_output_tokens",), "stop")
    tools = None if body.get("tool_choice") == "none" else chat.function_tools(body.get("tools"), flat=True)
    return ChatRequest(NAME, _messages(body), tools, params, given, bool(body.get("stream")),
                       str(body.get("model") or ""))


def _items(r: ChatResult, *, done: bool = True) -> list[dict[str, Any]]:
    status = "completed" if done else "in_progress"
    items: list[dict[str, Any]] = []
    if r.text or not r.tool_calls:
        items.append({"type": "message", "id": "msg_" + r.call.call_id[5:], "status": status, "role": "assistant",
                      "content": [{"type": "output_text", "text": r.text, "annotations": [], "logprobs": []}]})
    for c in r.tool_calls:
        items.append({"type": "function_call", "id": "fc_" + c["id"][5:], "call_id": c["id"],
                      "name": c["function"]["name"], "arguments": c["function"]["arguments"], "status": status})
    return items


def _response(r: ChatResult, req: ChatRequest, body: dict[str, Any], *, final: bool = True) -> dict[str, Any]:
    incomplete = r.finish_reason == "length"
    return {
        "id": r.call.call_id, "object": "response", "created_at": int(r.call.created),
        "status": ("incomplete" if incomplete else "completed") if final else "in_progress",
        "completed_at": int(time.time()) if final else None,
        "model": req.model or "envhub", "output": _items(r) if final else [],
        "error": None, "incomplete_details": {"reason": "max_output_tokens"} if final and incomplete else None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "tool_choice": body.get("tool_choice") or "auto", "tools": body.get("tools") or [],
        "temperature": req.params.temperature, "top_p": req.params.top_p,
        "max_output_tokens": body.get("max_output_tokens"), "previous_response_id": None,
        "reasoning": None, "store": False, "text": {"format": {"type": "text"}}, "truncation": "disabled",
        "usage": {"input_tokens": r.prompt_tokens, "output_tokens": r.completion_tokens,
                  "total_tokens": r.prompt_tokens + r.completion_tokens,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}} if final else None,
    }


def reply(r: ChatResult, req: ChatRequest, body: dict[str, Any]) -> dict[str, Any]:
    return _response(r, req, body)


def stream(r: ChatResult, req: ChatRequest, body: dict[str, Any]) -> list[bytes]:
    events: list[bytes] = []

    def emit(kind: str, **data: Any) -> None:
        events.append(sse({"type": kind, "sequence_number": len(events), **data}, kind))

    emit("response.created", response=_response(r, req, body, final=False))
    emit("response.in_progress", response=_response(r, req, body, final=False))
    for n, item in enumerate(_items(r)):
        emit("response.output_item.added", output_index=n, item={**item, "status": "in_progress", **(
            {"content": []} if item["type"] == "message" else {"arguments": ""})})
        if item["type"] == "message":
            part = item["content"][0]
            ids = {"item_id": item["id"], "output_index": n, "content_index": 0}
            emit("response.content_part.added", **ids, part={**part, "text": ""})
            if part["text"]:
                emit("response.output_text.delta", **ids, delta=part["text"], logprobs=[])
            emit("response.output_text.done", **ids, text=part["text"], logprobs=[])
            emit("response.content_part.done", **ids, part=part)
        else:
            ids = {"item_id": item["id"], "output_index": n}
            emit("response.function_call_arguments.delta", **ids, delta=item["arguments"])
            emit("response.function_call_arguments.done", **ids, name=item["name"], arguments=item["arguments"])
        emit("response.output_item.done", output_index=n, item=item)
    final = _response(r, req, body)
    emit("response.incomplete" if final["status"] == "incomplete" else "response.completed", response=final)
    return events
