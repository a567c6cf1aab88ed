"""The host's own line to a sandbox's persistent bash: a copy of the shell's pty master, handed over by the action
server, on which the host types short commands itself.

Why: a request through the action server costs two extra process wake-ups (host → server, server → host), about
as much as the shell's own work for a builtin, so every command paid twice what a local pty costs
(``benchmarks/tools_latency.py`` measures the round trip against a bare pty). With the master in hand, the host
does exactly what the server would do (type ``[eval '] <command> ['] <&99; <sentinel>``, read until the sentinel:
:func:`.agent.bash.roundtrip`), and the server is not woken at all.

The action server still owns the shell: it starts it (and starts a new one when it died), interrupts a command that
timed out (it can signal the shell's foreground process group inside the sandbox's pid namespace), and runs long or
multi-line commands, which travel through its command file. Requests to one sandbox are serialized by its lock, so
the host and the server never read the pty at the same time.
"""
from __future__ import annotations

import os
from time import monotonic
from typing import TYPE_CHECKING

from envhub.sandbox import results as base  # the leaf module of results and errors (no cycle with .base)
from envhub.sandbox.agent.bash import SHELL_EXITED, poller, roundtrip, strip_sentinels
from envhub.sandbox.agent.limits import OutputCap, clip

if TYPE_CHECKING:
    from envhub.sandbox.base import Sandbox
    from envhub.sandbox.results import ExecResult


class AttachedShell:
    """A sandbox's shell pty, attached on first use. ``run`` returns an ``ExecResult``, or None when this sandbox's
    server cannot hand out its pty (the caller then goes through the server)."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.waiter = None  # a poll object for fd
        self.exited = False  # we reported the shell's exit: the server's replacing it is no news

    def run(self, sandbox: Sandbox, line: str, timeout: float, output_limit: int) -> ExecResult | None:
        """Run one typed ``line`` (from :func:`.agent.bash.inline_line`). The caller holds ``sandbox._lock``."""
        t0 = monotonic()
        cap = OutputCap(output_limit)
        if self.fd is not None:  # attached already: the usual case, kept short (every step shows in the latency)
            try:
                code, _, state = roundtrip(self.fd, line, timeout, cap, waiter=self.waiter)
            except OSError:  # the pty is gone before our command was typed (the shell was replaced): attach again
                self.close()
                if sandbox.stopped:
                    raise base.SandboxError(f"sandbox {sandbox.id} was stopped during shell") from None
                return self._attach_and_run(sandbox, line, timeout, cap, t0)
            if state == "done" and not sandbox.stopped:
                return base.ExecResult(code, cap.text(), "", False, cap.cut, monotonic() - t0, None, False)
            return self._finish(sandbox, code, state, cap, t0, False)
        return self._attach_and_run(sandbox, line, timeout, cap, t0)

    def _attach_and_run(self, sandbox: Sandbox, line: str, timeout: float, cap: OutputCap, t0: float):
        """Get the shell's pty from the server (which starts a shell if none runs), then run ``line`` on it."""
        ExecResult, ServerError, ServerRestarted = base.ExecResult, base.ServerError, base.ServerRestarted
        restarted = False
        for attempt in (0, 1):
            try:
                # the command's timeout bounds the host's wait for the pty too (plus the host's grace)
                reply = sandbox.request("shell_attach", timeout=timeout, exited=self.exited)
                self.fd = reply["fd"]
                self.waiter = poller(self.fd)
                restarted = restarted or (bool(reply.get("restarted")) and not self.exited)
                self.exited = False
                code, _, state = roundtrip(self.fd, line, timeout, cap, waiter=self.waiter)
                break
            except ServerRestarted as e:  # ServerHung (the server missed the host's deadline) is a timeout
                hung = isinstance(e, base.ServerHung)
                return ExecResult(124 if hung else -1, f"Error: {e}", "", timed_out=hung, restarted=True,
                                  error=str(e))
            except ServerError:
                return None
            except OSError:  # replaced again between attaching and typing: once more, then give up
                self.close()
                if sandbox.stopped:
                    raise base.SandboxError(f"sandbox {sandbox.id} was stopped during shell") from None
                if attempt:
                    raise
        return self._finish(sandbox, code, state, cap, t0, restarted)

    def _finish(self, sandbox: Sandbox, code: int | None, state: str, cap: OutputCap, t0: float, restarted: bool):
        """A round trip's outcome as an ``ExecResult``; a timed-out command is interrupted by the server."""
        ExecResult, ServerError, ServerRestarted = base.ExecResult, base.ServerError, base.ServerRestarted
        if sandbox.stopped:  # the stop's SIGTERM can end the command while the shell (interactive: it ignores
            self.close()     # SIGTERM) still prints its status: that is a stop, as the server path reports it
            raise base.SandboxError(f"sandbox {sandbox.id} was stopped during shell")
        if state == "done":
            return ExecResult(code, cap.text(), "", False, cap.cut, monotonic() - t0, restarted=restarted)
        if state == "eof":  # the command ended the shell (`exit`, `exec`): the server starts a new one on next attach
            self.close()
            if sandbox.stopped:  # ...or the sandbox was stopped under it, as the server path reports it
                raise base.SandboxError(f"sandbox {sandbox.id} was stopped during shell")
            self.exited = True
            return ExecResult(-1, cap.text() + SHELL_EXITED, "", False, cap.cut, monotonic() - t0, restarted=True)
        try:  # timeout: the server interrupts it (and replaces the shell if it does not come back)
            r = sandbox.request("shell_interrupt", output_limit=cap.limit)
        except (ServerRestarted, ServerError) as e:
            self.close()
            return ExecResult(124, strip_sentinels(cap.text()) + f"\nError: {e}", "", True, cap.cut,
                              monotonic() - t0, restarted=True, error=str(e))
        out, cut = clip(strip_sentinels(cap.text() + r["output"]), 2 * cap.limit + 1024)  # never trust the server's cap
        return ExecResult(124, out, "", True, cap.cut + r["cut"] + cut, monotonic() - t0,
                          restarted=restarted or bool(r["restarted"]))

    def close(self) -> None:
        """Let go of the pty (the shell itself is the server's to stop)."""
        fd, self.fd, self.waiter = self.fd, None, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
