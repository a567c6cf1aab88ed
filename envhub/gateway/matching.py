"""Does this request extend an earlier call of the session? Matching that survives how real harnesses echo history.

A harness sends its whole conversation on every call. When the conversation is an earlier call's messages, then
the assistant message the gateway issued for that call, then new messages (tool results, a user turn), the new
call *extends* that one: its prompt is the parent's prompt ids + the ids the model sampled + the rendering of the
new messages only (:mod:`envhub.gateway.core`). Harnesses do not echo byte for byte (docs/gateway.md,
what each harness sends): they re-serialise tool arguments (compact JSON), drop or null an assistant's ``content``, add fields
(``provider_specific_fields``, ``thoughtSignature``), move ``cache_control`` between blocks, add a mid-list
``system`` message, send content as a list of parts. So:

1. the parent is found by what the gateway itself issued: the tool-call ids it minted (exact; the echoed call's
   arguments may then differ -- Claude Code rewrites commands in its history -- as long as the tool names agree),
   else the issued text of a tool-less reply;
2. every earlier message is compared after :func:`key` (role + flattened text; tool calls as name + parsed
   arguments; nothing else), first by plain equality with the parent's own request (the common case, cheap),
   and only on a difference by key;
3. anything else -- a rewritten history (compaction), other tools, an assistant message the gateway never issued
   -- is a new chain with a recorded reason. Never a silent merge.
"""
from __future__ import annotations

import json
import re
from typing import Any

from envhub.gateway.records import CallRecord, Session

# Per-request noise some harnesses put in their system prompt (Claude Code's billing header): not part of the
# conversation, so a change in it does not break a chain (Polar ignores the same pattern).
IGNORED_IN_SYSTEM = (re.compile(r"x-anthropic-billing-header:[^\n]*\n?"),)
_TEXT_PART_TYPES = ("text", "input_text", "output_text")


def text_of(content: Any) -> str:
    """Flatten message content (a string, ``None``, or a list of text parts) to its text."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, str):
                out.append(part)
            elif isinstance(part, dict) and (part.get("type") in _TEXT_PART_TYPES or "text" in part):
                out.append(str(part.get("text") or ""))
        return "".join(out)
    return str(content)


def _args(arguments: Any) -> str:
    """Tool-call arguments as canonical JSON (so compact and pretty serialisations compare equal)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return arguments.strip()
    return json.dumps(arguments, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def calls_of(message: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    out = []
    for c in message.get("tool_calls") or []:
        fn = c.get("function") if isinstance(c.get("function"), dict) else c
        out.append((str(fn.get("name", "")), _args(fn.get("arguments", {}))))
    return tuple(out)


def key(message: dict[str, Any]) -> tuple:
    """What a message means for chain matching, with every known echo quirk normalised away."""
    role = message.get("role", "")
    if role == "assistant":
        calls = calls_of(message)
        return ("assistant", calls) if calls else ("assistant", text_of(message.get("content")).strip())
    text = text_of(message.get("content"))
    if role == "system":
        for pattern in IGNORED_IN_SYSTEM:
            text = pattern.sub("", text)
        return ("system", text.strip())
    if role == "tool":
        return ("tool", text.strip())
    return (role, text)


def _find_parent(session: Session, echoed: dict[str, Any], k: int) -> tuple[CallRecord | None, bool]:
    """The call that issued ``echoed``, and whether it was found by a tool-call id the gateway minted."""
    for c in echoed.get("tool_calls") or []:
        call = session.issued_tool_ids.get(c.get("id", ""))
        if call is not None:
            return call, True
    want = key(echoed)
    for call in reversed(session.calls):  # a tool-less reply (or re-minted ids): the newest call that issued it
        if call.ok and len(call.request) == k and key(call.reply or {}) == want:
            return call, False
    return None, False


def resolve(session: Session, messages: list[dict[str, Any]], tools_key: str) -> tuple[CallRecord | None, str | None]:
    """``(parent, None)`` when ``messages`` extends a finished call of ``session``, else ``(None, reason)``.

    A call whose reply is echoed is marked ``echoed`` even when the request does not extend it (other tools, a
    compaction request over its history): the harness went on from that reply, so it was not an abandoned retry."""
    k = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].get("role") == "assistant"), None)
    if k is None:
        return None, "no assistant turn yet (a new conversation)"
    parent, by_id = _find_parent(session, messages[k], k)
    if parent is None:
        return None, f"the assistant message at index {k} was not sampled through this session"
    parent.echoed = True
    if len(parent.request) != k:
        return None, (f"history rewritten: {k} messages before the echoed reply of {parent.call_id}, "
                      f"which was asked with {len(parent.request)} (compaction, or a retried/edited turn)")
    if parent.tools_key != tools_key:
        return None, f"the tools differ from those of {parent.call_id}"
    earlier = parent.request
    for i in range(k):
        if messages[i] != earlier[i] and key(messages[i]) != key(earlier[i]):
            return None, f"message {i} ({messages[i].get('role')}) differs from what {parent.call_id} was asked with"
    echo, issued = messages[k], parent.reply or {}
    if by_id:  # ids the gateway minted identify the reply; a harness may rewrite the arguments it shows (Claude
        # Code drops a leading `cd <cwd> &&`), but the model was given -- and is trained on -- what it sampled
        same = [n for n, _ in calls_of(echo)] == [n for n, _ in calls_of(issued)]
    else:
        same = key(echo) == key(issued)
    if not same:
        return None, f"the echoed assistant message at index {k} differs from what {parent.call_id} issued"
    if k + 1 >= len(messages):
        return None, "nothing follows the echoed assistant message"
    return parent, None
