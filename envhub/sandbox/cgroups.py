"""Per-sandbox cgroups (pids, memory and cpu), when this host lets us create them.

Why: ``RLIMIT_NPROC`` counts processes per host uid, and the kernel never applies it to uid 0 (root, or a user
namespace mapped onto root); a ``pids`` cgroup caps one sandbox's process count whatever the uid, and a ``memory``
cgroup caps the sandbox as a whole (its processes and its tmpfs pages); a ``cpu`` cgroup's CFS quota (``cpu.max``, or
``cpu.cfs_quota_us`` on v1) caps the CPU time of all its processes together, background jobs included. They also list
every process of the sandbox, which lets ``stop()`` confirm that nothing survived.

Support is probed once per interpreter: cgroup v1 (a hierarchy per controller) and v2 (unified, where the parent must
delegate the controller). Where neither works (rootless without delegation), :func:`available` returns an empty set
and the runtimes fall back to rlimits, saying so in ``capabilities()``.
"""
from __future__ import annotations

import os
import threading
import uuid
from functools import lru_cache

ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("pids", "memory", "cpu")
CPU_PERIOD_US = 100_000


def _own_paths() -> dict[str, tuple[str, int]]:
    """{controller: (absolute dir of our own cgroup for it, version)} from /proc/self/cgroup."""
    out: dict[str, tuple[str, int]] = {}
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    v2_controllers: list[str] = []
    try:
        v2_controllers = _read(ROOT, "cgroup.controllers").split()
    except OSError:
        pass
    for line in lines:
        num, ctrls, path = line.split(":", 2)
        if num == "0" and ctrls == "":
            for c in v2_controllers:
                out.setdefault(c, (os.path.join(ROOT, path.lstrip("/")), 2))
            continue
        for c in ctrls.split(","):
            if c in CONTROLLERS and os.path.isdir(os.path.join(ROOT, c)):
                out[c] = (os.path.join(ROOT, c, path.lstrip("/")), 1)
    return out


@lru_cache(maxsize=1)
def parents() -> dict[str, tuple[str, int]]:
    """Probe: for each controller, a parent directory under which we can create a working child cgroup."""
    found: dict[str, tuple[str, int]] = {}
    for ctrl, (own, version) in _own_paths().items():
        if ctrl not in CONTROLLERS:
            continue
        parent = os.path.join(own, "envhub")
        probe = os.path.join(parent, f"probe-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        try:
            os.makedirs(parent, exist_ok=True)
            if version == 2:
                with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                    f.write(f"+{ctrl}")
            os.mkdir(probe)
            limit_file, value = {"pids": ("pids.max", "100"),
                                 "memory": ("memory.limit_in_bytes" if version == 1 else "memory.max", str(1 << 30)),
                                 "cpu": ("cpu.cfs_quota_us", "100000") if version == 1
                                 else ("cpu.max", "100000 100000")}[ctrl]
            with open(os.path.join(probe, limit_file), "w") as f:
                f.write(value)
            found[ctrl] = (parent, version)
            if ctrl == "cpu":
                _weigh_parent(parent, version)
        except OSError:
            pass
        finally:
            try:
                os.rmdir(probe)
            except OSError:
                pass
    return found


def parent_weight(version: int, cpus: int | None = None) -> str:
    """The scheduling weight of the parent of all sandboxes: that of ``cpus`` (default: this host's) ordinary busy
    processes (v1 ``cpu.shares`` 1024 each, v2 ``cpu.weight`` 100 each), as Kubernetes weighs its pods' parent.

    Why: CFS shares CPU between the entities of one level, and a cgroup is one entity. Left at the default, every
    sandbox together weighed as much as one process of the host: on a busy host a multi-threaded harness in a
    sandbox got a fraction of what it got outside (claude-code's RUN 6.2 s against 3.6 s without a cpu cgroup, with
    two busy loops on 2 cores; never throttled by its quota). The weight only divides contended time; each
    sandbox's quota (``cpu.cfs_quota_us`` / ``cpu.max``) still caps it."""
    n = max(1, cpus or os.cpu_count() or 1)
    return str(1024 * n) if version == 1 else str(min(10000, 100 * n))


def _weigh_parent(parent: str, version: int) -> None:
    try:
        _write(parent, "cpu.shares" if version == 1 else "cpu.weight", parent_weight(version))
    except OSError:  # best effort: without it sandboxes are only weighed as one process under contention
        pass


def available() -> set[str]:
    """The controllers a sandbox can get its own cgroup for: a subset of ``{"pids", "memory", "cpu"}``."""
    return set(parents())


class SandboxCgroups:
    """The cgroups of one sandbox: create with limits, add processes, list them, remove when empty."""

    _lock = threading.Lock()

    def __init__(self, name: str, max_procs: int | None, memory_mb: int | None, cpu_quota: float | None = None):
        self.dirs: dict[str, tuple[str, int]] = {}
        for ctrl, (parent, version) in parents().items():
            wanted = {"pids": max_procs, "memory": memory_mb, "cpu": cpu_quota}.get(ctrl)
            if not wanted:
                continue
            d = os.path.join(parent, name)
            try:
                os.mkdir(d)
                if ctrl == "cpu":  # CFS bandwidth: cpu_quota CPUs' worth of time per period, for the whole sandbox
                    quota = max(1000, int(float(cpu_quota) * CPU_PERIOD_US))
                    if version == 1:
                        _write(d, "cpu.cfs_period_us", str(CPU_PERIOD_US))
                        _write(d, "cpu.cfs_quota_us", str(quota))
                    else:
                        _write(d, "cpu.max", f"{quota} {CPU_PERIOD_US}")
                elif ctrl == "pids":
                    _write(d, "pids.max", str(int(max_procs)))
                elif version == 1:
                    _write(d, "memory.limit_in_bytes", str(int(memory_mb) << 20))
                    if os.path.exists(os.path.join(d, "memory.memsw.limit_in_bytes")):
                        _write(d, "memory.memsw.limit_in_bytes", str(int(memory_mb) << 20))
                else:
                    _write(d, "memory.max", str(int(memory_mb) << 20))
                    if os.path.exists(os.path.join(d, "memory.swap.max")):
                        _write(d, "memory.swap.max", "0")
            except OSError:
                _rmdir(d)
                continue
            self.dirs[ctrl] = (d, version)

    @property
    def controllers(self) -> set[str]:
        return set(self.dirs)

    def add(self, pid: int) -> None:
        for d, _ in self.dirs.values():
            _write(d, "cgroup.procs", str(pid))

    def pids(self) -> set[int]:
        out: set[int] = set()
        for d, _ in self.dirs.values():
            try:
                out.update(int(x) for x in _read(d, "cgroup.procs").split())
            except OSError:
                pass
        return out

    def remove(self) -> bool:
        """Remove the cgroup directories (they must be empty). Returns True when all are gone."""
        ok = True
        for d, _ in list(self.dirs.values()):
            ok = _rmdir(d) and ok
        return ok


def _write(d: str, name: str, value: str) -> None:
    with open(os.path.join(d, name), "w") as f:
        f.write(value)


def _rmdir(d: str) -> bool:
    try:
        os.rmdir(d)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


def _read(d: str, name: str) -> str:
    with open(os.path.join(d, name)) as f:
        return f.read()
