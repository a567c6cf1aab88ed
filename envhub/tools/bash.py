"""The ``bash`` tool: a persistent shell in the sandbox (``cd`` and ``export`` carry over between calls)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envhub.env import ToolResult, ToolSpec
from envhub.tools._common import NO_SANDBOX, clamp_timeout, render, sandbox_of

DESCRIPTION = (
    "Run a bash command in a persistent shell inside the sandbox. The working directory, environment variables and "
    "shell functions persist between calls. Commands do not read from the terminal (stdin is /dev/null); long "
    "output is cut in the middle. Use `timeout` (seconds) for slow commands. Returns the output and the exit code."
)


@dataclass
class BashTool:
    """Runs ``command`` with ``env.sandbox.shell``. ``timeout``: default seconds; ``max_timeout``: the cap a model's
    requested timeout is clamped to."""

    timeout: float = 60.0
    max_timeout: float = 600.0
    spec: ToolSpec = field(default_factory=lambda: ToolSpec("bash", DESCRIPTION, {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "The bash command to run (may span several lines)."},
            "timeout": {"type": "integer", "description": "Seconds before the command is interrupted."},
        },
        "required": ["command"],
    }))

    def __post_init__(self) -> None:
        # once here, not on every call; a junk value falls back to the field's default
        self.timeout = clamp_timeout(self.timeout, type(self).timeout, self.max_timeout)

    def run(self, env: Any, arguments: dict[str, Any]) -> ToolResult:
        sb = sandbox_of(env)
        if sb is None:
            return NO_SANDBOX
        command = arguments.get("command")
        if not isinstance(command, str) or not command or command.isspace():
            return ToolResult("Error: `command` must be a non-empty string.", error=True)
        timeout = arguments.get("timeout")
        timeout = self.timeout if timeout is None else clamp_timeout(timeout, self.timeout, self.max_timeout)
        return render(sb.shell(command, timeout=timeout), timeout)


def bash_tool(timeout: float = 60.0, max_timeout: float = 600.0) -> BashTool:
    """The ``bash`` tool acting on ``env.sandbox``."""
    return BashTool(timeout=timeout, max_timeout=max_timeout)
