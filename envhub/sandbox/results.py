"""What sandbox calls return and raise: :class:`ExecResult` and the sandbox errors.

A leaf module (no envhub imports): the sandbox's ``base``, its runtimes and the attached shell all use these, and
none of them needs another to define them. ``envhub.sandbox.base`` and ``envhub.sandbox`` re-export them.
"""
from __future__ import annotations

from dataclasses import dataclass


class SandboxError(RuntimeError):
    """A sandbox could not be started, reached, or stopped cleanly. The message says why and what to do."""


class RuntimeUnavailable(SandboxError):
    """The runtime's binary (bwrap, apptainer/singularity) is not installed or cannot work on this host."""


@dataclass(slots=True)  # no per-instance dict: one is made for every call
class ExecResult:
    """What one command produced.

    ``exit_code`` follows the shell: 0 ok, 124 timeout (``timed_out``), 128+N killed by signal N (``signal``), 127
    not found. ``stdout``/``stderr`` keep the head and tail of each stream (``cut`` counts the bytes dropped). For the
    pty shell and IPython, everything is in ``stdout``. ``restarted`` says the shell (or the whole action server)
    had to be replaced, so shell state (cwd, variables) or Python state was lost. ``error`` is set when the command
    could not run at all.
    """

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False
    cut: int = 0
    duration_s: float = 0.0
    signal: int | None = None
    restarted: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and self.error is None

    @property
    def output(self) -> str:
        """stdout and stderr together (stderr after stdout)."""
        if self.stdout and self.stderr and not self.stdout.endswith("\n"):
            return self.stdout + "\n" + self.stderr
        return self.stdout + self.stderr


class ServerError(SandboxError):
    """The action server refused or failed one request (it keeps serving); the message says why."""


class ServerRestarted(SandboxError):
    """The action server died mid-request and was relaunched; shell and Python state were lost."""


class ServerHung(ServerRestarted):
    """The action server missed the host's deadline for a request; the sandbox was killed and relaunched."""
