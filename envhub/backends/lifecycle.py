"""The weight-update lifecycle: ``pause`` → the trainer changes the weights → ``resume(version)``.

An asynchronous trainer updates the policy while rollouts are in flight. The agent, the env, its sandbox and a
black-box harness must never notice: no truncated or empty reply, no error, no duplicated tool call. And every
sampled token must carry the version of the weights that sampled it. One :class:`WeightLifecycle` per policy
(a backend, or a :class:`~envhub.backends.pool.BackendPool` shared by its members) does both::

    lc = lifecycle_of(backend)
    lc.pause(mode="hold")          # returns once no token is being sampled (in-flight calls are parked)
    ...change the weights...       # nothing samples meanwhile
    lc.resume(version=7)           # parked calls continue; every later token is tagged 7

Two modes, after AReaL / verl (abort) and OpenRLHF / PipelineRL / NeMo RL (keep):

* ``"hold"``: a generation in flight stops between two tokens and continues under the new weights once resumed.
  A backend that decodes step by step (the ``hf`` backend) re-runs the context under the new weights before the
  next token, so each token's logprob is exactly its tagged version's. A vLLM server driven through its own routes
  does the same (:mod:`envhub.backends.vllm_http` drops its KV at the pause; vLLM's keep without that reuses
  stale keys and values).
* ``"abort"``: a generation in flight returns what it sampled so far (``finish_reason="abort"``), and
  :func:`generate_tagged` re-sends it after the resume as prompt + partial output with the remaining
  ``max_tokens``: the caller gets one :class:`Generation` whose chunks carry their own versions.

A backend that cannot stop between tokens (an HTTP server without a pause route) is *drained* instead: ``pause``
waits until its calls in flight have finished, so the weights never change under a running call and the tags stay
exact. A server that has its own pause route and tags tokens itself (vLLM's RL routes in dev mode) is driven
instead: :meth:`WeightLifecycle.add_engine` (:mod:`envhub.backends.vllm_http`); ``pause`` then pauses the server
(``abort`` → vLLM ``abort``, ``hold`` → vLLM ``keep``) and ``resume`` tells it the version before it samples again. Calls that arrive while paused wait (on the event loop, no thread each) until ``resume``.

Bounded everywhere: ``pause`` waits at most ``timeout_s`` for in-flight calls (then it un-pauses and raises
:class:`LifecycleError`), and a call waits at most ``max_pause_s`` for a resume (then it fails with
:class:`PausedTooLong`, which the executor marks as an error trajectory, never a hang). ``resume`` without a pause
and a version that goes backwards are refused. ``paused_s(since)`` lets run-time limits exclude paused time.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Any

from envhub.backends.base import BackendError, Generation, LLMBackend, SamplingParams

MODES = ("hold", "abort")
ABORT = "abort"  # what :meth:`WeightLifecycle.checkpoint` returns to a backend that must stop now


class LifecycleError(RuntimeError):
    """A lifecycle call that cannot be honoured (resume without pause, version backwards, pause that timed out)."""


class PausedTooLong(BackendError):
    """A generation waited for ``resume`` longer than ``max_pause_s``."""


class WeightLifecycle:
    """The version of the weights and whether they may be sampled from now (module docstring).

    Args:
        version: the weights' version at start.
        max_pause_s: the longest a generation waits for a resume before it fails (:class:`PausedTooLong`).
    """

    def __init__(self, version: int = 0, *, max_pause_s: float = 600.0):
        self.version = int(version)
        self.max_pause_s = float(max_pause_s)
        self.paused = False
        self.mode = "hold"
        self._cond = threading.Condition()
        self._active = 0                  # calls sampling right now (not parked at a checkpoint, not waiting)
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._paused_at: float | None = None
        self._pauses: list[tuple[float, float]] = []   # (start, end) of every finished pause, monotonic clock
        self.counts = {"pauses": 0, "held": 0, "aborted": 0, "resumed_chunks": 0}
        self.engines: list[Any] = []  # servers paused / resumed / told the version by their own routes (add_engine)

    # ---- the trainer's side ------------------------------------------------------------------------------------
    def pause(self, mode: str = "hold", *, timeout_s: float = 60.0) -> dict[str, Any]:
        """Stop sampling. Returns once no call is sampling (each is parked at a token boundary, aborted, or
        finished), with ``{"version", "mode", "waited_s"}``. Raises :class:`LifecycleError` if already paused, or
        if in-flight calls did not stop within ``timeout_s`` (the pause is then undone: nothing stays stuck)."""
        if mode not in MODES:
            raise LifecycleError(f"pause mode must be one of {MODES}, got {mode!r}")
        t0 = time.monotonic()
        with self._cond:
            if self.paused:
                raise LifecycleError("already paused: resume first (one pause per weight update)")
            self.paused, self.mode, self._paused_at = True, mode, t0
            self.counts["pauses"] += 1
            engines = list(self.engines)
        if engines:
            self._pause_engines(engines, mode, t0 + timeout_s)
            return {"version": self.version, "mode": mode, "waited_s": time.monotonic() - t0}
        with self._cond:
            if not self._cond.wait_for(lambda: self._active == 0, timeout=timeout_s):
                running = self._active
                self._end_pause()
                raise LifecycleError(f"pause timed out after {timeout_s}s: {running} generation(s) still sampling "
                                     "(a backend that cannot stop between tokens is drained; raise timeout_s)")
        return {"version": self.version, "mode": mode, "waited_s": time.monotonic() - t0}

    def resume(self, version: int | None = None) -> dict[str, Any]:
        """Let sampling continue, under ``version`` when given (it must not go backwards)."""
        with self._cond:
            if not self.paused:
                raise LifecycleError("resume without a pause")
            if version is not None and int(version) < self.version:
                raise LifecycleError(f"version going backwards: {version} < current {self.version}")
            engines = list(self.engines)
        # servers first: each is told the version before it samples again (so its own tags and ours agree); a
        # server that fails leaves the lifecycle paused, and resume can be called again
        for engine in engines:
            if version is not None:
                engine.set_version(int(version))
        with self._cond:
            if version is not None:
                self.version = int(version)
        for engine in engines:
            engine.resume()
        with self._cond:
            if self.paused:
                self._end_pause()
        return {"version": self.version}

    def add_engine(self, engine: Any) -> None:
        """Drive a server's own pause / resume routes (e.g. :class:`~envhub.backends.vllm_http.VLLMServerControl`:
        ``check()``, ``pause(mode, timeout_s)``, ``set_version(v)``, ``resume()``, each bounded, each raising
        :class:`LifecycleError`). The server is checked and told the current version now. With engines, ``pause``
        returns once every server has paused (its own guarantee that nothing samples; a call in flight gets its
        partial output back in ``abort`` mode, or stays frozen in the server in ``hold``) instead of draining."""
        engine.check()
        with self._cond:
            if self.paused:
                raise LifecycleError("add_engine while paused: resume first")
            version = self.version
        engine.set_version(version)
        with self._cond:
            self.engines.append(engine)

    def _pause_engines(self, engines: list[Any], mode: str, deadline: float) -> None:
        for i, engine in enumerate(engines):
            try:
                engine.pause(mode, timeout_s=deadline - time.monotonic())
            except Exception as e:
                # undo: resume the servers paused so far and this one (its pause may have landed after the
                # timeout), un-pause here; nothing stays stuck, the trainer may pause again
                for other in engines[: i + 1]:
                    try:
                        other.resume()
                    except Exception:  # noqa: BLE001, S110 - the pause's error is the one to report
                        pass
                with self._cond:
                    self._end_pause()
                if isinstance(e, LifecycleError):
                    raise
                raise LifecycleError(f"pause failed on {engine!r}: {type(e).__name__}: {e}") from e

    def set_version(self, version: int) -> None:
        """Bump the version without a pause: only for weights that changed while nothing sampled (e.g. before
        the first rollout, or after a restart from a checkpoint). Refused while calls are sampling."""
        with self._cond:
            if int(version) < self.version:
                raise LifecycleError(f"version going backwards: {version} < current {self.version}")
            if self._active and not self.paused:
                raise LifecycleError("set_version while generations are sampling would mislabel their tokens: "
                                     "pause first")
            engines = list(self.engines)
        for engine in engines:  # a server tags its tokens itself: tell it first
            engine.set_version(int(version))
        with self._cond:
            self.version = int(version)

    def _end_pause(self) -> None:  # with self._cond held
        assert self._paused_at is not None
        self._pauses.append((self._paused_at, time.monotonic()))
        del self._pauses[:-1024]
        self.paused, self._paused_at = False, None
        waiters, self._waiters = self._waiters, []
        self._cond.notify_all()
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_settle, fut)

    def paused_s(self, since: float) -> float:
        """Seconds spent paused since ``since`` (``time.monotonic()``), the pause in progress included."""
        now = time.monotonic()
        with self._cond:
            spans = list(self._pauses) + ([(self._paused_at, now)] if self._paused_at is not None else [])
        return sum(max(0.0, end - max(start, since)) for start, end in spans if end > since)

    # ---- the backend's side --------------------------------------------------------------------------------------
    async def enter(self) -> int:
        """Wait (on the event loop) until not paused, then count one call as sampling; returns the version."""
        deadline = time.monotonic() + self.max_pause_s
        while True:
            with self._cond:
                if not self.paused:
                    self._active += 1
                    return self.version
                loop = asyncio.get_running_loop()
                fut = loop.create_future()
                self._waiters.append((loop, fut))
            left = deadline - time.monotonic()
            try:
                await asyncio.wait_for(fut, max(0.0, left))
            except asyncio.TimeoutError:
                raise PausedTooLong(f"paused for more than {self.max_pause_s}s without a resume") from None

    def enter_blocking(self) -> int:
        """:meth:`enter` for a worker thread (a backend that samples in its own thread)."""
        with self._cond:
            if not self._cond.wait_for(lambda: not self.paused, timeout=self.max_pause_s):
                raise PausedTooLong(f"paused for more than {self.max_pause_s}s without a resume")
            self._active += 1
            return self.version

    def exit(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def checkpoint(self) -> int | str | None:
        """Called by a sampling backend between two tokens. ``None``: go on (the fast path reads one attribute).
        An ``int``: the call was held and resumed under that version (re-run the context before the next token).
        :data:`ABORT`: return what was sampled so far with ``finish_reason="abort"``."""
        if not self.paused:
            return None
        with self._cond:
            if not self.paused:
                return None
            if self.mode == ABORT:
                self.counts["aborted"] += 1
                return ABORT
            self.counts["held"] += 1
            self._active -= 1
            self._cond.notify_all()
            resumed = self._cond.wait_for(lambda: not self.paused, timeout=self.max_pause_s)
            self._active += 1
            if not resumed:
                raise PausedTooLong(f"held for more than {self.max_pause_s}s without a resume")
            return self.version  # always an int: the caller re-runs its context (the weights may have changed)

    def status(self) -> dict[str, Any]:
        with self._cond:
            return {"version": self.version, "paused": self.paused, "mode": self.mode if self.paused else None,
                    "sampling": self._active, **self.counts}


def _settle(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def lifecycle_of(backend: LLMBackend) -> WeightLifecycle:
    """The backend's lifecycle, made on first use (a pool shares one with its members)."""
    lc = getattr(backend, "lifecycle", None)
    if lc is None:
        lc = WeightLifecycle()
        backend.lifecycle = lc  # type: ignore[attr-defined]
    return lc


def _rest(params: SamplingParams, done: int) -> SamplingParams:
    """The sampling parameters of a re-sent chunk after ``done`` tokens: the remaining ``max_tokens``, and a seed
    derived from the request's seed and ``done`` (reproducible, yet not the first chunk's random stream again: a
    chunk restarted on the same seed would repeat the same draws and skew the distribution)."""
    seed = None if params.seed is None else (params.seed * 1_000_003 + done) % (2**63)
    return replace(params, max_tokens=params.max_tokens - done, seed=seed)


async def generate_tagged(backend: LLMBackend, prompt_ids: list[int], params: SamplingParams, *,
                          session_id: str = "") -> Generation:
    """``backend.generate`` under the lifecycle: waits while paused, re-sends an aborted call as prompt + partial
    output with the remaining ``max_tokens`` (as AReaL's ``agenerate`` and verl's retry loop do), and returns one
    :class:`Generation` with ``versions`` (one per token) and ``interruptions`` set. The caller never sees an abort.

    A backend with ``samples_under_lifecycle = True`` (the ``hf`` backend) counts itself in and stops at token
    boundaries; for any other backend this function counts the call in, so a pause drains it."""
    lc = lifecycle_of(backend)
    own = getattr(backend, "samples_under_lifecycle", False)
    ids: list[int] = []
    lps: list[float] = []
    versions: list[int] = []
    interruptions = 0
    while True:
        chunk_params = params if not ids else _rest(params, len(ids))
        version = None if own else await lc.enter()  # a self-counting backend counts itself in
        try:
            gen = await backend.generate(list(prompt_ids) + ids if ids else prompt_ids, chunk_params,
                                         session_id=session_id)
        finally:
            if not own:
                lc.exit()
        # Generation checked the length of its own versions; the fallback is the right length by construction
        tags = gen.versions if gen.versions is not None else \
            [lc.version if version is None else version] * len(gen.token_ids)
        ids += gen.token_ids
        lps += gen.logprobs
        versions += tags
        if gen.finish_reason != ABORT:
            return Generation(ids, lps, gen.finish_reason, versions=versions, interruptions=interruptions)
        interruptions += 1
        if len(ids) >= params.max_tokens:  # aborted exactly at the budget: the reply is complete
            return Generation(ids, lps, "length", versions=versions, interruptions=interruptions)
        if own:  # wait for the resume here, so the re-sent chunk is not parked in the backend's queue
            await lc.enter()
            lc.exit()
        lc.counts["resumed_chunks"] += 1
