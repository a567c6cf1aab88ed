"""Shared helpers for the sandbox tools: find the env's sandbox, turn results into text the model reads."""
from __future__ import annotations

from typing import Any

from envhub.env import ToolResult


def sandbox_of(env: Any) -> Any:
    """The env's live sandbox, or None (tools then answer with an error the model can read)."""
    sb = getattr(env, "sandbox", None)
    if sb is None or getattr(sb, "stopped", False):
        return None
    return sb


NO_SANDBOX = ToolResult("Error: this environment has no running sandbox, so this tool cannot run.", error=True)


def render(result: Any, timeout: float | None) -> ToolResult:
    """An ``ExecResult`` as the model sees it: output, then a bracketed status line.

    ``error=True`` marks calls that did not complete normally (timeout, restarted server, could not run); a command
    that ran and exited non-zero is an ordinary result (``grep`` finding nothing is not a tool failure).
    """
    if result.exit_code == 0 and not (result.timed_out or result.restarted or result.error or result.cut):
        out = result.output  # the usual case, without the bookkeeping below (same text)
        return ToolResult(out.rstrip("\n") + "\n[exit code: 0]" if out else "[exit code: 0]")
    parts = [result.output.rstrip("\n")] if result.output else []
    notes = []
    if result.timed_out:
        notes.append(f"timed out after {timeout:g} s: the command was interrupted" if timeout else "timed out")
    if result.restarted and not result.error:
        notes.append("the shell had to be restarted: working directory and variables were reset")
    if result.error:
        notes.append(result.error)
    if result.cut:
        notes.append(f"{result.cut} bytes of output were cut from the middle")
    status = f"[exit code: {result.exit_code}]" if not result.error else "[error]"
    if notes:
        status += " [" + "; ".join(notes) + "]"
    parts.append(status)
    return ToolResult("\n".join(parts), error=bool(result.timed_out or result.error))


def clamp_timeout(value: Any, default: float, maximum: float) -> float:
    """The model may ask for a timeout; keep it positive and below the env's maximum."""
    try:
        t = float(value) if value is not None else default
    except (TypeError, ValueError):
        t = default
    return max(1.0, min(t, maximum))
