"""Every dialect's conversation in one shape: OpenAI chat messages a chat template can render.

Dialect translators (:mod:`envhub.gateway.dialects`) map their wire format to OpenAI-style messages; :func:`prepare`
then makes them renderable and comparable: ``developer`` is ``system``; content parts are flattened to text;
provider extras (``cache_control``, ``provider_specific_fields``, ``thoughtSignature``, reasoning fields) are dropped;
tool calls are ``{id, type, function: {name, arguments}}`` with arguments as a JSON string; and a ``system`` message
in the middle of the list (Claude Code sends one; most chat templates reject it) becomes a user turn holding a
``<system-reminder>`` block. (slime folds it into the next user message; a turn of its own keeps each request's
rendering a prefix of the next request's, which chain matching needs. A template that insists on alternating
roles then refuses the conversation with a clear error.)
"""
from __future__ import annotations

import json
from typing import Any

from envhub.gateway.matching import text_of


class BadRequest(ValueError):
    """The request cannot be served as sent (the client gets a 400 in its provider's error shape)."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _clean(m: Any, i: int) -> dict[str, Any]:
    if not isinstance(m, dict):
        raise BadRequest(f"messages[{i}] must be an object, got {type(m).__name__}", param=f"messages[{i}]")
    role = m.get("role")
    if role == "developer":
        role = "system"
    if role not in ("system", "user", "assistant", "tool"):
        raise BadRequest(f"messages[{i}].role must be system, developer, user, assistant or tool; got {role!r}",
                         param=f"messages[{i}].role")
    out: dict[str, Any] = {"role": role, "content": text_of(m.get("content"))}
    if role == "assistant" and m.get("tool_calls"):
        calls = []
        for j, c in enumerate(m["tool_calls"]):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not fn.get("name"):
                raise BadRequest(f"messages[{i}].tool_calls[{j}] needs function.name", param=f"messages[{i}].tool_calls")
            calls.append(tool_call(str(c.get("id") or ""), str(fn["name"]), fn.get("arguments", "{}")))
        out["tool_calls"] = calls
    if role == "tool":
        out["tool_call_id"] = str(m.get("tool_call_id") or "")
        if m.get("name"):
            out["name"] = str(m["name"])
    return out


def prepare(messages: Any) -> list[dict[str, Any]]:
    """Renderable, comparable messages (see the module docstring); raises :class:`BadRequest` on a malformed list."""
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", param="messages")
    cleaned = [_clean(m, i) for i, m in enumerate(messages)]
    out: list[dict[str, Any]] = []
    for m in cleaned:
        if m["role"] == "system" and out and any(o["role"] != "system" for o in out):
            # a system message after the conversation began: its own user turn, so that the rendering of a request
            # is a prefix of the rendering of the next one (folding it into a neighbour would change that neighbour
            # once the next message arrives)
            out.append({"role": "user", "content": f"<system-reminder>\n{m['content']}\n</system-reminder>"})
        elif m["role"] == "system" and out:
            out[0]["content"] += "\n\n" + m["content"]  # the leading system block: one message
        else:
            out.append(m)
    return out

