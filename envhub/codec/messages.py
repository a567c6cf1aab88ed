"""Messages as chat templates expect them (the input side of ``envhub.codec.chat.ChatCodec``)."""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from envhub.env import Message, ToolSpec


@lru_cache(maxsize=4096)
def _json_args(text: str) -> Any:
    # Cached: the same history is rendered every turn. The parsed value is shared between renderings, which is
    # safe because templates run in jinja's immutable sandbox (no method can modify a dict or list).
    try:
        value = json.loads(text) if text.strip() else {}
    except json.JSONDecodeError:
        return text  # left as the model wrote it
    try:  # a lone surrogate escape ("\ud800", which a model can write) parses into a string no tokenizer encodes
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return text  # left as the model wrote it, as invalid JSON is: the render must not fail on it
    return value


def normalize_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: tool-call ``arguments`` as dicts, ``None`` content as ``""``.

    OpenAI messages carry arguments as a JSON string; Qwen and Llama templates apply ``tojson`` to them and would
    quote the string a second time (vLLM parses them back the same way before rendering). The input is not
    modified; parsed arguments may be shared with other calls, so treat the result as read-only.
    """
    out = []
    for m in messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"]:
                c = dict(c)
                fn = c["function"] = dict(c["function"]) if isinstance(c.get("function"), dict) else c
                if isinstance(fn.get("arguments"), str):
                    fn["arguments"] = _json_args(fn["arguments"])
                calls.append(c)
            m["tool_calls"] = calls
        out.append(m)
    return out


def tool_dicts(tools: Any) -> list[dict[str, Any]] | None:
    """Tools as OpenAI function dicts (``ToolSpec`` or dicts accepted), ``None`` for no tools."""
    if not tools:
        return None
    return [t.to_openai() if isinstance(t, ToolSpec) else dict(t) for t in tools]


def with_system_note(messages: list[Message], note: str) -> list[Message]:
    """``messages`` with ``note`` appended to the system message (one is added first when there is none)."""
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{note}")
        return [first, *messages[1:]]
    return [{"role": "system", "content": note}, *messages]
