"""The staleness gate: how far rollouts may run ahead of the trainer (AReaL's capacity rule, one gate for every path).

An asynchronous trainer trains on version ``v`` while rollouts for later steps are already being generated. Left
unbounded, the generator runs ahead and the trainer learns from samples many versions old. AReaL bounds this with
one formula (``areal/infra/staleness_manager.py``): a new rollout is admitted only while ::

    capacity = min(max_concurrent - running, (eta + v + 1) * B - (accepted + running)) > 0

where ``v`` is the trainer's version, ``B`` the samples it consumes per step, ``eta`` the largest lag it tolerates
(AReaL's ``max_head_offpolicyness``), ``running`` the rollouts admitted and not finished, ``accepted`` the finished
rollouts handed to the trainer. Every sample admitted at version ``v_d`` is then among the first
``(eta + v_d + 1) * B``, so the trainer reaches it by version ``v_d + eta``.

One :class:`StalenessGate` serves every path that starts work -- rollout-service jobs, gateway sessions (the AReaL
``/grant_capacity`` counter is the gate's *granted* leases), harness episodes (they run as service jobs and reuse the
job's lease), DAPO oversampling (its jobs are service jobs) -- so nothing bypasses it (AReaL#1481)::

    gate = StalenessGate(max_staleness=2, batch_size=64)
    lease = await gate.acquire()          # waits while capacity <= 0 (or gate.try_acquire(): None / NoCapacity)
    ...                                   # run the rollout
    verdict = gate.finish(lease, ok=True, versions=traj.response_versions)
    gate.report(version=7)                # the trainer, after each weight update (HTTP: POST /staleness/report)
    gate.report(discarded=8)              # the trainer filtered 8 delivered samples (e.g. a zero-variance group)

What it does with work that is stale anyway (a straggler admitted at ``v_d`` that finishes after ``v_d + eta``):

* ``pace`` (default): admission is paced by the rule; a late result is still accepted (AReaL's behaviour), its lag
  recorded in the verdict.
* ``drop``: a rollout whose lag passes ``eta`` is dropped: the version report that makes it stale calls its
  ``on_stale`` (the service cancels the job: no compute spent on it past that point) and its result is rejected.
* ``withhold``: the rollout finishes and is returned marked ``withheld``: its reward still counts in its group's
  baseline, but it is not trained on (prime-rl#2960: cancelling stale members kills the siblings' baseline).

Fixes for what bit AReaL's users, each with a regression test in ``tests/rollout/test_staleness.py``:

* **No burst after a restart (AReaL#1388).** A gate that learns version ``v`` counts at least ``v * B`` samples as
  accepted (the trainer cannot have consumed more than was delivered); a fresh gate told ``v = 50`` therefore admits
  ``(eta + 1) * B``, not ``(eta + 51) * B``.
* **Never stuck at capacity 0 across replicas (AReaL#1396).** The gate is given the *global* ``B`` and
  ``max_concurrent`` and the replica count, and divides once, itself (:func:`share`: at least 1 each), so no caller
  divides twice and no replica is left with a zero share.
* **Per-token age (AReaL#602).** The rule bounds admission, not the age of each token: a generation interrupted by
  weight updates samples its early tokens long before it finishes. ``token_max_staleness = k`` marks every model
  token with ``v - version > k`` as not trainable (xtuner#2003); a rollout with no trainable token left is stale.
"""
from __future__ import annotations

import asyncio
import itertools
import threading
import time
from typing import Any, Callable

# the vocabulary and the HTTP routes live in staleness_api; re-exported: every import path stays
from envhub.rollout.staleness_api import (MODES, SETTINGS, VERDICTS, GateError, Lease, NoCapacity,  # noqa: F401
                                          _int, http_route)
from envhub.rollout.staleness_rule import accepted_floor, capacity, is_stale, share, stale_tokens

_UNSET: Any = object()

class StalenessGate:
    """The capacity rule and the stale-work modes (module docstring). Thread-safe: one lock guards every counter;
    coroutine waiters are woken on their own loops.

    Args:
        max_staleness: ``eta`` in versions (``None``: no staleness bound -- the gate only counts, and caps
            concurrency if ``max_concurrent`` is set).
        batch_size: ``B``, samples the trainer consumes per version, over all replicas.
        max_concurrent: rollouts running at once, over all replicas (``None``: not capped here).
        mode: ``"pace"``, ``"drop"`` or ``"withhold"``.
        token_max_staleness: per-token age bound ``k`` (``None``: off).
        replicas, replica: this gate is replica ``replica`` of ``replicas``; it takes its :func:`share` of ``B``
            and ``max_concurrent``.
        admission_timeout_s: how long :meth:`acquire` waits for capacity before :class:`NoCapacity`.
        version: the trainer's version at start.
    """

    def __init__(self, *, max_staleness: int | None = None, batch_size: int = 1, max_concurrent: int | None = None,
                 mode: str = "pace", token_max_staleness: int | None = None, replicas: int = 1, replica: int = 0,
                 admission_timeout_s: float = 600.0, version: int = 0):
        self._lock = threading.Condition()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future]] = []
        self._ids = itertools.count()
        self.version = 0
        self.running: dict[int, Lease] = {}
        self.granted: list[Lease] = []         # admitted ahead of a session (AReaL's /grant_capacity), not yet spent
        self._queue: list[object] = []         # tickets of the waiters, first come first served
        self.counts = {"admitted": 0, "accepted": 0, "rejected": 0, "dropped": 0, "withheld": 0, "failed": 0,
                       "stale_cancelled": 0, "consumed": 0, "discarded": 0, "refused": 0, "waited": 0,
                       "recovered": 0, "masked_tokens": 0}
        self.max_staleness: int | None = None
        self.batch_size, self.max_concurrent, self.mode = 1, None, "pace"
        self.token_max_staleness: int | None = None
        self.replicas, self.replica, self.admission_timeout_s = 1, 0, 600.0
        self.configure(max_staleness=max_staleness, batch_size=batch_size, max_concurrent=max_concurrent, mode=mode,
                       token_max_staleness=token_max_staleness, replicas=replicas, replica=replica,
                       admission_timeout_s=admission_timeout_s)
        if version:
            self.report(version=version)

    # ---- configuration and state -------------------------------------------------------------------------------
    def configure(self, *, max_staleness: Any = _UNSET, batch_size: Any = _UNSET, max_concurrent: Any = _UNSET,
                  mode: Any = _UNSET, token_max_staleness: Any = _UNSET, replicas: Any = _UNSET,
                  replica: Any = _UNSET, admission_timeout_s: Any = _UNSET) -> dict[str, Any]:
        """Change any of the settings (the rest stay); checked as a whole before anything changes."""
        with self._lock:
            new: dict[str, Any] = {"max_staleness": self.max_staleness, "batch_size": self.batch_size,
                                   "max_concurrent": self.max_concurrent, "mode": self.mode,
                                   "token_max_staleness": self.token_max_staleness, "replicas": self.replicas,
                                   "replica": self.replica, "admission_timeout_s": self.admission_timeout_s}
            given = {"max_staleness": max_staleness, "batch_size": batch_size, "max_concurrent": max_concurrent,
                     "mode": mode, "token_max_staleness": token_max_staleness, "replicas": replicas,
                     "replica": replica, "admission_timeout_s": admission_timeout_s}
            new.update({k: v for k, v in given.items() if v is not _UNSET})
            for k in ("max_staleness", "max_concurrent", "token_max_staleness"):
                _int(new, k, 0, optional=True)
            _int(new, "batch_size", 1)
            _int(new, "replicas", 1)
            _int(new, "replica", 0)
            if new["replica"] >= new["replicas"]:
                raise GateError(f"replica must be in [0, replicas), got {new['replica']} of {new['replicas']}")
            if new["max_concurrent"] == 0:
                raise GateError("max_concurrent must be >= 1 (or null: not capped); 0 would never admit anything")
            if new["mode"] not in MODES:
                raise GateError(f"mode must be one of {MODES}, got {new['mode']!r}")
            t = new["admission_timeout_s"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
                raise GateError(f"admission_timeout_s must be a number >= 0, got {t!r}")
            for k, v in new.items():
                setattr(self, k, v)
            self._wake()
        return self.status()

    @property
    def bounded(self) -> bool:
        """Whether the gate limits admission at all."""
        return self.max_staleness is not None or self.max_concurrent is not None

    @property
    def local_batch(self) -> int:
        return share(self.batch_size, self.replicas, self.replica)

    @property
    def local_concurrent(self) -> int | None:
        return None if self.max_concurrent is None else share(self.max_concurrent, self.replicas, self.replica)

    def capacity(self) -> int | None:
        """Rollouts that may be admitted now (``None``: unbounded)."""
        with self._lock:
            return self._capacity()

    def _capacity(self) -> int | None:
        return capacity(self.local_concurrent, len(self.running), self.max_staleness, self.version, self.local_batch,
                        self.counts["accepted"])

    def status(self) -> dict[str, Any]:
        with self._lock:
            return {"version": self.version, "capacity": self._capacity(), "running": len(self.running),
                    "granted": len(self.granted), "max_staleness": self.max_staleness, "batch_size": self.batch_size,
                    "max_concurrent": self.max_concurrent, "mode": self.mode,
                    "token_max_staleness": self.token_max_staleness, "replicas": self.replicas,
                    "replica": self.replica, "local_batch_size": self.local_batch,
                    "local_max_concurrent": self.local_concurrent, "admission_timeout_s": self.admission_timeout_s,
                    **self.counts}

    # ---- the trainer's side ------------------------------------------------------------------------------------
    def report(self, *, version: int | None = None, consumed: int | None = None,
               discarded: int | None = None) -> dict[str, Any]:
        """The trainer's report: its ``version`` (after a weight update; never backwards), samples it ``consumed``
        (counted), delivered samples it ``discarded`` (filtered out after delivery: they are no longer accepted, so
        they do not use up the staleness budget). Returns the status."""
        fire: list[Lease] = []
        with self._lock:
            probe = {"version": version, "consumed": consumed, "discarded": discarded}
            for k in probe:
                _int(probe, k, 0, optional=True)
            if version is not None and version < self.version:
                raise GateError(f"version went backwards: the trainer reported {version} after {self.version}")
            if discarded is not None and discarded > self.counts["accepted"]:
                raise GateError(f"discarded={discarded} but only {self.counts['accepted']} samples were accepted")
            if discarded:
                self.counts["accepted"] -= discarded
                self.counts["rejected"] += discarded
                self.counts["discarded"] += discarded
            if consumed:
                self.counts["consumed"] += consumed
            if version is not None:
                self.version = version
                # AReaL#1388: the trainer at v has consumed v*B samples; a gate that counts fewer accepted (it was
                # restarted, or the trainer was) would otherwise admit the difference at once, a burst of v*B
                floor = accepted_floor(version, self.local_batch)
                if self.counts["accepted"] < floor:
                    self.counts["recovered"] += floor - self.counts["accepted"]
                    self.counts["accepted"] = floor
                if self.mode == "drop":
                    for lease in self.running.values():
                        if not lease.stale and is_stale(version - lease.dispatch_version, self.max_staleness):
                            lease.stale = True
                            fire.append(lease)
                            self.counts["stale_cancelled"] += 1
            self._wake()
            out = self.status()  # the lock is re-entrant (Condition over an RLock)
        for lease in fire:  # outside the lock: a callback may cancel a job, which finishes its lease
            if lease.on_stale is not None:
                lease.on_stale(lease)
        return out

    # ---- the generator's side ----------------------------------------------------------------------------------
    def judge(self, dispatch_version: int) -> str:
        """At consumption: what the mode says of a sample dispatched at ``dispatch_version``, now (``"fresh"``,
        ``"withheld"``, ``"dropped"``). The verdict of :meth:`finish` is taken when the rollout ends; a sample that
        then waits in the trainer's queue ages further (prime-rl counts queue time), so a trainer holding samples
        re-judges them when it takes them, and reports the ones it does not train as ``discarded``."""
        with self._lock:
            if self.mode == "pace" or not is_stale(self.version - dispatch_version, self.max_staleness):
                return "fresh"
            return "dropped" if self.mode == "drop" else "withheld"

    def _take(self, n: int, kind: str, on_stale: Any, ticket: object = None) -> list[Lease] | None:
        """``n`` leases at once if the rule has room for all of them and no earlier waiter is queued (first come,
        first served: a group waiting for 4 slots is not starved by single rollouts taking each slot that opens)."""
        if self._queue and self._queue[0] is not ticket:
            return None
        cap = self._capacity()
        if cap is not None and cap < n:
            return None
        leases = [Lease(next(self._ids), self.version, kind, on_stale) for _ in range(n)]
        for lease in leases:
            self.running[lease.id] = lease
        self.counts["admitted"] += n
        return leases

    def try_acquire(self, kind: str = "rollout", on_stale: Callable[[Lease], None] | None = None) -> Lease | None:
        """A lease if capacity allows one now (and nobody waits before it), else ``None``."""
        with self._lock:
            got = self._take(1, kind, on_stale)
            return got[0] if got else None

    def acquire_now(self, kind: str = "rollout", on_stale: Callable[[Lease], None] | None = None) -> Lease:
        """:meth:`try_acquire`, raising :class:`NoCapacity` instead of returning ``None``."""
        lease = self.try_acquire(kind, on_stale)
        if lease is None:
            with self._lock:
                self.counts["refused"] += 1
            raise NoCapacity(self._refusal(), self.status())
        return lease

    async def acquire(self, kind: str = "rollout", *, timeout_s: float | None = None,
                      on_stale: Callable[[Lease], None] | None = None,
                      abandon: Callable[[], bool] | None = None) -> Lease | None:
        """Wait for capacity (pacing) and return a lease. :class:`NoCapacity` after ``timeout_s`` (default: the
        gate's ``admission_timeout_s``); ``None`` once ``abandon()`` is true (the caller gave up waiting)."""
        got = await self.acquire_group(1, kind, timeout_s=timeout_s, on_stale=on_stale, abandon=abandon)
        return got[0] if got else None

    async def acquire_group(self, n: int, kind: str = "rollout", *, timeout_s: float | None = None,
                            on_stale: Callable[[Lease], None] | None = None,
                            abandon: Callable[[], bool] | None = None) -> list[Lease] | None:
        """:meth:`acquire` for ``n`` rollouts admitted together (a GRPO group: admitted one by one, a gate could hold
        part of every group and complete none). Waiters are served in arrival order."""
        deadline = time.monotonic() + (self.admission_timeout_s if timeout_s is None else timeout_s)
        loop = asyncio.get_running_loop()
        ticket = object()
        with self._lock:
            most = capacity(self.local_concurrent, 0, self.max_staleness, 0, self.local_batch, 0)
            if most is not None and n > most:
                raise GateError(f"a group of {n} can never be admitted: at most {most} rollouts run at once "
                                "((max_staleness + 1) * batch_size, max_concurrent)")
            got = self._take(n, kind, on_stale)
            if got:
                return got
            self._queue.append(ticket)
            self.counts["waited"] += 1
        try:
            while True:
                if abandon is not None and abandon():
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    with self._lock:
                        self.counts["refused"] += 1
                    raise NoCapacity(self._refusal(waited_s=True), self.status())
                fut = loop.create_future()
                with self._lock:
                    got = self._take(n, kind, on_stale, ticket)
                    if got:
                        return got
                    self._waiters.append((loop, fut))
                try:  # woken by any change that can open capacity; the short cap re-checks abandon()
                    await asyncio.wait_for(fut, min(left, 0.5))
                except asyncio.TimeoutError:
                    pass
                finally:
                    with self._lock:
                        if (loop, fut) in self._waiters:
                            self._waiters.remove((loop, fut))
        finally:
            with self._lock:
                if ticket in self._queue:
                    self._queue.remove(ticket)
                    self._wake()  # the next in line may go now

    def grant(self, n: int = 1) -> int:
        """AReaL's ``/grant_capacity``: admit ``n`` rollouts now, to be spent by sessions (:meth:`claim`). Raises
        :class:`NoCapacity` (nothing granted) when the rule has no room for all ``n``. Returns the granted count."""
        with self._lock:
            leases = self._take(n, "grant", None)
            if leases is None:
                self.counts["refused"] += 1
                raise NoCapacity(self._refusal(), self.status())
            self.granted.extend(leases)
            return len(self.granted)

    def claim(self) -> Lease | None:
        """Spend one granted lease (``None`` when none is left); its dispatch version stays the grant's."""
        while True:
            with self._lock:
                if not self.granted:
                    return None
                lease = self.granted.pop(0)
            if not lease.stale:
                return lease
            self.cancel(lease)  # drop mode: a grant that went stale before any session spent it

    def finish(self, lease: Lease, *, ok: bool = True, versions: list[int] | None = None) -> dict[str, Any]:
        """Release a finished rollout and say what it is for the trainer: ``fresh`` (accepted), ``withheld`` (stale,
        returned for the group baseline only), ``dropped`` (stale, not returned) or ``failed`` (error, timeout,
        cancelled: rejected). ``versions``: the per-token versions (``-1`` on env tokens), for the token bound."""
        with self._lock:
            if lease.released:
                return lease.verdict
            v = self.version
            lag = v - lease.dispatch_version
            old = stale_tokens(list(versions or []), v, self.token_max_staleness)
            all_old = bool(old) and len(old) >= sum(1 for x in versions or [] if x >= 0)  # nothing left to train
            stale = lease.stale or is_stale(lag, self.max_staleness) or all_old
            if stale and self.mode == "drop":
                verdict = "dropped"
            elif not ok:
                verdict = "failed"
            elif all_old or (stale and self.mode == "withhold"):
                verdict = "withheld"
            else:  # pace: a straggler past eta is still accepted (AReaL); its lag is in the verdict
                verdict = "fresh"
            self._release(lease, accepted=verdict == "fresh")
            if verdict == "fresh":
                self.counts["masked_tokens"] += len(old)
            else:
                self.counts[verdict] += 1
            lease.verdict = {"verdict": verdict, "dispatch_version": lease.dispatch_version, "version": v, "lag": lag,
                             "max_staleness": self.max_staleness, "mode": self.mode,
                             "stale_tokens": len(old), "trainable_from": (old[-1] + 1) if old else 0}
            return lease.verdict

    def cancel(self, lease: Lease) -> None:
        """Release a lease whose rollout never produced anything (refused after admission, stopped): rejected."""
        with self._lock:
            if not lease.released:
                lease.verdict = {"verdict": "failed", "dispatch_version": lease.dispatch_version,
                                 "version": self.version, "lag": self.version - lease.dispatch_version}
                self._release(lease, accepted=False)

    def _release(self, lease: Lease, *, accepted: bool) -> None:
        lease.released = True
        self.running.pop(lease.id, None)
        if lease in self.granted:
            self.granted.remove(lease)
        self.counts["accepted" if accepted else "rejected"] += 1
        self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for loop, fut in waiters:
            loop.call_soon_threadsafe(_set, fut)
        self._lock.notify_all()

    def _refusal(self, waited_s: bool = False) -> str:
        s = self.status()
        why = (f"no capacity: version {s['version']}, running {s['running']}, accepted {s['accepted']}, "
               f"max_staleness {s['max_staleness']}, batch {s['local_batch_size']}, max_concurrent "
               f"{s['local_max_concurrent']}")
        return why + (f" (waited {self.admission_timeout_s:g} s; the trainer must report a newer version: POST "
                      "/staleness/report {\"version\": v})" if waited_s else "")


def _set(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
