"""The sandbox contract: :class:`SandboxSpec` (what to start), :class:`Runtime` (how), :class:`Sandbox` (a live one).

A runtime turns a spec into a running sandbox with an action server inside (see ``envhub/sandbox/agent``). Every
runtime shares this client: ``exec`` (argv or shell string, stdin, per-command limits), ``shell`` (persistent pty
bash), ``edit`` (``str_replace_editor``), ``python`` (persistent IPython), ``read_file`` / ``write_file`` and
``stop()``. Calls from several threads are serialized: one request at a time per sandbox, many sandboxes at once.

    from envhub.sandbox import SandboxSpec, start
    with start(SandboxSpec(workspace_from="repo/", memory_mb=1024)) as sb:
        sb.shell("cd src && export X=1")
        print(sb.shell("pwd; echo $X").stdout)          # /testbed/src\\n1
        r = sb.exec(["python3", "-c", "print(input())"], input="hi", timeout=5, memory_mb=256)
"""
from __future__ import annotations

import base64
import os
import socket
import struct
import threading
import time
from typing import Any, Sequence

from envhub.sandbox import hostfs
from envhub.sandbox.agent import protocol
from envhub.sandbox.agent.limits import clip
from envhub.sandbox.agent.bash import inline_line
from envhub.sandbox.attached import AttachedShell
from envhub.sandbox.results import (ExecResult, RuntimeUnavailable, SandboxError, ServerError,  # noqa: F401 (contract)
                                    ServerHung, ServerRestarted)
from envhub.sandbox.spec import SandboxSpec  # noqa: F401 (part of this module's contract)


class Runtime:
    """How sandboxes are made. Subclasses set ``name`` and implement ``available``, ``start``, ``capabilities``."""

    name = "?"

    @classmethod
    def available(cls) -> bool:
        """Whether this runtime can start sandboxes on this host."""
        return False

    def start(self, spec: SandboxSpec) -> Sandbox:
        raise NotImplementedError

    def capabilities(self, spec: SandboxSpec | None = None) -> dict[str, Any]:
        """What isolation and which limits hold: ``{"runtime", "isolation", "network", "limits", "notes"}``."""
        raise NotImplementedError


class Sandbox:
    """A live sandbox. Use it as a context manager, or call :meth:`stop` (idempotent) when done.

    Attributes: ``id``, ``spec``, ``workdir`` (the workspace path as commands see it), ``state_dir`` (host directory
    holding the socket, logs and, unless tmpfs, the workspace), ``runtime`` (the runtime's name).
    """

    runtime = "?"
    #: Short one-line shell commands are typed by the host on its own copy of the shell's pty instead of going
    #: through the action server (:mod:`envhub.sandbox.attached`): the same result, two process wake-ups fewer.
    attach_shell = True
    #: Seconds the host waits past a request's own timeout before it declares the action server hung and restarts
    #: the sandbox. The server answers a timed-out command itself within about 4 s at worst (Ctrl-C, 0.2 s drain, a
    #: 3 s check that the shell answers, a fresh shell); this margin covers that on a loaded host.
    deadline_grace_s = 10.0

    def __init__(self, spec: SandboxSpec, sandbox_id: str, state_dir: str, socket_path: str, workdir: str):
        self.spec, self.id, self.state_dir = spec, sandbox_id, state_dir
        self.socket_path, self.workdir = socket_path, workdir
        self._sock: socket.socket | None = None
        self._attached = AttachedShell()
        self._lock = threading.RLock()  # one request at a time
        self._armed: float | None = None  # the receive timeout set on the current connection
        self._stop_lock = threading.Lock()
        self.stopped = False
        self.restarts = 0
        self.started_at = time.monotonic()

    # ---- what runtimes implement ----------------------------------------------------------------------------------
    def boot(self, prepare: Any = None) -> None:
        """Register, ``prepare()`` (copy the workspace...), launch. Registered first, so that interpreter exit or a
        signal stops even a half-started sandbox; on any failure everything is undone and the error re-raised."""
        from envhub.sandbox import lifecycle

        lifecycle.register(self)
        try:
            if prepare is not None:
                prepare()
            self._launch()
            if self.stopped:  # stopped (interpreter exit, a signal) while starting
                raise SandboxError(f"sandbox {self.id} was stopped while it was starting")
        except BaseException:
            self.stopped = True
            try:
                self._terminate(0.0)
            finally:
                self._cleanup()
                lifecycle.unregister(self)
            raise

    def _launch(self) -> None:
        """Start the sandbox processes and wait until the action server is ready."""
        raise NotImplementedError

    def _terminate(self, grace_s: float) -> list[int]:
        """Kill every process of the sandbox (TERM, grace, KILL). Returns pids still alive after all that."""
        raise NotImplementedError

    def _cleanup(self) -> None:
        """Remove what the sandbox left on the host (workspace, state dir, cgroups)."""

    def capabilities(self) -> dict[str, Any]:
        raise NotImplementedError

    # ---- the client -----------------------------------------------------------------------------------------------
    def request(self, op: str, timeout: float | None = None, **args: Any) -> dict:
        """One round trip to the action server. Thread-safe: requests to one sandbox are serialized.

        The wait is bounded on the host (the server runs agent code, so its own watchdog cannot be trusted): the
        reply must be complete within the request's timeout plus :attr:`deadline_grace_s`, and no larger than a frame
        derived from its output limit. If the server died (killed by the OOM killer, by the agent) or missed the
        deadline (hung, hijacked), every process of the sandbox is killed and it is relaunched with its workspace
        kept: :class:`ServerRestarted` (or :class:`ServerHung`) is raised and the caller turns it into a marked
        result.
        """
        if self.stopped:
            raise SandboxError(f"sandbox {self.id} is stopped")
        args["op"] = op
        if timeout is not None:
            args["timeout"] = timeout
        budget = (timeout if timeout is not None else self.spec.timeout_s) + self.deadline_grace_s
        with self._lock:
            deadline = time.monotonic() + budget
            try:
                sock = self._connect()
                if self._armed != budget:  # kernel-side timeouts (SO_RCVTIMEO): no poll() per recv on the hot path
                    _arm(sock, budget)
                    self._armed = budget
                protocol.send(sock, args)
                if op == "shell_attach":
                    reply, fd = protocol.recv_with_fd(sock, 1 << 16, deadline)
                    if fd is not None:
                        reply["fd"] = fd
                else:
                    reply = protocol.recv(sock, self._max_frame(op, args), deadline)
                    if op in _SHELL_REPLACING_OPS and (op == "killall" or reply.get("restarted")):
                        self._attached.close()  # the shell behind our pty copy was replaced
            except (OSError, protocol.ProtocolError) as e:
                self._drop_connection()
                if self.stopped:
                    raise SandboxError(f"sandbox {self.id} was stopped during {op}") from None
                hung = isinstance(e, BlockingIOError) or time.monotonic() >= deadline
                self._relaunch()
                if hung:
                    raise ServerHung(f"the sandbox's action server did not answer {op} within {budget:g} s (the "
                                     f"command's timeout plus {self.deadline_grace_s:g} s): every process of the "
                                     f"sandbox was killed and it was restarted with the workspace kept; shell and "
                                     f"Python state were lost") from None
                raise ServerRestarted(f"the sandbox's action server died during {op} ({type(e).__name__}: "
                                      f"{_short(e)}); it was restarted with the workspace kept, but shell and Python "
                                      f"state were lost") from None
        if not reply.get("ok"):
            if "fd" in reply:
                os.close(reply["fd"])
            raise ServerError(_short(reply.get("error", "action server error"), 2000))
        if op == "shell_attach" and "fd" not in reply:
            raise ServerError("the action server did not hand over the shell's pty")
        return reply

    def _max_frame(self, op: str, args: dict) -> int:
        """The largest reply accepted for one request: a reply is a few output streams of at most ``output_limit``
        bytes each, which JSON may escape to 6 bytes per byte (``\\u0001``); a read is base64 of ``max_bytes``."""
        if op == "read":
            return int(args.get("max_bytes") or READ_MAX_BYTES) * 4 // 3 + 65536
        return 12 * int(args.get("output_limit") or self.spec.output_limit) + (1 << 20)

    def _connect(self) -> socket.socket:
        if self._sock is None:
            self._sock = hostfs.connect_unix(self.socket_path)
        return self._sock

    def _drop_connection(self) -> None:
        self._attached.close()
        self._armed = None
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _relaunch(self) -> None:
        self.restarts += 1
        self._terminate(0.0)
        self._launch()

    # ---- the API --------------------------------------------------------------------------------------------------
    def exec(self, cmd: str | Sequence[str], *, timeout: float | None = None, input: str | bytes | None = None,
             cwd: str | None = None, env: dict[str, str] | None = None, memory_mb: float | None = None,
             cpu_s: float | None = None, max_file_mb: float | None = None, max_procs: int | None = None,
             output_limit: int | None = None) -> ExecResult:
        """Run one command in a fresh process: an argv list, or a string run by ``bash -c``.

        ``input`` is fed to stdin (else stdin is /dev/null). The limits apply to this command only, on top of the
        sandbox's (``memory_mb`` → RLIMIT_AS, ``cpu_s`` → RLIMIT_CPU, ``max_file_mb`` → RLIMIT_FSIZE).
        """
        args: dict[str, Any] = {"cmd": cmd if isinstance(cmd, str) else [str(c) for c in cmd], "cwd": cwd, "env": env,
                                "memory_mb": memory_mb, "cpu_s": cpu_s or self.spec.cpu_s, "max_file_mb": max_file_mb,
                                "max_procs": max_procs, "output_limit": output_limit}
        if input is not None:
            data = input.encode() if isinstance(input, str) else bytes(input)
            args["input"] = base64.b64encode(data).decode("ascii")
        r = self._call("exec", timeout, args)
        if isinstance(r, ExecResult):
            return r
        limit = (output_limit or self.spec.output_limit) + _MARKER_ROOM
        out, cut_out = clip(r["stdout"], limit)
        err, cut_err = clip(r["stderr"], limit)
        return ExecResult(r["exit_code"], out, err, r["timed_out"], r["cut"] + cut_out + cut_err, r["duration_s"],
                          r.get("signal"))

    def shell(self, command: str, *, timeout: float | None = None, output_limit: int | None = None) -> ExecResult:
        """Run ``command`` in the persistent bash (cwd, variables, functions persist). Output is in ``stdout``."""
        line = inline_line(command) if self.attach_shell else None
        if line is not None:
            with self._lock:
                if not self.stopped:
                    r = self._attached.run(self, line, timeout or self.spec.timeout_s,
                                           output_limit or self.spec.output_limit)
                    if r is not None:
                        return r
        r = self._call("shell", timeout, {"command": command, "output_limit": output_limit})
        if isinstance(r, ExecResult):
            return r
        out, cut = clip(r["output"], (output_limit or self.spec.output_limit) + _MARKER_ROOM)
        return ExecResult(r["exit_code"], out, "", r["timed_out"], r["cut"] + cut, r["duration_s"],
                          restarted=r["restarted"])

    def python(self, code: str, *, timeout: float | None = None, output_limit: int | None = None) -> ExecResult:
        """Run ``code`` in the persistent IPython shell; ``exit_code`` is 0 on success, 1 on an exception."""
        r = self._call("python", timeout, {"code": code, "output_limit": output_limit})
        if isinstance(r, ExecResult):
            return r
        code_ = 124 if r["timed_out"] else (0 if r["success"] else 1)
        out, cut = clip(r["output"], (output_limit or self.spec.output_limit) + _MARKER_ROOM)
        return ExecResult(code_, out, "", r["timed_out"], r["cut"] + cut, r["duration_s"])

    def edit(self, command: str, path: str, **kwargs: Any) -> tuple[bool, str]:
        """Run one ``str_replace_editor`` command. Returns ``(ok, text)``; a refused command gives ``ok=False``."""
        r = self._call("edit", None, {"command": command, "path": path, **kwargs})
        if isinstance(r, ExecResult):
            return False, r.stdout
        return not r["failed"], clip(r["output"], self.spec.output_limit + _MARKER_ROOM)[0]

    def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        """The bytes of ``path`` (as the sandbox sees it). Raises ``SandboxError`` if it cannot be read."""
        return base64.b64decode(self.request("read", path=path, max_bytes=max_bytes or READ_MAX_BYTES)["data"])

    def read_text(self, path: str) -> str:
        return self.read_file(path).decode("utf-8", errors="replace")

    def write_file(self, path: str, data: str | bytes, mode: int | None = None) -> None:
        """Write ``data`` to ``path`` in the sandbox (parents created). Raises ``SandboxError`` on failure."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        self.request("write", path=path, data=base64.b64encode(raw).decode("ascii"), mode=mode)

    def kill_processes(self) -> int:
        """Kill every process in the sandbox except its action server (a fork bomb, stray background jobs); the
        shell restarts on its next use. Returns how many processes were running."""
        return int(self.request("killall").get("killed", 0))

    def ping(self) -> dict:
        return self.request("ping")

    def _call(self, op: str, timeout: float | None, args: dict) -> dict | ExecResult:
        try:
            return self.request(op, timeout=timeout, **{k: v for k, v in args.items() if v is not None})
        except ServerHung as e:
            return ExecResult(124, f"Error: {e}", "", timed_out=True, restarted=True, error=str(e))
        except ServerRestarted as e:
            return ExecResult(-1, f"Error: {e}", "", restarted=True, error=str(e))
        except ServerError as e:  # refused by the server (bad argument, IPython missing): a marked result
            return ExecResult(-1, f"Error: {e}", "", error=str(e))

    # ---- lifecycle ------------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return not self.stopped

    def stop(self, grace_s: float | None = None) -> None:
        """Stop the sandbox: ask the server to exit, SIGTERM what is left, wait ``grace_s``, SIGKILL, confirm that
        no process of the sandbox remains, then remove its workspace. Idempotent. Raises :class:`SandboxError` if a
        process survived (its pids are in the message)."""
        from envhub.sandbox import lifecycle

        with self._stop_lock:
            if self.stopped:
                return
            self.stopped = True
        grace = self.spec.stop_grace_s if grace_s is None else grace_s
        try:
            # Ask nicely first (the server hangs up its shell, kills its commands, exits) -- unless a request is in
            # flight: then we do not wait for it, the signals below end it and its caller gets a SandboxError.
            if grace > 0 and self._lock.acquire(blocking=False):
                try:
                    sock = self._connect()
                    sock.settimeout(max(grace, 0.05))
                    protocol.send(sock, {"op": "shutdown"})
                    protocol.recv(sock)
                except (OSError, protocol.ProtocolError):
                    pass
                finally:
                    self._drop_connection()
                    self._lock.release()
            left = self._terminate(grace)
            self._drop_connection()
        finally:
            lifecycle.unregister(self)
            self._cleanup()
        if left:
            raise SandboxError(f"sandbox {self.id}: processes {left} survived SIGKILL")

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "stopped" if self.stopped else "live"
        return f"<{type(self).__name__} {self.id} {state} workdir={self.workdir}>"


_SHELL_REPLACING_OPS = frozenset({"shell", "shell_interrupt", "killall"})


READ_MAX_BYTES = 64 << 20  # read_file's default max_bytes (the server's too)
_MARKER_ROOM = 512  # the server's cut marker ("[... N bytes of output cut ...]") on top of output_limit


def _arm(sock: socket.socket, seconds: float) -> None:
    """Kernel-side send and receive timeouts on a blocking socket: a ``recv`` that waits ``seconds`` fails with
    EAGAIN (``BlockingIOError``). Unlike ``settimeout``, Python then polls nothing before each call."""
    tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _short(e: Any, limit: int = 300) -> str:
    """An error text from the sandbox side, bounded (it reaches the model)."""
    text = str(e)
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} characters cut]"
