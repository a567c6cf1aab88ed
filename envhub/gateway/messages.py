"""Every dialect's conversation in one shape: OpenAI chat messages a chat template can render.

Dialect translators (:mod:`envhub.gateway.dialects`) map their wire format to OpenAI-style messages; :func:`prepare`
then makes them renderable and comparable: ``developer`` is ``system``; text parts are joined with ``"\\n"`` as
vLLM's server joins them, and any other part (an image, audio, a file) is refused (:func:`content_text`);
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



class BadRequest(ValueError):
    """The request cannot be served as sent (the client gets a 400 in its provider's error shape)."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.param, self.status, self.code = param, status, code


class ContextLengthExceeded(BadRequest):
    """The prompt does not fit the model's context: each dialect words it as its provider does (OpenAI's
    ``context_length_exceeded``, Anthropic's ``prompt is too long``), the text agents look for to compact."""

    def __init__(self, tokens: int, limit: int):
        super().__init__(f"This model's maximum context length is {limit} tokens. However, your messages resulted "
                         f"in {tokens} tokens. Please reduce the length of the messages.", param="messages",
                         code="context_length_exceeded")
        self.tokens, self.limit = tokens, limit


TEXT_PARTS = ("text", "input_text", "output_text")
BILLING_HEADER = "x-anthropic-billing-header"


def unicode_text(text: str, where: str) -> str:
    """``text`` if it is Unicode a tokenizer can encode; a :class:`BadRequest` naming ``where`` if it holds a lone
    UTF-16 surrogate (JSON's ``"\\ud800"`` without its pair parses into a Python string, then fails in the tokenizer:
    a client's mistake, not the gateway's 500)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadRequest(f"{where} holds a lone UTF-16 surrogate ({text[e.start]!r} at character {e.start}), which is "
                         f"not a Unicode character: send the character itself or both halves of its \\u pair",
                         param=where) from None
    return text


def content_text(content: Any, where: str) -> str:
    """Message content as the text a chat template renders, the way vLLM's server flattens it: a string as is,
    ``None`` as ``""``, text parts joined with ``"\n"``. A part that is not text (an image, audio, a file) is refused:
    the gateway serves text models, and dropping it would answer a question the client never asked."""
    if content is None:
        return ""
    if isinstance(content, str):
        return unicode_text(content, where)
    if not isinstance(content, list):
        raise BadRequest(f"{where} must be a string or a list of content parts, got {type(content).__name__}",
                         param=where)
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(unicode_text(part, f"{where}[{j}]"))
            continue
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind not in TEXT_PARTS and not (isinstance(part, dict) and kind is None and "text" in part):
            raise BadRequest(f"{where}[{j}] is a {kind!r} part: this gateway serves text only (text parts: "
                             f"{', '.join(TEXT_PARTS)}); send the content as text", param=f"{where}[{j}]")
        text = part.get("text")
        if not isinstance(text, str):
            raise BadRequest(f"{where}[{j}].text must be a string", param=f"{where}[{j}].text")
        texts.append(unicode_text(text, f"{where}[{j}].text"))
    return "\n".join(texts)


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
    out: dict[str, Any] = {"role": role, "content": content_text(m.get("content"), f"messages[{i}].content")}
    if role == "system" and out["content"].startswith(BILLING_HEADER):
        # Claude Code's per-request attribution line: vLLM's server drops it from system text (it would defeat the
        # prefix cache), so the gateway renders the system prompt without it too
        out["content"] = out["content"].partition("\n")[2]
    if isinstance(m.get("name"), str) and role != "tool":
        out["name"] = m["name"]  # vLLM keeps a message's name for the template
    if role == "assistant" and m.get("tool_calls"):
        calls = []
        for j, c in enumerate(m["tool_calls"]):
            fn = c.get("function") if isinstance(c, dict) else None
            if not isinstance(fn, dict) or not fn.get("name"):
                raise BadRequest(f"messages[{i}].tool_calls[{j}] needs function.name", param=f"messages[{i}].tool_calls")
            calls.append(tool_call(str(c.get("id") or ""), str(fn["name"]), fn.get("arguments", "{}")))
        unicode_text(json.dumps(calls, ensure_ascii=False), f"messages[{i}].tool_calls")
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

