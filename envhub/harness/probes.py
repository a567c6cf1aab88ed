"""An env's hack probes as a harness's own shell commands, so ``envhub validate ENV --harness NAME`` plays them through
the real binary, as it plays the golden (:func:`envhub.harness.presets.golden_commands`).

A hack probe is a policy over the env's tools. :func:`probe_commands` plays it once against a conversation whose
tool results are empty and turns every call into one shell command the harness's scripted player then runs with the
harness's own shell tool:

* ``bash{command}`` (envhub's bash tool) -> the command itself;
* ``str_replace_editor{command: "create", path, file_text}`` -> a ``base64 -d`` write of the file;
* ``finish`` (or a reply without tool calls) -> the end of the script (the harness's own ending follows).

Anything else -- another tool, another editor command, a probe that answers in plain text first, a probe that
raises or never finishes -- cannot be played this way, and :func:`probe_commands` says why (a ``str``): the caller
lists that probe as skipped with the reason, never drops it silently. A probe that reads its tools' results would
see only empty ones here: such a probe is played as the script it produces against empty results.
"""
from __future__ import annotations

import base64
import shlex
from typing import Any, Callable

from envhub.env import Action, ToolCall

MAX_STEPS = 64


def as_shell(call: ToolCall) -> str | None:
    """One of the env's tool calls as a shell command, or None when it has no shell equivalent.

    Args:
        call: the tool call: ``bash{command}`` and ``str_replace_editor{command: "create", path, file_text}`` have
            one.

    Returns:
        The command itself (bash), a ``base64 -d`` write of the file (the editor's ``create``), else ``None``.
    """
    args = call.arguments if isinstance(call.arguments, dict) else {}
    if call.name == "bash" and isinstance(args.get("command"), str):
        return args["command"]
    if call.name == "str_replace_editor" and args.get("command") == "create" and isinstance(args.get("path"), str):
        text = str(args.get("file_text") or "")
        path = shlex.quote(args["path"])
        b64 = base64.b64encode(text.encode()).decode()
        return f"mkdir -p \"$(dirname {path})\" && printf %s {b64} | base64 -d > {path}"
    return None


def probe_commands(probe: Callable[[dict, list[dict[str, Any]]], Any], task: dict) -> list[str] | str:
    """``probe``'s tool calls on ``task`` as shell commands, in order; or the reason they cannot be (a ``str``).

    Args:
        probe: a hack probe, a policy ``(task, messages) -> Action | str``, played against empty tool results until
            it calls ``finish`` or replies without a tool call.
        task: the task row (its ``prompt`` is the opening user message).

    Returns:
        The commands (:func:`as_shell`), or why the probe cannot be played through a harness: it raised, answered
        in plain text first, called a tool with no shell equivalent, or did not finish within ``MAX_STEPS`` replies.
    """
    messages: list[dict[str, Any]] = [{"role": "user", "content": str(task.get("prompt") or "")}]
    commands: list[str] = []
    for step in range(MAX_STEPS):
        try:
            action = probe(task, messages)
        except Exception as e:
            return f"the probe raised {type(e).__name__}: {e}"
        if isinstance(action, str):
            action = Action(action)
        if not action.tool_calls:
            if step == 0:
                return "it answers in plain text, without a tool call: nothing to play through a harness"
            return commands
        calls = []
        for i, call in enumerate(action.tool_calls):
            if call.name == "finish":
                return commands
            cmd = as_shell(call)
            if cmd is None:
                what = f"{call.name}{{command: {call.arguments.get('command')!r}}}" \
                    if isinstance(call.arguments, dict) and "command" in call.arguments else call.name
                return f"its {what} call has no shell equivalent (only bash and str_replace_editor create do)"
            commands.append(cmd)
            calls.append({"id": f"call_{step}_{i}", "type": "function",
                          "function": {"name": call.name, "arguments": call.arguments}})
        messages.append({"role": "assistant", "content": action.text, "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": ""} for c in calls]
    return f"it did not finish within {MAX_STEPS} tool calls"


def hack_plays(spec: Any, task: dict) -> dict[str, list[str] | str]:
    """Every hack probe the env declares -> its shell commands on ``task``, or why it cannot be played (a ``str``).

    Args:
        spec: the env spec (its ``hack_probes``: ``{name: probe}``).
        task: the task row.

    Returns:
        ``{probe name: commands or reason}`` (:func:`probe_commands`), by name.
    """
    return {name: probe_commands(probe, task) for name, probe in sorted(spec.hack_probes.items())}
