"""Sandboxes for the service's INIT stage: prewarmed pools, and a per-job factory that never leaks one.

Two pieces:

* :class:`SandboxProvider` hands out started sandboxes. A spec seen a second time (every task of an env with a fixed
  ``sandbox_spec``; every sample of a GRPO group for per-task specs) gets a prewarmed
  :class:`~envhub.sandbox.pool.SandboxPool`, so later INITs take a ready sandbox instead of paying for a start. A
  spec seen once is started directly: prewarming specs that never repeat would only burn processes. Pools are
  bounded (``max_pools``, least recently used closed first) and closed when idle for ``idle_s``.
* :class:`JobSandboxes` is one job's ``ToolEnv.sandbox_factory``. It records every sandbox it hands out, so the job
  frees them whatever happens to it. Cancelling a stage cannot stop a worker thread that is inside ``env.reset``
  (starting a sandbox); once the job is closed the factory refuses new sandboxes and stops any that arrive late.

The sandbox layer (``envhub.sandbox``) is imported only when an env actually asks for a sandbox.
"""
from __future__ import annotations

import logging
import os

import sys
import threading
import time
from collections import OrderedDict
from typing import Any, Callable

log = logging.getLogger("envhub.service")


class SandboxProvider:
    """Where INIT gets its sandboxes (see the module docstring).

    Args:
        pool_size: prewarmed sandboxes kept per repeating spec (0: never prewarm).
        max_pools: at most this many specs keep a pool.
        idle_s: a pool unused this long is closed (its waiting sandboxes stopped).
        starter: ``spec -> Sandbox``; default ``envhub.sandbox.start``.
        max_live: at most this many sandboxes live in this process (default :func:`default_max_sandboxes`). At the
            limit a job's INIT waits for a sandbox to stop instead of failing; ``/status`` shows the waiters.
    """

    def __init__(self, pool_size: int = 2, max_pools: int = 8, idle_s: float = 120.0,
                 starter: Callable[[Any], Any] | None = None, max_live: int | None = None):
        self.pool_size, self.max_pools, self.idle_s = pool_size, max_pools, idle_s
        self.max_live = max_live or default_max_sandboxes()
        self.waiting = 0  # INIT threads waiting for a slot under max_live
        self._starter = starter
        self._lock = threading.Lock()
        self._pools: OrderedDict[str, tuple[Any, float]] = OrderedDict()  # spec key -> (SandboxPool, last use)
        self._seen: OrderedDict[str, int] = OrderedDict()  # spec key -> acquisitions (bounded)
        self.acquired = 0
        self.closed = False
        # ``meter.sandbox_failed(cause)`` / ``meter.sandbox_waiting(+1|-1)`` (the service's throughput figures)
        self.meter: Any = None


    def renewed(self) -> SandboxProvider:
        """A fresh provider with this one's settings (the pipeline's, after a stop closed this one)."""
        renewed = SandboxProvider(self.pool_size, self.max_pools, self.idle_s, self._starter, self.max_live)
        renewed.meter = self.meter
        return renewed

    def _start(self, spec: Any) -> Any:
        """Start a sandbox, first waiting for a slot under ``max_live`` (queued, not failed, at the node's limit)."""
        from envhub.sandbox import SandboxError, lifecycle

        if self._starter is None:
            from envhub.sandbox import start

            self._starter = start
        meter = self.meter
        with self._lock:
            self.waiting += 1
        if meter is not None:
            meter.sandbox_waiting(+1)
        try:
            slot = lifecycle.reserve(self.max_live, lambda: self.closed)
        finally:
            with self._lock:
                self.waiting -= 1
            if meter is not None:
                meter.sandbox_waiting(-1)
        if not slot:
            raise SandboxError("the service is stopping: no new sandboxes")
        try:
            return self._starter(spec)
        except Exception as e:
            if meter is not None:
                meter.sandbox_failed(failure_cause(e))
            raise
        finally:
            lifecycle.release()

    def acquire(self, spec: Any) -> Any:
        """A started sandbox for ``spec``: from its pool when it has one, else started now. Thread-safe."""
        key = spec.key()
        evicted: list[Any] = []
        with self._lock:
            if self.closed:
                from envhub.sandbox import SandboxError

                raise SandboxError("the service is stopping: no new sandboxes")
            self.acquired += 1
            evicted = self._evict_idle()
            pool = None
            if key in self._pools:
                pool = self._pool_for(key, spec)
            else:
                seen = self._seen.pop(key, 0) + 1
                self._seen[key] = seen
                while len(self._seen) > 4096:
                    self._seen.popitem(last=False)
                if seen >= 2 and self.pool_size > 0:
                    pool, more = self._pool_for(key, spec), self._evict_over()
                    evicted += more
        for p in evicted:  # outside the lock: stopping sandboxes takes a while
            p.close()
        return pool.acquire() if pool is not None else self._start(spec)

    __call__ = acquire  # a ``ToolEnv.sandbox_factory`` (``spec -> Sandbox``) in its own right, outside the service

    def _pool_for(self, key: str, spec: Any) -> Any:
        entry = self._pools.pop(key, None)
        if entry is None:
            from envhub.sandbox.pool import SandboxPool

            entry = (SandboxPool(spec, self.pool_size, self._start), 0.0)
        self._pools[key] = (entry[0], time.monotonic())  # most recently used last
        return entry[0]

    def _evict_over(self) -> list[Any]:
        out = []
        while len(self._pools) > self.max_pools:
            out.append(self._pools.popitem(last=False)[1][0])
        return out

    def _evict_idle(self) -> list[Any]:
        now, out = time.monotonic(), []
        for key, (pool, used) in list(self._pools.items()):
            if now - used > self.idle_s:
                del self._pools[key]
                out.append(pool)
        return out

    def status(self) -> dict[str, Any]:
        with self._lock:
            pools = [p for p, _ in self._pools.values()]
        return {"pools": len(pools), "ready": sum(p.ready() for p in pools), "acquired": self.acquired,
                "live": live_count(), "limit": self.max_live, "waiting": self.waiting}

    def close(self) -> None:
        """Close every pool (stops the sandboxes waiting in them). Sandboxes handed out are their jobs' to stop."""
        with self._lock:
            self.closed = True
            pools = [p for p, _ in self._pools.values()]
            self._pools.clear()
        if "envhub.sandbox.lifecycle" in sys.modules:  # threads waiting for a slot see `closed` and give up
            sys.modules["envhub.sandbox.lifecycle"].wake()
        for p in pools:
            p.close()


class JobSandboxes:
    """One job's sandbox factory (``env.sandbox_factory``): hands out sandboxes and stops them all on :meth:`close`.

    After ``close`` it refuses new sandboxes, and a sandbox that a still-running worker thread obtains afterwards is
    stopped at once (the thread then sees an error, in a job nobody waits for any more).
    """

    def __init__(self, provider: SandboxProvider):
        self.provider = provider
        self._lock = threading.Lock()
        self._held: list[Any] = []
        self.closed = False

    def __call__(self, spec: Any) -> Any:
        from envhub.sandbox import SandboxError

        with self._lock:
            if self.closed:
                raise SandboxError("this job was cancelled or stopped: no new sandbox")
        sb = self.provider.acquire(spec)
        with self._lock:
            if not self.closed:
                self._held.append(sb)
                return sb
        sb.stop()
        raise SandboxError("this job was cancelled or stopped while its sandbox started; it was stopped")

    @property
    def used(self) -> bool:
        """Whether this job ever got a sandbox (a text env never does: closing it then costs nothing)."""
        with self._lock:
            return bool(self._held)

    @property
    def held(self) -> int:
        with self._lock:
            return sum(1 for sb in self._held if not getattr(sb, "stopped", False))

    def close(self) -> int:
        """Stop every sandbox this job got (``stop()`` is idempotent: ones the env freed already cost nothing).
        Returns how many were still running."""
        with self._lock:
            self.closed = True
            held, self._held = self._held, []
        running = 0
        for sb in held:
            if not getattr(sb, "stopped", False):
                running += 1
            try:
                sb.stop()
            except Exception:  # one bad stop must not keep the others alive; a possible leak is logged
                log.warning("sandbox %s: stop() raised", getattr(sb, "id", "?"), exc_info=True)
        return running


def default_max_sandboxes() -> int:
    """Live sandboxes one process holds at most, when not told: what its open-files limit allows at ~8 descriptors
    each, and its memory at ~8 MB each (measured: ~3.3 MB PSS for a sandbox with a shell; the margin is for the
    agent's own processes). ``envhub serve --max-sandboxes`` overrides it."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    fds = (1 << 20) if soft == resource.RLIM_INFINITY else soft
    try:
        mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    except (ValueError, OSError):
        mem_mb = 8192
    return max(16, min(fds // 8, mem_mb // 8))


def failure_cause(e: BaseException) -> str:
    """A short label for why a sandbox start failed (the ``cause`` of ``envhub_sandbox_init_failures``): the
    runtime is missing, the process ran out of descriptors or memory, the start timed out, or the error's type."""
    from envhub.fdlimit import is_out_of_descriptors

    text = str(e).lower()
    if type(e).__name__ == "RuntimeUnavailable":
        return "runtime_unavailable"
    if is_out_of_descriptors(e) or "out of file descriptors" in text or "open-file table" in text:
        return "descriptors"
    if isinstance(e, MemoryError) or "cannot allocate memory" in text:
        return "memory"
    if isinstance(e, TimeoutError) or "timed out" in text:
        return "timeout"
    return type(e).__name__


def live_count() -> int:
    """Sandboxes alive in this process (0 without loading the sandbox layer if no env ever used one)."""
    if "envhub.sandbox" not in sys.modules:
        return 0
    from envhub.sandbox import live_sandboxes

    return len(live_sandboxes())


def stop_all_live() -> int:
    """Stop every sandbox still alive in this process (``/stop``'s last sweep: e.g. a verifier's own sandbox that
    a cancelled EVAL left behind). Returns how many were stopped."""
    if "envhub.sandbox" not in sys.modules:
        return 0
    from envhub.sandbox import live_sandboxes

    left = live_sandboxes()
    for sb in left:
        try:
            sb.stop()
        except Exception:
            log.warning("sandbox %s: stop() raised", getattr(sb, "id", "?"), exc_info=True)
    return len(left)
