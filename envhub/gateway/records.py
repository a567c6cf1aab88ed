"""What the gateway keeps per session: one :class:`CallRecord` per model call, in a :class:`Session`.

A call record holds the exact token record of that call (the prompt ids the backend was given, the ids it sampled,
their logprobs), the messages the prompt renders (the *context*: what a trainer sees, with the model's own earlier
replies as the gateway issued them, not as the harness echoed them), and how the call relates to earlier ones:
``parent`` is the call it extends (its prompt starts with the parent's prompt + sampled ids), or ``None`` with a
``break_reason`` saying why it opened a new chain.
"""
from __future__ import annotations

import asyncio
import secrets
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class CallRecord:
    call_id: str                      # the id the client saw (chatcmpl-..., resp_..., msg_...): AReaL's interaction id
    dialect: str                      # "chat" | "responses" | "anthropic"
    prompt_ids: list[int]
    request: list[dict[str, Any]]     # the messages the client sent (after dialect translation): echo matching
    context: list[dict[str, Any]]     # the messages the prompt renders (trainer-visible context)
    tools_key: str                    # the tools as rendered, JSON in their key order (other tools: no extension)
    parent: str | None = None         # call_id of the call this one extends
    break_reason: str | None = None   # why this call starts a new chain (None when it extends one)
    sampled_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: str = ""           # "stop" | "length" | "tool_calls" (after parsing) | "error"
    reply: dict[str, Any] | None = None   # the assistant message issued (tool-call ids minted by the gateway)
    policy_version: int = 0           # the oldest version among its tokens (the one current when it was made)
    versions: list[int] = field(default_factory=list)   # the version that sampled each of sampled_ids
    has_tools: bool = False
    reward: float | None = None
    error: str | None = None
    echoed: bool = False              # a later request echoed this call's reply (the harness went on from it)
    drift: bool | None = None         # canonical re-render differed from the spliced prompt (sampled calls only)
    # the parent's prompt_ids and sampled_ids lists themselves (not copies) when the splice built prompt_ids as
    # their concatenation + the new messages' ids: the export reads it instead of comparing the 16k-token prefix
    spliced_from: tuple[list[int], list[int]] | None = field(default=None, repr=False, compare=False)
    created: float = field(default_factory=time.time)

    @property
    def done(self) -> bool:
        return self.reply is not None or self.error is not None

    @property
    def ok(self) -> bool:
        return self.reply is not None and self.error is None


@dataclass
class Session:
    """One agent episode seen through the gateway (AReaL: one ``start_session`` .. ``end_session``)."""

    session_id: str
    api_key: str
    task_id: str = ""
    task: Any = None                  # handed to a scripted backend's policy
    calls: list[CallRecord] = field(default_factory=list)
    by_id: dict[str, CallRecord] = field(default_factory=dict)
    issued_tool_ids: dict[str, CallRecord] = field(default_factory=dict)   # minted tool-call id -> its call
    flags: list[str] = field(default_factory=list)   # "upstream_failure", "mixed_policy_versions", ...
    max_calls: int | None = None      # the call budget (past it: a 403 that ends the episode)
    ended: bool = False
    ended_event: asyncio.Event | None = None
    last_access: float = field(default_factory=time.monotonic)
    backend: Any = None               # this session's own backend (default: the gateway's), e.g. a scripted player
    backend_codec: Any = None         # the codec a scripted backend was opened with
    live: list[dict[str, Any]] = field(default_factory=list)  # the conversation a scripted policy reads
    lock: asyncio.Lock | None = None
    # the last request as sent and as prepared: a harness re-sends its whole history, so the next request is mostly
    # this one again (envhub.gateway.calls prepares only what is new)
    last_sent: tuple[list[Any], list[dict[str, Any]]] | None = None

    def add(self, call: CallRecord) -> None:
        self.calls.append(call)
        self.by_id[call.call_id] = call

    def flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)

    def touch(self) -> None:
        self.last_access = time.monotonic()


def new_key() -> str:
    return secrets.token_urlsafe(32)


def new_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"
