"""Disk quota for host-directory workspaces: a size- and inode-capped tmpfs mounted on the workspace directory.

A workspace that is a host directory (``workspace_size_mb=None``, what swe-gym uses so the grader can read it) would
otherwise share the host's disk: a sandbox could fill it (2 GB in 8 s) or exhaust its inodes. Where this process may
mount (root, or ``CAP_SYS_ADMIN``), the directory becomes a tmpfs with ``size=`` and ``nr_inodes=`` before the
workspace is copied in; writes past either get ``ENOSPC`` inside the sandbox and the host is untouched. Its pages
count towards the memory cgroup of whoever wrote them (the sandbox's, for the agent's files). ``stop()`` unmounts it
(lazily, ``MNT_DETACH``) before removing the state directory. Where mounting is not allowed, nothing is mounted and
``capabilities()`` says the workspace has no cap.
"""
from __future__ import annotations

import ctypes
import os
import tempfile
from functools import lru_cache

MS_NOSUID, MS_NODEV = 2, 4
MNT_DETACH = 2


@lru_cache(maxsize=1)
def _libc():
    return ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(path: str, size_mb: int, inodes: int | None) -> bool:
    """Mount a tmpfs of ``size_mb`` MB (and at most ``inodes`` inodes) on the existing directory ``path``. Returns
    False, mounting nothing, where this process may not mount."""
    opts = f"size={int(size_mb)}m,mode=0755" + (f",nr_inodes={int(inodes)}" if inodes else "")
    rc = _libc().mount(b"envhub-workspace", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, opts.encode())
    return rc == 0


def unmount(path: str) -> None:
    """Detach the mount on ``path`` if there is one (no error if there is none)."""
    _libc().umount2(os.fsencode(path), MNT_DETACH)


@lru_cache(maxsize=1)
def available() -> bool:
    """Whether this process can mount a capped tmpfs (probed once)."""
    d = tempfile.mkdtemp(prefix="envhub-quota-probe-")
    try:
        ok = mount_tmpfs(d, 1, 64)
        if ok:
            unmount(d)
        return ok
    except (OSError, AttributeError):
        return False
    finally:
        try:
            os.rmdir(d)
        except OSError:
            pass


def unmount_under(root: str) -> None:
    """Unmount every mount at or below ``root`` (a state directory about to be removed), deepest first."""
    root = os.path.realpath(root)
    try:
        with open("/proc/self/mountinfo") as f:
            points = [line.split()[4] for line in f]
    except OSError:
        return
    for p in sorted((p for p in points if p == root or p.startswith(root + os.sep)), key=len, reverse=True):
        unmount(p)
