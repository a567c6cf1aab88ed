"""The plain data an environment exchanges: tasks, chat messages, actions and tool calls, tool specs, responses.

A leaf module (it imports nothing of envhub), so that every layer -- spaces, verifiers, policies, the codec, the
sandbox -- can use these types without importing the env contract that uses them. :mod:`envhub.env` re-exports
them: ``from envhub.env import Action`` and ``from envhub import Action`` are the same class.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, TypedDict


Task = dict[str, Any]
"""One task row (a ``datasets`` row as a dict). It always has a string ``task_id``."""


class Message(TypedDict, total=False):
    """An OpenAI chat message."""

    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: list[dict[str, Any]]
    tool_call_id: str
    name: str


@dataclass
class ToolCall:
    """One parsed function call: ``name(**arguments)``. ``id`` links the tool's reply to the call."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


@dataclass
class Action:
    """What the model did in one turn: its decoded text and the tool calls parsed out of it.

    ``parse_error`` is set when the text looked like a tool call but could not be parsed; the env answers it with
    a message the model can act on instead of raising.
    """

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_error: str | None = None

    @classmethod
    def coerce(cls, action: Action | str | bytes | None) -> Action:
        """Accept what a person or a fuzzer may pass: an ``Action``, a ``str``, bytes, or ``None``."""
        if isinstance(action, Action):
            return action
        if action is None:
            return cls("")
        if isinstance(action, bytes):
            return cls(action.decode("utf-8", errors="replace"))
        if isinstance(action, str):
            return cls(action)
        return cls(str(action), parse_error=f"expected an Action or a str, got {type(action).__name__}")

    def to_message(self) -> Message:
        msg: Message = {"role": "assistant", "content": self.text}
        if self.tool_calls:
            msg["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        return msg


@dataclass(frozen=True)
class ToolSpec:
    """A tool offered to the model: a name, a description and a JSON schema for its arguments."""

    name: str
    description: str
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass
class Response:
    """What an env answers to one action (returned by :meth:`TextEnv.respond`).

    ``messages``: the env's reply (a ``str`` is one user message). ``done``: the episode ended (the model finished, or
    failed for good). ``reward``: a shaping reward for this step only; the final grade comes from the verifier.
    ``artifacts``: what the verifier grades, required when ``done``.
    """

    messages: str | list[Message] = field(default_factory=list)
    done: bool = False
    reward: float = 0.0
    artifacts: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)


def as_messages(obs: str | list[Message] | None, role: str = "user") -> list[Message]:
    """A plain ``str`` observation means one message of ``role``; ``None`` means no message."""
    if obs is None:
        return []
    if isinstance(obs, str):
        return [{"role": role, "content": obs}]
    return list(obs)
