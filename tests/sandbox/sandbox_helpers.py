"""Helpers shared by the sandbox and tool tests (imported by their conftest files and tests)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from helpers import bwrap_why_not

from envhub.sandbox.common import sandbox_root

WHY_NOT = bwrap_why_not()
needs_bwrap = pytest.mark.skipif(WHY_NOT is not None, reason=WHY_NOT or "")


def leftovers(ids) -> list[str]:
    """What the sandboxes ``ids`` left on the host: state dirs, cgroup dirs (other sessions' sandboxes are ignored)."""
    from envhub.sandbox import cgroups

    left = [os.path.join(sandbox_root(), i) for i in ids if os.path.exists(os.path.join(sandbox_root(), i))]
    for parent, _ in cgroups.parents().values():
        left += [os.path.join(parent, f"sb-{i}") for i in ids if os.path.exists(os.path.join(parent, f"sb-{i}"))]
    return left


def make_rootfs(root):
    """A minimal rootfs (an "image" directory) of hard links to host files: bash, a few coreutils, the system
    python3 and its stdlib (no IPython). Hard links: ~0.3 s and no disk space; same filesystem as /usr required."""
    bins = ["bash", "sh", "cat", "ls", "echo", "python3", "python3.11", "id", "true"]
    paths = set()
    for b in bins:
        p = shutil.which(b, path="/usr/bin")
        if p: paths.add(p); paths.add(os.path.realpath(p))
    for p in list(paths):
        out = subprocess.run(["ldd", os.path.realpath(p)], capture_output=True, text=True).stdout
        for line in out.splitlines():
            for tok in line.split():
                if tok.startswith("/"): paths.add(tok); paths.add(os.path.realpath(tok))
    for p in sorted(paths):
        real = p if not p.startswith(("/lib/", "/lib64/", "/bin/")) else "/usr" + p
        dest = root + real
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        if os.path.islink(p) and not p.startswith(("/lib/", "/lib64/")):
            if not os.path.lexists(dest): os.symlink(os.readlink(p), dest)
        elif not os.path.exists(dest):
            os.link(os.path.realpath(p), dest)
    subprocess.run(["cp", "-al", "/usr/lib/python3.11", root + "/usr/lib/python3.11"], check=True)
    for name, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
        if not os.path.lexists(os.path.join(root, name)):
            os.symlink(target, os.path.join(root, name))
    os.makedirs(root + "/etc", exist_ok=True)
    for f in ("passwd", "group"):
        shutil.copy("/etc/" + f, root + "/etc/" + f)
