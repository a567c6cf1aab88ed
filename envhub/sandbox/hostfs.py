"""Host-side access to paths a sandbox can write: never follow a link the sandbox planted, never create there.

A sandbox's run directory (``<state>/run``, the socket's home) and its host-directory workspace are writable from
inside. Code in the sandbox can swap any entry there for a symlink to a host path between two host accesses; a
host ``open()`` would then follow it -- read a host file into an error the model sees, or create and append to a
host file as the host user. Every host access to such a path goes through here:

* :func:`connect_unix` opens the socket's path with ``O_PATH | O_NOFOLLOW``, checks that it is a socket, and
  connects through ``/proc/self/fd/N`` (that very inode): a symlink in its place is refused, not followed.
* :func:`read_tail` reads a log without following links and only if it is a regular file.
* Host-owned state (the action server's log) lives in the state directory itself, which no sandbox sees
  (:func:`open_log` still refuses a link).
"""
from __future__ import annotations

import os
import socket
import stat


class UnsafePath(OSError):
    """A path under a sandbox-writable directory is not what the host expected (a symlink, a FIFO...)."""


def connect_unix(path: str) -> socket.socket:
    """A connected ``AF_UNIX`` stream socket to the socket file at ``path``, refusing a symlink in its place."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise UnsafePath(e.errno, f"cannot open the action server's socket: {e.strerror}") from None
    try:
        if not stat.S_ISSOCK(os.fstat(fd).st_mode):
            # no path in the text: it reaches the model
            raise UnsafePath("the action server's socket was replaced by something else from inside the sandbox: "
                             "refusing to connect")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(f"/proc/self/fd/{fd}")
        except OSError:
            s.close()
            raise
        return s
    finally:
        os.close(fd)


def open_log(path: str) -> int:
    """A write-only append descriptor for a host-owned log, never through a symlink."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def read_tail(path: str, limit: int = 4000) -> bytes | None:
    """The last ``limit`` bytes of the regular file at ``path`` (not through a symlink; a FIFO never blocks us), or
    None if it is missing or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return os.pread(fd, limit, max(0, st.st_size - limit))
    finally:
        os.close(fd)
