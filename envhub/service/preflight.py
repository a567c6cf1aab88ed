"""Preflight: before a run starts, check what this node can be asked for, and refuse with a named reason instead of
failing late (``docs/metrics.md``, "Preflight": in one published agent-RL run, 960 concurrent sandboxes died with
"dead" errors and hour-long spin-ups whose cause, an account limit, took days to find).

Given the requested concurrency (sandboxes alive at once), :func:`preflight` checks

* **descriptors**: the open-files limit, raised to its hard ceiling first (:mod:`envhub.fdlimit`), against
  ``FDS_PER_SANDBOX`` per sandbox plus the server's own reserve;
* **processes**: ``RLIMIT_NPROC`` (which counts every thread of the user) against the user's threads now plus
  ``PROCS_PER_SANDBOX`` per sandbox;
* **sandbox runtime**: the runtime exists and, unless told not to, really starts a sandbox that runs ``true``;
* **memory** and **disk**: available memory (the smaller of ``MemAvailable`` and the cgroup's headroom) and free
  disk under the sandboxes' temporary directory, against a per-sandbox need;
* **backends**: each LLM server URL answers ``GET /v1/models``; where it says its context length (vLLM's
  ``max_model_len``), a requested ``max_length`` must fit in it.

Each check is a :class:`Check` with one line a person can act on; :func:`require` raises :class:`PreflightError`
naming every failed one. The sandbox limit (``--max-sandboxes``) below the concurrency is a warning, not a refusal:
the service queues INITs at its limit.
"""
from __future__ import annotations

import os
import resource
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any

FDS_PER_SANDBOX = 8  # the action-server socket, a pty pair, pipes while starting, the client's connection; margin
PROCS_PER_SANDBOX = 4  # bwrap, the sandbox's init, the action server, a shell
RESERVE_FDS = 256  # the server's own: listening socket, client connections, logs, imports
MEMORY_MB_PER_SANDBOX = 8  # measured ~3.3 MB PSS for a sandbox with a shell (envhub.service.sandboxes)
DISK_MB_PER_SANDBOX = 16  # a sandbox's tmpfs-backed workspace spills here when tasks write files


@dataclass
class Check:
    """One preflight finding. ``ok=False`` with ``fatal=True`` refuses the run."""

    name: str
    ok: bool
    detail: str
    fatal: bool = True

    def line(self) -> str:
        mark = "ok" if self.ok else ("REFUSED" if self.fatal else "warning")
        return f"{self.name}: {mark}: {self.detail}"


class PreflightError(RuntimeError):
    """The node cannot run the requested concurrency; ``checks`` holds every finding, the message the failed ones."""

    def __init__(self, checks: list[Check]):
        self.checks = checks
        failed = [c for c in checks if not c.ok and c.fatal]
        super().__init__("preflight refused: " + "; ".join(f"{c.name}: {c.detail}" for c in failed))


def check_descriptors(concurrency: int) -> Check:
    from envhub.fdlimit import raise_nofile_limit

    soft, hard = raise_nofile_limit()
    need = concurrency * FDS_PER_SANDBOX + RESERVE_FDS
    if soft != resource.RLIM_INFINITY and soft < need:
        fits = max(0, (soft - RESERVE_FDS) // FDS_PER_SANDBOX)
        return Check("descriptors", False, f"RLIMIT_NOFILE is {soft} (hard {hard}) but {concurrency} concurrent "
                     f"sandboxes need about {need}: raise the hard limit (ulimit -Hn, systemd LimitNOFILE=, "
                     f"/etc/security/limits.conf) or lower the concurrency to {fits}")
    return Check("descriptors", True, f"RLIMIT_NOFILE {soft} >= {need} needed")


def _user_threads(uid: int) -> int:
    n = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/status") as f:
                status = f.read()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1").split()[0]) == uid:
            n += int(fields.get("Threads", "1"))
    return n


def check_processes(concurrency: int) -> Check:
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft == resource.RLIM_INFINITY:
        return Check("processes", True, "RLIMIT_NPROC unlimited")
    used = _user_threads(os.getuid())
    need = used + concurrency * PROCS_PER_SANDBOX
    if soft < need:
        fits = max(0, (soft - used) // PROCS_PER_SANDBOX)
        return Check("processes", False, f"RLIMIT_NPROC is {soft}, this user already runs {used} threads and "
                     f"{concurrency} sandboxes need about {concurrency * PROCS_PER_SANDBOX} more: raise it "
                     f"(ulimit -u, systemd TasksMax=/LimitNPROC=) or lower the concurrency to {fits}")
    return Check("processes", True, f"RLIMIT_NPROC {soft} >= {need} needed ({used} in use)")


def check_runtime(runtime: str = "auto", start: bool = True) -> Check:
    from envhub.sandbox import SandboxError, SandboxSpec
    from envhub.sandbox.runtimes import get_runtime

    try:
        rt = get_runtime(runtime)
    except SandboxError as e:
        return Check("sandbox runtime", False, str(e))
    name = getattr(rt, "name", type(rt).__name__)
    if not start:
        return Check("sandbox runtime", True, f"{name} installed (not started)")
    sb = None
    try:
        sb = rt.start(SandboxSpec(runtime=runtime, timeout_s=30))
        r = sb.exec("true", timeout=30)
        if not r.ok:
            return Check("sandbox runtime", False, f"{name} started a sandbox but `true` failed in it: "
                         f"exit {r.exit_code} {r.error or r.output[-200:]}")
    except Exception as e:  # whatever the runtime raises is the reason; the message is the action
        return Check("sandbox runtime", False, f"{name} cannot start a sandbox here: {type(e).__name__}: {e}")
    finally:
        if sb is not None:
            sb.stop()
    return Check("sandbox runtime", True, f"{name} started a sandbox and ran `true`")


def _available_memory_mb() -> int:
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) // 1024
    except OSError:
        pass
    try:  # cgroup v2: the container's own ceiling
        with open("/sys/fs/cgroup/memory.max") as f:
            top = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            cur = int(f.read())
        if top != "max":
            room = (int(top) - cur) // (1 << 20)
            avail = room if avail is None else min(avail, room)
    except (OSError, ValueError):
        pass
    return avail if avail is not None else 1 << 30


def check_memory(concurrency: int, per_sandbox_mb: float = MEMORY_MB_PER_SANDBOX) -> Check:
    avail, need = _available_memory_mb(), concurrency * per_sandbox_mb
    if avail < need:
        return Check("memory", False, f"{avail} MB available but {concurrency} sandboxes need about {need:g} MB "
                     f"({per_sandbox_mb:g} MB each): free memory or lower the concurrency to "
                     f"{int(avail // per_sandbox_mb)}")
    return Check("memory", True, f"{avail} MB available >= {need:g} MB needed")


def check_disk(concurrency: int, per_sandbox_mb: float = DISK_MB_PER_SANDBOX, path: str | None = None) -> Check:
    path = path or tempfile.gettempdir()
    free, need = shutil.disk_usage(path).free // (1 << 20), concurrency * per_sandbox_mb
    if free < need:
        return Check("disk", False, f"{free} MB free under {path} but {concurrency} sandboxes need about {need:g} MB "
                     f"({per_sandbox_mb:g} MB each): free space, point TMPDIR elsewhere, or lower the concurrency")
    return Check("disk", True, f"{free} MB free under {path} >= {need:g} MB needed")


def check_backend(url: str, max_length: int | None = None, timeout_s: float = 5.0) -> Check:
    """``GET {url}/v1/models``: reachable, and (where the server says ``max_model_len``) long enough."""
    import httpx

    base = url.removeprefix("sglang+").rstrip("/").removesuffix("/v1")
    name = f"backend {url}"
    try:
        r = httpx.get(base + "/v1/models", timeout=timeout_s)
    except httpx.HTTPError as e:
        return Check(name, False, f"unreachable ({type(e).__name__}: {e}): start the server, or fix --backend")
    if r.status_code != 200:
        return Check(name, False, f"GET /v1/models answered {r.status_code}: is this an OpenAI-compatible server?")
    try:
        ctx = max((int(m["max_model_len"]) for m in r.json().get("data", []) if m.get("max_model_len")),
                  default=None)
    except (ValueError, TypeError, AttributeError, KeyError):
        ctx = None
    if ctx is not None and max_length is not None and max_length > ctx:
        return Check(name, False, f"context length {ctx} < the requested max_length {max_length}: lower "
                     "max_length or serve the model with a longer --max-model-len")
    return Check(name, True, "reachable" + (f", context length {ctx}" if ctx is not None else ""))


def preflight(concurrency: int, *, backends: list[Any] = (), runtime: str | None = "auto",  # type: ignore[assignment]
              start_sandbox: bool = True, runtime_required: bool = True, max_sandboxes: int | None = None,
              max_length: int | None = None, memory_mb_per_sandbox: float = MEMORY_MB_PER_SANDBOX,
              disk_mb_per_sandbox: float = DISK_MB_PER_SANDBOX, disk_path: str | None = None) -> list[Check]:
    """Every check for ``concurrency`` sandboxes at once (see the module docstring). ``runtime=None`` skips the
    sandbox checks (text envs only); ``runtime_required=False`` makes a missing runtime a warning."""
    if not isinstance(concurrency, int) or concurrency < 1:
        raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
    checks = [check_descriptors(concurrency), check_processes(concurrency),
              check_memory(concurrency, memory_mb_per_sandbox), check_disk(concurrency, disk_mb_per_sandbox, disk_path)]
    if runtime is not None:
        c = check_runtime(runtime, start_sandbox)
        c.fatal = runtime_required
        checks.append(c)
    if max_sandboxes is not None and max_sandboxes < concurrency:
        checks.append(Check("sandbox limit", False, f"--max-sandboxes {max_sandboxes} < concurrency {concurrency}: "
                            "INITs past the limit wait for a sandbox (see /status)", fatal=False))
    for b in backends:
        if isinstance(b, str) and b.removeprefix("sglang+").startswith(("http://", "https://")):
            checks.append(check_backend(b, max_length))
    return checks


def require(concurrency: int, **kw: Any) -> list[Check]:
    """:func:`preflight`, raising :class:`PreflightError` when any fatal check failed."""
    checks = preflight(concurrency, **kw)
    if any(not c.ok and c.fatal for c in checks):
        raise PreflightError(checks)
    return checks
