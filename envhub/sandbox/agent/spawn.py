"""``exec``'s process handling: fork, set up the child, exec, feed and drain its pipes, wait with a deadline.

Why not ``subprocess``: importing it (with ``locale``, ``re``, ``enum``, ``selectors``...) costs ~22 ms, which a
sandbox paid on its first ``exec`` -- and a harness episode's first ``exec`` is the one that starts the agent, on the
critical path (``benchmarks/harness.py``). This module uses only C modules (``os``, ``_signal``, ``select``), and
does what ``Popen(..., start_new_session=True, preexec_fn=child_setup(limits))`` did: a new session, Python's
ignored signals restored, the limits applied, every descriptor but 0-2 closed, ``argv[0]`` looked up on the
command's own ``PATH``; a failure before ``exec`` (no such program, a missing cwd) comes back as an ``OSError``
raised in the caller, as ``Popen`` raised it.
"""
from __future__ import annotations

import _signal as signal
import os
import select
import time

from .limits import OutputCap, apply_rlimits


def child_setup(limits: dict):
    """What runs in a child between fork and exec: default signal dispositions, then the sandbox's limits."""
    def setup() -> None:
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT):  # Python ignores these; children must not
            signal.signal(sig, signal.SIG_DFL)
        apply_rlimits(limits.get("memory_mb"), limits.get("cpu_s"), limits.get("max_file_mb"),
                      limits.get("max_procs"), oom_score_adj=1000)
    return setup


class Child:
    """A started command: its pid (also its process group and session) and our ends of its pipes."""

    def __init__(self, pid: int, stdin: int | None, stdout: int, stderr: int):
        self.pid, self.stdin, self.stdout, self.stderr = pid, stdin, stdout, stderr
        self.returncode: int | None = None  # as Popen's: negative for a signal

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, deadline: float | None = None) -> int | None:
        """The exit code, or None if the deadline passes first."""
        if deadline is None:
            if self.returncode is None:
                self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
            return self.returncode
        delay = 0.0005
        while self.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            time.sleep(min(delay, left))
            delay = min(delay * 2, 0.05)
        return self.returncode

    def close(self) -> None:
        close_all(self.stdin, self.stdout, self.stderr)
        self.stdin = self.stdout = self.stderr = None  # closed once: a second close could hit a reused number


def close_all(*fds: int | None) -> None:
    """Close each descriptor that is not None; one already closed is no error."""
    for fd in fds:
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def start(argv: list[str], cwd: str, env: dict[str, str], limits: dict, with_stdin: bool) -> Child:
    """Fork and exec ``argv`` in a new session; stdin is a pipe if ``with_stdin`` else ``/dev/null``."""
    in_r, in_w = os.pipe() if with_stdin else (os.open(os.devnull, os.O_RDONLY), None)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    fail_r, fail_w = os.pipe()  # close-on-exec: EOF means the exec happened; bytes are the reason it did not
    setup = child_setup(limits)
    # PATH is searched here, not in the child by os.execvpe (which imports warnings there, in every child)
    candidates = [argv[0]] if "/" in argv[0] else \
        [os.path.join(d or ".", argv[0]) for d in env.get("PATH", os.defpath).split(os.pathsep)]
    try:
        pid = os.fork()
    except OSError:  # EAGAIN at the sandbox's process limit (a fork bomb running): a result, and no fd left open
        close_all(in_r, in_w, out_r, out_w, err_r, err_w, fail_r, fail_w)
        raise
    if pid == 0:  # the child: nothing here may return into the server's code
        try:
            os.setsid()
            setup()
            for fd, target in ((in_r, 0), (out_w, 1), (err_w, 2)):
                os.dup2(fd, target)
            os.closerange(3, fail_w)
            os.closerange(fail_w + 1, os.sysconf("SC_OPEN_MAX"))
            os.chdir(cwd)  # its error names the directory
            failed = None
            for exe in candidates:
                try:
                    os.execve(exe, argv, env)
                except OSError as e:  # as execvp: the first error other than "not there" wins, else the last
                    if failed is None or isinstance(failed, (FileNotFoundError, NotADirectoryError)):
                        failed = e
            failed.filename = argv[0]  # name the program, not the last directory of PATH tried
            raise failed
        except BaseException as e:
            err = e if isinstance(e, OSError) else OSError(0, f"{type(e).__name__}: {e}")
            why = f"{err.errno or 0}\0{err.filename or ''}\0{err.strerror or err}"
            try:
                os.write(fail_w, why.encode("utf-8", "replace")[:4096])
            finally:
                os._exit(127)
        os._exit(127)
    close_all(in_r, out_w, err_w, fail_w)
    why = b""
    while True:
        chunk = os.read(fail_r, 4096)
        if not chunk:
            break
        why += chunk
    os.close(fail_r)
    if why:
        os.waitpid(pid, 0)
        close_all(in_w, out_r, err_r)
        code, filename, message = why.decode("utf-8", "replace").split("\0", 2)
        raise OSError(int(code), message, filename or None)
    return Child(pid, in_w, out_r, err_r)


def pump(child: Child, stdin: bytes | None, out: OutputCap, err: OutputCap, deadline: float) -> bool:
    """Feed stdin and drain stdout/stderr until both close or the deadline passes. Returns ``timed_out``.

    ``poll``, not ``select``: a sandbox may hold more than 1024 descriptors."""
    waiter = select.poll()
    sinks = {child.stdout: out, child.stderr: err}
    for fd in sinks:
        waiter.register(fd, select.POLLIN)
    view = memoryview(stdin or b"")
    if child.stdin is not None:
        if view:
            os.set_blocking(child.stdin, False)
            waiter.register(child.stdin, select.POLLOUT)
        else:
            os.close(child.stdin)
            child.stdin = None
    exited_at = None
    while sinks or child.stdin is not None:
        now = time.monotonic()
        if now >= deadline:
            return True
        if exited_at is None and child.poll() is not None:
            exited_at = now
        if exited_at is not None and now - exited_at > 0.2:
            return False  # the command is done; a background child still holds the pipes: stop waiting for it
        for fd, _ in waiter.poll(1000 * min(deadline - now, 0.05 if exited_at else 0.5)):
            if fd == child.stdin:
                try:
                    n = os.write(fd, view[:65536])
                    view = view[n:]
                except BlockingIOError:
                    continue
                except OSError:  # the command closed its stdin (EPIPE): the rest is not wanted
                    view = view[len(view):]
                if not view:
                    waiter.unregister(fd)
                    os.close(fd)
                    child.stdin = None
                continue
            chunk = os.read(fd, 1 << 16)
            if chunk:
                sinks[fd].feed(chunk)
            else:
                waiter.unregister(fd)
                del sinks[fd]
    return False
