"""Open-file limits: a node running a thousand sandboxes needs far more descriptors than the default 1024.

Each live sandbox costs the host a few descriptors (its action-server socket, a pty copy, pipes while it starts), and
a rollout service adds one per HTTP connection. Linux starts processes with a soft ``RLIMIT_NOFILE`` of 1024 even
where the hard limit is far higher, and ``select()`` cannot watch a descriptor numbered 1024 or above at all. So:
nothing in envhub waits with ``select()`` (poll/selectors only, see ``tests/sandbox/test_fd_ceiling.py``), the
long-running entry points (``envhub serve``, ``envhub rollout``) call :func:`raise_nofile_limit` at start, and when the
raised limit is exhausted anyway, :func:`out_of_descriptors` turns the bare ``EMFILE`` into an error that names the
limit and says how to raise it.
"""
from __future__ import annotations

import errno
import resource


def raise_nofile_limit(want: int = 1 << 20) -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit (no privilege needed), and where this process may (root,
    ``CAP_SYS_RESOURCE``) the hard limit too, up to ``want`` and the kernel's ``fs.nr_open``. Returns ``(soft,
    hard)`` after. Never lowers anything."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < want:
        ceiling = min(want, _nr_open())
        if ceiling > hard:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, ceiling))  # fails without the privilege
            except (ValueError, OSError):
                pass
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, 1 << 20) if hard == resource.RLIM_INFINITY else hard  # an infinite soft limit may be refused
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # keep what we have; the error path names it
            pass
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _nr_open() -> int:
    """The kernel's ceiling for any process's open-file limit (``/proc/sys/fs/nr_open``)."""
    try:
        with open("/proc/sys/fs/nr_open") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 1 << 20


def is_out_of_descriptors(e: BaseException) -> bool:
    return isinstance(e, OSError) and e.errno in (errno.EMFILE, errno.ENFILE)


def out_of_descriptors(what: str, e: OSError) -> str:
    """A message for an ``EMFILE`` / ``ENFILE`` hit while doing ``what``, naming the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if e.errno == errno.ENFILE:
        return (f"{what}: the system-wide open-file table is full (ENFILE); raise fs.file-max or run fewer "
                f"concurrent sandboxes on this node")
    return (f"{what}: this process is out of file descriptors (RLIMIT_NOFILE soft={soft}, hard={hard}); raise the "
            f"hard limit (`ulimit -Hn`, systemd LimitNOFILE=, or /etc/security/limits.conf) or lower concurrency")
