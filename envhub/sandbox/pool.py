"""Prewarmed sandboxes: hand out a ready sandbox in microseconds and refill in the background.

A sandbox is never reused: :meth:`SandboxPool.acquire` takes a fresh one out of the pool (the caller owns it and
stops it when the episode ends, freeing it at once), and a background thread starts a replacement. With the pool
empty (a burst), ``acquire`` starts one itself rather than wait for the refill thread.

    pool = SandboxPool(SandboxSpec(workspace_from="repo/"), size=4)
    sb = pool.acquire()          # ready: action server up, workspace copied
    ...; sb.stop()
    pool.close()                 # stops the sandboxes still waiting in the pool

For several specs, :class:`envhub.service.sandboxes.SandboxProvider` keeps one pool per spec that repeats (bounded,
closed when idle) and is itself a ``ToolEnv.sandbox_factory``.
"""
from __future__ import annotations

import collections
import threading
from typing import Callable

from envhub.sandbox.base import Sandbox, SandboxError, SandboxSpec


class SandboxPool:
    """Keeps ``size`` started sandboxes of one spec ready.

    Args:
        spec: the spec every sandbox of this pool is started from.
        size: how many to keep ready.
        starter: ``spec -> Sandbox`` (default ``envhub.sandbox.start``).
        warm_shell: also start each sandbox's bash in the background, so the first command does not pay for it.
    """

    def __init__(self, spec: SandboxSpec, size: int = 2, starter: Callable[[SandboxSpec], Sandbox] | None = None,
                 warm_shell: bool = True):
        if size < 0:
            raise ValueError("size must be >= 0")
        if starter is None:
            from envhub.sandbox.runtimes import start as starter
        self.spec, self.size, self._start, self.warm_shell = spec, size, starter, warm_shell
        self._ready: collections.deque[Sandbox] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.errors: list[str] = []  # why refills failed (the latest few)
        self.started = 0
        self._thread = threading.Thread(target=self._refill_loop, name="envhub-sandbox-pool", daemon=True)
        self._thread.start()

    def _refill_loop(self) -> None:
        failures = 0
        while True:
            with self._cond:
                while not self._closed and len(self._ready) >= self.size:
                    self._cond.wait()
                if self._closed:
                    return
            try:
                sb = self._start(self.spec)
                if self.warm_shell:
                    try:
                        sb.shell(":")
                    except Exception:
                        sb.stop()
                        raise
                failures = 0
            except Exception as e:  # recorded; acquire() will start one itself and raise the real error
                self.errors = (self.errors + [f"{type(e).__name__}: {e}"])[-5:]
                failures += 1
                with self._cond:
                    self._cond.wait(min(5.0, 0.05 * 2 ** failures))  # back off, but keep trying
                continue
            with self._cond:
                if self._closed:
                    sb.stop()
                    return
                self._ready.append(sb)
                self.started += 1
                self._cond.notify_all()

    def acquire(self) -> Sandbox:
        """A ready sandbox, now. Taken from the pool if one is waiting, else started on the spot."""
        with self._cond:
            if self._closed:
                raise SandboxError("the pool is closed")
            sb = self._ready.popleft() if self._ready else None
            self._cond.notify_all()  # wake the refill thread
        if sb is not None and not sb.stopped:
            return sb
        return self._start(self.spec)

    def __call__(self, spec: SandboxSpec | None = None) -> Sandbox:
        return self.acquire()

    def ready(self) -> int:
        with self._cond:
            return len(self._ready)

    def wait_ready(self, n: int | None = None, timeout: float = 30.0) -> bool:
        """Block until ``n`` (default ``size``) sandboxes are ready; False on timeout."""
        n = self.size if n is None else n
        with self._cond:
            return self._cond.wait_for(lambda: len(self._ready) >= n or self._closed, timeout)

    def close(self) -> None:
        """Stop the refill thread and every sandbox still waiting in the pool (handed-out ones are the caller's)."""
        with self._cond:
            self._closed = True
            waiting = list(self._ready)
            self._ready.clear()
            self._cond.notify_all()
        self._thread.join(timeout=60)
        for sb in waiting:
            sb.stop()

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
