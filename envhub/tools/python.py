"""The ``python`` tool: a persistent IPython shell in the sandbox (variables and imports carry over)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from envhub.env import ToolResult, ToolSpec
from envhub.tools._common import NO_SANDBOX, clamp_timeout, sandbox_of

DESCRIPTION = (
    "Run Python code in a persistent IPython session inside the sandbox. Variables, imports and functions persist "
    "between calls. The value of the last expression is shown, as are printed output and tracebacks. Use `timeout` "
    "(seconds) for slow code."
)


@dataclass
class PythonTool:
    """Runs ``code`` with ``env.sandbox.python`` (IPython, in the sandbox's action server)."""

    timeout: float = 60.0
    max_timeout: float = 600.0
    spec: ToolSpec = field(default_factory=lambda: ToolSpec("python", DESCRIPTION, {
        "type": "object",
        "properties": {
            "code": {"type": "string", "description": "Python code to run (IPython syntax, several lines allowed)."},
            "timeout": {"type": "integer", "description": "Seconds before the code is interrupted."},
        },
        "required": ["code"],
    }))

    def run(self, env: Any, arguments: dict[str, Any]) -> ToolResult:
        sb = sandbox_of(env)
        if sb is None:
            return NO_SANDBOX
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult("Error: `code` must be a non-empty string.", error=True)
        timeout = clamp_timeout(arguments.get("timeout"), self.timeout, self.max_timeout)
        r = sb.python(code, timeout=timeout)
        text = r.stdout.rstrip("\n")
        if r.timed_out and r.restarted:  # it ignored the interrupt: the host restarted the sandbox
            text = r.stdout
        elif r.timed_out:
            text += f"\n[timed out after {timeout:g} s: the code was interrupted; the session's state is kept]"
        elif r.error:
            text = r.stdout
        if r.cut:
            text += f"\n[{r.cut} bytes of output were cut from the middle]"
        return ToolResult(text or "[no output]", error=r.exit_code != 0)


def python_tool(timeout: float = 60.0, max_timeout: float = 600.0) -> PythonTool:
    """The ``python`` tool acting on ``env.sandbox``."""
    return PythonTool(timeout=timeout, max_timeout=max_timeout)
