"""OpenAI Chat Completions: ``POST /v1/chat/completions`` (JSON or SSE chunks ending with ``data: [DONE]``)."""
from __future__ import annotations

import time
from typing import Any

from envhub.gateway.core import ChatRequest, ChatResult
from envhub.gateway.dialects import refuse_choices, sampling, sse
from envhub.gateway.messages import BadRequest

NAME = "chat"


def function_tools(tools: Any, *, flat: bool = False) -> list[dict[str, Any]] | None:
    """OpenAI function tools (``flat``: the Responses API's ``{type, name, parameters}``) as the tool dicts vLLM's
    server renders: each field vLLM keeps, in its order (``vllm_tool``). Other tool types (hosted ``web_search``,
    Codex's ``namespace`` and ``custom`` tools) have no meaning for a local model and are left out, as vLLM, Polar
    and AReaL do."""
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise BadRequest("tools must be a list", param="tools")
    out = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "function") != "function":
            continue
        fn = {k: v for k, v in t.items() if k != "type"} if flat else t.get("function")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise BadRequest(f"tools[{i}] needs a function name", param=f"tools[{i}]")
        out.append(vllm_tool(fn, None if flat else t.get("defer_loading"), f"tools[{i}]"))
    return out or None


def vllm_tool(fn: dict[str, Any], defer_loading: Any = None, where: str = "tools") -> dict[str, Any]:
    """One tool as vLLM's ``ChatCompletionToolsParam.model_dump()`` gives it to the chat template (vLLM 0.32:
    ``FunctionDefinition`` keeps ``name``, ``description`` and ``parameters`` -- ``None`` when absent -- then
    ``strict`` and ``defer_loading`` only when set; unknown fields are dropped). A template that ``tojson``s the tool
    renders every kept field, ``"strict": false`` included, so dropping one changes the prompt the policy sees."""
    for name, kinds in (("description", str), ("parameters", dict), ("strict", bool), ("defer_loading", bool)):
        v = fn.get(name)
        if v is not None and not isinstance(v, kinds):
            raise BadRequest(f"{where}.{name} must be a {kinds.__name__}, got {v!r}", param=f"{where}.{name}")
    spec: dict[str, Any] = {"name": fn["name"], "description": fn.get("description"),
                            "parameters": fn.get("parameters")}
    if fn.get("strict") is not None:
        spec["strict"] = fn["strict"]
    if fn.get("defer_loading") is not None or defer_loading is not None:
        spec["defer_loading"] = fn["defer_loading"] if fn.get("defer_loading") is not None else defer_loading
    tool: dict[str, Any] = {"type": "function", "function": spec}
    if defer_loading is not None:
        tool["defer_loading"] = defer_loading
    return tool


def parse(body: dict[str, Any]) -> ChatRequest:
    refuse_choices(body)
    params, given = sampling(body, ("max_completion_tokens", "max_tokens"), "stop")
    tools = None if body.get("tool_choice") == "none" else function_tools(body.get("tools"))
    return ChatRequest(NAME, body.get("messages"), tools, params, given, bool(body.get("stream")),
                       str(body.get("model") or ""))


def _usage(r: ChatResult) -> dict[str, int]:
    return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
            "total_tokens": r.prompt_tokens + r.completion_tokens}


def _logprobs(r: ChatResult, body: dict[str, Any]) -> dict[str, Any] | None:
    if not body.get("logprobs"):
        return None
    return {"content": [{"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
                        for t, lp in zip(r.call.sampled_ids, r.call.logprobs)]}


def reply(r: ChatResult, req: ChatRequest, body: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": r.text or (None if r.tool_calls else "")}
    if r.tool_calls:
        message["tool_calls"] = r.tool_calls
    return {"id": r.call.call_id, "object": "chat.completion", "created": int(r.call.created),
            "model": req.model or "envhub", "system_fingerprint": None,
            "choices": [{"index": 0, "message": message, "finish_reason": r.finish_reason,
                         "logprobs": _logprobs(r, body)}],
            "usage": _usage(r)}


def stream(r: ChatResult, req: ChatRequest, body: dict[str, Any]) -> list[bytes]:
    base = {"id": r.call.call_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": req.model or "envhub", "system_fingerprint": None}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]})

    out = [chunk({"role": "assistant", "content": ""})]
    if r.text:
        out.append(chunk({"content": r.text}))
    for i, c in enumerate(r.tool_calls):
        out.append(chunk({"tool_calls": [{"index": i, **c}]}))
    out.append(chunk({}, r.finish_reason))
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append(sse({**base, "choices": [], "usage": _usage(r)}))
    out.append(b"data: [DONE]\n\n")
    return out


ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               429: "rate_limit_exceeded"}


def error(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error body. Every other 4xx is the client's request (``invalid_request_error``: 405, 409, 410, 413,
    415...); only a 5xx is ``server_error`` (an agent reads that as "retry", a 4xx as "change the request")."""
    kind = ERROR_TYPES.get(status) or ("invalid_request_error" if 400 <= status < 500 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
