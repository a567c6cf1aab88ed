"""The action server: one small process inside each sandbox, answering the host over a Unix domain socket.

Started by a runtime as ``python -I -S -c '<boot>' '<json config>'`` (see ``common.server_argv``). It binds the
socket, prints ``READY`` on stdout (the host waits for that line instead of polling), then serves one request at a
time: a persistent pty bash (:mod:`.bash`), the ``str_replace_editor`` (:mod:`.editor`), an in-process IPython
(:mod:`.ipy`), plain ``exec`` of an argv or a shell string with limits, and file reads/writes. Requests are
handled strictly in order, so a sandbox's tools never race each other; the host runs many sandboxes at once.

The config (all keys optional except ``socket``)::

    socket, workdir, rundir, env, timeout_s, output_limit,
    child_limits: {memory_mb, cpu_s, max_file_mb, max_procs}   # applied to bash and every exec'd command
    self_limits:  {memory_mb, max_procs}                       # applied to the server (and so the whole sandbox)
    copy_from:    a directory copied into workdir at start (tmpfs workspaces)
    cmd_file:     where the shell's long commands are written (default: <rundir>/.cmd)
"""
from __future__ import annotations

import _signal as signal  # the C modules: ``signal``, ``socket`` and ``json`` would import enum and re
import _socket
import binascii
import faulthandler
import os
import sys
import time

from . import protocol, spawn
from .limits import OutputCap, apply_rlimits, clip

# shutil, the shell, the editor and IPython are imported on first use: a sandbox is ready as soon as this module and
# the socket are, which is most of its cold-start time. ``exec`` needs no import at all (see .spawn: not subprocess).

WATCHDOG_GRACE_S = 15.0  # a request this long past its own timeout means the server is stuck: exit, host restarts


class Server:
    def __init__(self, cfg: dict):
        self.cfg = cfg
        self.workdir = cfg.get("workdir") or os.getcwd()
        self.rundir = cfg.get("rundir") or os.path.dirname(cfg["socket"])
        self.env = {k: str(v) for k, v in (cfg.get("env") or {}).items()} or dict(os.environ)
        self.timeout_s = float(cfg.get("timeout_s") or 60)
        self.output_limit = int(cfg.get("output_limit") or 65536)
        self.child_limits = dict(cfg.get("child_limits") or {})
        self.editor = None
        self.bash = None
        self.python = None
        self.children: set[int] = set()  # process groups of running exec'd commands

    # ---- requests -----------------------------------------------------------------------------------------------
    def handle(self, req: dict) -> dict:
        op = req.get("op")
        fn = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if fn is None:
            return {"ok": False, "error": f"unknown op {op!r}"}
        watchdog = op in ("python", "edit", "read", "write")
        if watchdog:
            # faulthandler's timer thread is C and needs no GIL, so it fires even while a cell is stuck in C code
            # that never returns to the interpreter (where the cell's SIGALRM handler cannot run). It dumps the
            # tracebacks to the log and exits; the host sees the socket close and relaunches the sandbox. Only the
            # python op runs foreign code in this process (file ops could meet a slow filesystem); shell and exec are
            # bounded by our own select loops, and arming the timer starts a thread: too much for every shell
            # round trip.
            timeout = float(req.get("timeout") or self.timeout_s)
            faulthandler.dump_traceback_later(timeout + WATCHDOG_GRACE_S, exit=True)
        try:
            out = fn(req)
            out.setdefault("ok", True)
            return out
        except (TypeError, ValueError, KeyError) as e:
            return {"ok": False, "error": f"bad request for {op}: {type(e).__name__}: {e}"}
        except OSError as e:
            return {"ok": False, "error": f"{op} failed: {e}"}
        except ImportError as e:
            return {"ok": False, "error": f"{op} is not available in this sandbox: {e} (install it in the image)"}
        except Exception as e:  # a bug of ours must not take the sandbox down: report it, keep serving
            return {"ok": False, "error": f"{op} failed inside the action server: {type(e).__name__}: {e}"}
        finally:
            if watchdog:
                faulthandler.cancel_dump_traceback_later()

    def op_ping(self, req: dict) -> dict:
        return {"pid": os.getpid(), "uid": os.getuid(), "cwd": self.workdir}

    def _shell(self):
        """The sandbox's persistent bash, created on first use (its import and start are not paid by sandboxes that
        never use a shell)."""
        if self.bash is None:
            from .bash import BashSession

            cmd_file = self.cfg.get("cmd_file") or os.path.join(self.rundir, ".cmd")
            self.bash = BashSession(self.workdir, self.env, cmd_file, spawn.child_setup(self.child_limits))
        return self.bash

    def op_shell(self, req: dict) -> dict:
        t = time.monotonic()
        timeout = float(req.get("timeout") or self.timeout_s)
        limit = int(req.get("output_limit") or self.output_limit)
        code, output, info = self._shell().run(str(req["command"]), timeout, limit)
        return {"exit_code": code, "output": output, "duration_s": time.monotonic() - t, **info}

    def op_shell_attach(self, req: dict) -> dict:
        """Hand the host a copy of the shell's pty master, so short commands skip this server entirely (see
        ``envhub.sandbox.attached``). The shell is started first if it is not running; ``restarted`` says a dead one
        was replaced. ``exited``: the host saw the shell's terminal close (it may not have finished exiting)."""
        bash = self._shell()
        if req.get("exited"):
            bash.close()
        restarted = bash.ensure_started()
        return {"restarted": restarted, "_fd": bash.proc.fd}

    def op_shell_interrupt(self, req: dict) -> dict:
        """The host's command on the attached pty timed out: interrupt it here, where the shell's process group can
        be signalled, and replace the shell if it does not come back."""
        bash = self._shell()
        if not bash.alive:
            return {"exit_code": 124, "output": "", "timed_out": True, "cut": 0, "restarted": True}
        code, output, info = bash.settle(None, "timeout", OutputCap(int(req.get("output_limit") or self.output_limit)))
        return {"exit_code": code, "output": output, **info}

    def op_edit(self, req: dict) -> dict:
        from .editor import Editor, EditorError

        if self.editor is None:
            self.editor = Editor(self.workdir)
        args = {k: req.get(k) for k in ("file_text", "old_str", "new_str", "insert_line", "view_range")}
        limit = int(req.get("output_limit") or self.output_limit)
        try:
            out, failed = self.editor.run(req.get("command"), req.get("path"), **args), False
        except EditorError as e:
            out, failed = str(e), True
        out, cut = clip(out, limit)  # a view of a 4 MB file is a tool output like any other: head and tail kept
        return {"failed": failed, "output": out, "cut": cut}

    def op_python(self, req: dict) -> dict:
        if self.python is None:
            from .ipy import PythonSession

            os.chdir(self.workdir)
            self.python = PythonSession(self.workdir)
        timeout = float(req.get("timeout") or self.timeout_s)
        t = time.monotonic()
        ok, output, info = self.python.run(str(req["code"]), timeout, int(req.get("output_limit") or self.output_limit))
        return {"success": ok, "output": output, "duration_s": time.monotonic() - t, **info}

    def op_read(self, req: dict) -> dict:
        limit = int(req.get("max_bytes") or (64 << 20))
        _check_regular(req["path"], must_exist=True)
        with open(req["path"], "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            return {"ok": False, "error": f"{req['path']} is larger than max_bytes={limit}"}
        return {"data": binascii.b2a_base64(data, newline=False).decode("ascii")}

    def op_write(self, req: dict) -> dict:
        path = req["path"]
        if req.get("mkdirs", True) and os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
        data = binascii.a2b_base64(req["data"])
        _check_regular(path, must_exist=False)
        with open(path, "wb") as f:
            f.write(data)
        if req.get("mode") is not None:
            os.chmod(path, int(req["mode"]))
        return {"bytes": len(data)}

    def op_exec(self, req: dict) -> dict:
        cmd = req["cmd"]
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else [str(a) for a in cmd]
        if not argv:
            raise ValueError("cmd is empty")
        env = dict(self.env)
        env.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})
        limits = dict(self.child_limits)
        limits.update({k: req[k] for k in ("memory_mb", "cpu_s", "max_file_mb", "max_procs") if req.get(k)})
        timeout = float(req.get("timeout") or self.timeout_s)
        out_cap = OutputCap(int(req.get("output_limit") or self.output_limit))
        err_cap = OutputCap(int(req.get("output_limit") or self.output_limit))
        data = req.get("input")
        stdin = binascii.a2b_base64(data) if data is not None else None
        t0 = time.monotonic()
        try:
            child = spawn.start(argv, req.get("cwd") or self.workdir, env, limits, with_stdin=stdin is not None)
        except OSError as e:  # no such program, not executable, cwd missing: a result, not a crash
            return {"exit_code": 127 if isinstance(e, FileNotFoundError) else 126, "signal": None, "stdout": "",
                    "stderr": f"{e.filename or argv[0]}: {e.strerror or e}\n", "timed_out": False, "cut": 0,
                    "duration_s": time.monotonic() - t0}
        self.children.add(child.pid)
        timed_out = True
        try:
            timed_out = spawn.pump(child, stdin, out_cap, err_cap, t0 + timeout)
            if not timed_out:  # the output closed; the command may still be running (it closed its own stdout)
                timed_out = child.wait(t0 + timeout) is None
        finally:
            _killpg(child.pid)  # what is left of its process group: background stragglers, or the command on timeout
            child.wait()
            child.close()
            self.children.discard(child.pid)
        rc = child.returncode
        sig = -rc if rc < 0 else None
        code = 124 if timed_out else (128 + sig if sig else rc)  # 124 as timeout(1) and the shell report a timeout
        return {"exit_code": code, "signal": sig, "stdout": out_cap.text(),
                "stderr": err_cap.text(), "timed_out": timed_out, "cut": out_cap.cut + err_cap.cut,
                "duration_s": time.monotonic() - t0}

    def op_killall(self, req: dict) -> dict:
        """Kill every process of the sandbox but this server (and bwrap's PID 1): the way out of a fork bomb.

        ``kill(-1, SIGKILL)`` reaches every process we may signal in our PID namespace except ourselves and PID 1;
        the kernel delivers it under the tasklist lock, so a fork bomb cannot outrun it. Repeated until /proc is quiet.
        """
        killed = len([p for p in _pids() if p not in (1, os.getpid())])
        if self.bash is not None:
            self.bash.close()
            self.bash = None
        for _ in range(50):
            others = [p for p in _pids() if p not in (1, os.getpid())]
            if not others:
                break
            try:
                os.kill(-1, signal.SIGKILL)
            except OSError:
                pass
            _reap()
            time.sleep(0.01)
        self.children.clear()
        return {"killed": killed, "left": [p for p in _pids() if p not in (1, os.getpid())]}

    def op_shutdown(self, req: dict) -> dict:
        self.close()
        return {"bye": True}

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def close(self) -> None:
        if self.bash is not None:
            self.bash.close()
            self.bash = None
        for pgid in list(self.children):
            _killpg(pgid)


def _check_regular(path: str, must_exist: bool) -> None:
    """Refuse FIFOs, devices and sockets: opening a FIFO with no peer would block the server forever."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        if must_exist:
            raise
        return
    if not stat.S_ISREG(mode):
        raise OSError(f"{path} is not a regular file")


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def _reap() -> None:
    """Collect our dead children (zombies would otherwise still be listed in /proc)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    cfg = protocol.loads(argv[1])
    own = cfg.get("self_limits") or {}
    apply_rlimits(own.get("memory_mb"), None, None, own.get("max_procs"), oom_score_adj=None)
    workdir = cfg.get("workdir") or os.getcwd()
    os.makedirs(workdir, exist_ok=True)
    if cfg.get("copy_from"):
        import shutil

        shutil.copytree(cfg["copy_from"], workdir, symlinks=True, dirs_exist_ok=True)
    os.chdir(workdir)
    server = Server(cfg)
    path = cfg["socket"]
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(8)
    signal.signal(signal.SIGTERM, lambda *_: (server.close(), os._exit(0)))
    os.write(1, f"READY {os.getpid()}\n".encode())
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # nobody reads our stdout after READY: never block on a full pipe
    while True:
        fd, _ = listener._accept()
        conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, fd)
        try:
            while True:
                try:
                    req = protocol.recv(conn)
                except (protocol.ProtocolError, OSError):
                    break
                reply = server.handle(req)
                try:
                    protocol.send(conn, reply, reply.pop("_fd", None))
                except (protocol.ProtocolError, OSError):
                    break
                if req.get("op") == "shutdown":
                    os._exit(0)  # nothing to flush or finalize: skip interpreter teardown (milliseconds per stop)
        finally:
            conn.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
