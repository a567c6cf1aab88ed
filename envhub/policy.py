"""Policies: scripted players for admission and the golden backend.

A policy is ``policy(task, messages) -> Action | str``: given the task and the conversation so far, the next action.
A fixed script is a policy that ignores the conversation (:func:`script`); a reactive one (binary search in
guess-number) reads the env's last reply. Plugins declare a golden policy, a no-op policy and hack probes this way.
"""
from __future__ import annotations

from typing import Callable, Sequence

from envhub.types import Action, Message, Task, ToolCall

Policy = Callable[[Task, list[Message]], "Action | str"]


def turns_taken(messages: list[Message]) -> int:
    """How many actions the policy has taken so far (assistant messages in the conversation)."""
    return sum(1 for m in messages if m.get("role") == "assistant")


def script(actions: Sequence[Action | str]) -> Policy:
    """A policy that plays ``actions`` in order; after the last one it repeats a finish call."""

    def play(task: Task, messages: list[Message]) -> Action | str:
        i = turns_taken(messages)
        return actions[i] if i < len(actions) else finish()

    return play


def finish(answer: str | None = None, text: str = "") -> Action:
    """An action that calls the ``finish`` tool (with ``answer`` when given). Plain text envs see only ``text``."""
    args = {} if answer is None else {"answer": answer}
    return Action(text=text, tool_calls=[ToolCall("finish", args, id="call_finish")])


def call(name: str, _id: str | None = None, _text: str = "", **arguments) -> Action:
    """An action with one tool call ``name(**arguments)``."""
    return Action(text=_text, tool_calls=[ToolCall(name, arguments, id=_id or f"call_{name}")])


def noop(task: Task, messages: list[Message]) -> Action:
    """The default no-op: finish at once, answering nothing. A sound verifier must fail it."""
    return finish()
