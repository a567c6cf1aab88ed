"""The staleness gate (envhub.rollout.staleness): AReaL's capacity rule, the stale-work modes, and regressions for
the failures AReaL's users reported (#1388 burst after restart, #1396 capacity 0 across replicas, #602 token age).

Each rule is checked by a function that returns what it found wrong; every test also breaks the rule on purpose
(monkeypatching the one function the gate uses for it) and shows the same check then finds something.
"""
from __future__ import annotations

import asyncio
import heapq
import random
import threading

import pytest

from envhub.rollout import staleness as st
from envhub.rollout.staleness import GateError, NoCapacity, StalenessGate

pytestmark = pytest.mark.timeout(120)


def simulate(eta: int, B: int, *, mode: str = "pace", max_concurrent: int | None = None, steps: int = 30,
             seed: int = 0, sigma: float = 1.5) -> dict:
    """A trainer consuming ``B`` samples per step (train time 1.0, then version + 1) fed by a generator that keeps
    the gate full, rollout times lognormal(0, sigma). Event-driven: no real time. Returns what broke the rule and
    the lag of every consumed sample."""
    rng = random.Random(seed)
    gate = StalenessGate(max_staleness=eta, batch_size=B, max_concurrent=max_concurrent, mode=mode)
    events: list = []          # (time, seq, kind, payload)
    seq = iter(range(10**9))
    ready: list = []           # finished, accepted samples (FIFO)
    cancelled: set = set()
    over, lags, now, trainer_busy = [], [], 0.0, False

    def on_stale(lease):       # drop mode: the rollout is cancelled where it stands
        cancelled.add(lease.id)
        gate.finish(lease, ok=False)

    def fill():
        while True:
            lease = gate.try_acquire(on_stale=on_stale)
            if lease is None:
                return
            s = gate.status()  # the rule, recomputed here from the counters, not from the gate's own formula
            if s["accepted"] + s["running"] > (eta + gate.version + 1) * B:
                over.append(("staleness", dict(s)))
            if max_concurrent is not None and s["running"] > max_concurrent:
                over.append(("concurrency", dict(s)))
            heapq.heappush(events, (now + rng.lognormvariate(0, sigma), next(seq), "done", lease))

    def train():
        nonlocal trainer_busy
        if mode != "pace":  # the trainer re-judges what waited in its queue, and gives back what it will not train
            stale = [lease for lease in ready if gate.judge(lease.dispatch_version) != "fresh"]
            if stale:
                ready[:] = [lease for lease in ready if lease not in stale]
                gate.report(discarded=len(stale))
        if not trainer_busy and len(ready) >= B:
            batch = [ready.pop(0) for _ in range(B)]
            lags.extend(gate.version - lease.dispatch_version for lease in batch)
            trainer_busy = True
            heapq.heappush(events, (now + 1.0, next(seq), "trained", None))

    fill()
    while gate.version < steps:
        assert events, f"stuck at capacity {gate.capacity()} with the trainer waiting: {gate.status()}"
        now, _, kind, lease = heapq.heappop(events)
        if kind == "done" and lease.id not in cancelled:
            if gate.finish(lease, ok=True)["verdict"] == "fresh":
                ready.append(lease)
        elif kind == "trained":
            trainer_busy = False
            gate.report(version=gate.version + 1, consumed=B)
        train()
        fill()
    return {"over": over, "lags": lags, "status": gate.status()}


# ---- the capacity rule ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("eta", [0, 1, 2, 4])
def test_admission_never_exceeds_the_rule(eta):
    out = simulate(eta, B=8, max_concurrent=24)
    assert out["over"] == []
    assert out["status"]["admitted"] > 30 * 8


def test_an_off_by_one_rule_is_caught(monkeypatch):
    real = st.capacity
    monkeypatch.setattr(st, "capacity", lambda *a: None if real(*a) is None else real(*a) + 1)
    assert simulate(1, B=8, max_concurrent=24)["over"] != []


def test_drop_mode_trains_nothing_older_than_eta():
    for eta in (0, 1, 2):
        out = simulate(eta, B=8, mode="drop", seed=eta)
        assert out["lags"] and max(out["lags"]) <= eta
        # eta = 0: the rule alone keeps every lag at 0 (the trainer cannot move on while a sample of its batch
        # runs); above, the lognormal tail really produced stragglers for the drop to catch
        assert (out["status"]["dropped"] > 0) == (eta > 0)


def test_drop_mode_without_its_staleness_test_trains_older_samples(monkeypatch):
    monkeypatch.setattr(st, "is_stale", lambda lag, eta: eta is not None and lag > eta + 3)
    assert max(simulate(1, B=8, mode="drop", seed=1)["lags"]) > 1


def test_pace_mode_keeps_stragglers_and_reports_their_lag():
    """AReaL's behaviour: admission is paced, a late result is still trained (its lag is recorded)."""
    out = simulate(1, B=8, mode="pace", seed=1)
    assert out["status"]["dropped"] == out["status"]["withheld"] == 0
    assert max(out["lags"]) > 1  # the tail passes eta: what the drop/withhold modes and the token bound are for


def test_withhold_mode_returns_stale_work_marked_and_frees_its_slot():
    gate = StalenessGate(max_staleness=0, batch_size=2, mode="withhold")
    a, b = gate.try_acquire(), gate.try_acquire()
    assert gate.try_acquire() is None and gate.capacity() == 0
    assert gate.finish(a)["verdict"] == "fresh"
    gate.report(version=1)                     # b is now one version old, eta = 0
    verdict = gate.finish(b, ok=True)
    assert verdict["verdict"] == "withheld" and verdict["lag"] == 1
    s = gate.status()
    assert (s["accepted"], s["rejected"], s["withheld"]) == (2, 1, 1)  # 2 = the v*B floor; b is not accepted
    # b's slot was given back: the trainer at v=1 may receive 2 more
    assert s["capacity"] == 2


def test_withhold_without_its_staleness_test_trains_stale_work(monkeypatch):
    monkeypatch.setattr(st, "is_stale", lambda lag, eta: False)
    gate = StalenessGate(max_staleness=0, batch_size=1, mode="withhold")
    lease = gate.try_acquire()
    gate.report(version=3)
    assert gate.finish(lease)["verdict"] == "fresh"  # what the test above would reject


def test_drop_mode_cancels_in_flight_work_once_stale():
    gate = StalenessGate(max_staleness=1, batch_size=4, mode="drop")
    fired = []
    lease = gate.acquire_now(on_stale=fired.append)
    gate.report(version=1)
    assert fired == []
    gate.report(version=2)
    gate.report(version=3)
    assert fired == [lease]                     # once
    assert gate.finish(lease, ok=False)["verdict"] == "dropped"
    assert gate.finish(lease, ok=True)["verdict"] == "dropped"  # released once; a second finish changes nothing
    assert gate.status()["rejected"] == 1 and gate.status()["running"] == 0


# ---- AReaL#1388: no burst after a restart at a high version -----------------------------------------------------
def admitted_after_restart(version: int, eta: int, B: int) -> int:
    gate = StalenessGate(max_staleness=eta, batch_size=B)
    gate.report(version=version)               # the trainer, restarted from a checkpoint, reports where it is
    n = 0
    while gate.try_acquire() is not None:
        n += 1
    return n


def test_no_burst_after_a_restart_at_a_high_version():
    assert admitted_after_restart(50, eta=2, B=8) == 3 * 8
    assert StalenessGate(max_staleness=2, batch_size=8, version=50).capacity() == 3 * 8


def test_without_the_recovery_floor_a_restart_bursts(monkeypatch):
    monkeypatch.setattr(st, "accepted_floor", lambda version, batch: 0)
    assert admitted_after_restart(50, eta=2, B=8) == 53 * 8  # AReaL#1388: 53 batches at once


# ---- AReaL#1396: never stuck at capacity 0 across replicas ------------------------------------------------------
def replicas_run(B: int, R: int, eta: int = 0, steps: int = 6) -> str | None:
    """R replica gates (each told the global B and R), requests routed round-robin, to the next replica with room
    when the next in turn has none; the trainer takes B per version. Returns why it got stuck, or None."""
    gates = [StalenessGate(max_staleness=eta, batch_size=B, replicas=R, replica=i) for i in range(R)]
    running: list = []
    ready, nxt, version = 0, 0, 0
    while version < steps:
        r = nxt % R
        lease = gates[r].try_acquire()
        if lease is None:  # a router that sends work where there is room (RolloutClient: the least loaded)
            free = [i for i in range(R) if (gates[i].capacity() or 0) > 0]
            if free:
                r = free[0]
                lease = gates[r].try_acquire()
        if lease is not None:
            running.append((gates[r], lease))
            nxt = r + 1
            continue
        if running:                            # the oldest rollout finishes
            g, lease = running.pop(0)
            g.finish(lease)
            ready += 1
        elif ready < B:
            return f"stuck: capacities {[g.capacity() for g in gates]}, {ready} of {B} samples ready"
        if ready >= B:
            ready -= B
            version += 1
            for g in gates:
                g.report(version=version)
    return None


def test_replica_shares_cover_the_batch_and_none_is_zero():
    for total in range(1, 20):
        for R in range(1, 9):
            parts = [st.share(total, R, i) for i in range(R)]
            assert min(parts) >= 1 and sum(parts) >= total and sum(parts) <= max(total, R)


@pytest.mark.parametrize("B,R", [(8, 4), (6, 4), (2, 4), (1, 8), (16, 3)])
def test_replicas_never_stall_the_trainer(B, R):
    assert replicas_run(B, R) is None


def test_dividing_by_the_replicas_without_the_floor_stalls(monkeypatch):
    monkeypatch.setattr(st, "share", lambda total, R, i: total // R)
    assert replicas_run(6, 4) is not None
    assert replicas_run(2, 4) is not None


# ---- AReaL#602: a per-token age bound -----------------------------------------------------------------------------
def test_token_bound_masks_exactly_the_tokens_older_than_k():
    rng = random.Random(0)
    gate = StalenessGate(max_staleness=8, batch_size=1, token_max_staleness=2)
    for trial in range(50):
        lease = gate.try_acquire() or pytest.fail("no capacity")
        v0 = gate.version
        versions: list[int] = []
        for _ in range(rng.randint(1, 5)):      # chunks of an interrupted generation, env tokens between them
            versions += [v0 + rng.randint(0, 3)] * rng.randint(1, 4) + [-1] * rng.randint(0, 2)
        versions = sorted(x for x in versions if x >= 0) if trial % 2 else versions
        gate.report(version=gate.version + rng.randint(0, 3))
        verdict = gate.finish(lease, versions=versions)
        old = [i for i, x in enumerate(versions) if x >= 0 and gate.version - x > 2]
        assert verdict["stale_tokens"] == len(old)
        if not old:
            assert verdict["trainable_from"] == 0
        else:
            assert verdict["trainable_from"] == old[-1] + 1
        n_model = sum(x >= 0 for x in versions)
        assert (verdict["verdict"] == "withheld") == (bool(old) and len(old) == n_model)
        gate.report(consumed=1)


def test_token_bound_switched_off_on_purpose_masks_nothing(monkeypatch):
    monkeypatch.setattr(st, "stale_tokens", lambda versions, v, k: [])
    gate = StalenessGate(max_staleness=8, batch_size=1, token_max_staleness=2)
    lease = gate.try_acquire()
    gate.report(version=5)
    verdict = gate.finish(lease, versions=[0, 0, -1, 5])
    assert verdict["stale_tokens"] == 0  # the test above expects 2


def test_a_rollout_with_only_old_tokens_is_stale_in_every_mode():
    for mode, expected in (("pace", "withheld"), ("withhold", "withheld"), ("drop", "dropped")):
        gate = StalenessGate(max_staleness=8, batch_size=1, token_max_staleness=1, mode=mode)
        lease = gate.try_acquire()
        gate.report(version=3)
        assert gate.finish(lease, versions=[-1, 0, 1, -1])["verdict"] == expected


# ---- grants (AReaL's /grant_capacity), waits, threads, bad input -------------------------------------------------
def test_grants_are_admissions_under_the_rule():
    gate = StalenessGate(max_staleness=0, batch_size=2)
    assert gate.grant() == 1 and gate.grant() == 2
    with pytest.raises(NoCapacity):
        gate.grant()
    assert gate.try_acquire() is None           # the grants hold the capacity
    lease = gate.claim()
    assert lease is not None and gate.status()["granted"] == 1
    with pytest.raises(NoCapacity):
        gate.grant(2)                           # all or nothing
    assert gate.status()["granted"] == 1 and gate.status()["running"] == 2


def group_fairness(gate_class=StalenessGate) -> list[str]:
    """A group of 4 waits for room; what went wrong for it: admitted in part, or overtaken by single rollouts that
    came after it (either way a gate could hold part of every group and complete none)."""
    wrong: list[str] = []

    async def main():
        gate = gate_class(max_staleness=0, batch_size=4)
        singles = [gate.acquire_now() for _ in range(3)]
        group = asyncio.ensure_future(gate.acquire_group(4))
        await asyncio.sleep(0.05)
        late = asyncio.ensure_future(gate.acquire(timeout_s=30))
        gate.finish(singles[0], ok=False)              # one slot opens: not enough for the group
        await asyncio.sleep(0.1)
        if gate.try_acquire() is not None or late.done():
            wrong.append("a single overtook the waiting group")
        if group.done():
            wrong.append("the group was admitted without room for all of it")
        for lease in singles[1:]:
            gate.finish(lease, ok=False)
        await asyncio.sleep(0.1)
        if not group.done():
            wrong.append("the group was not admitted once there was room")
        late.cancel()
        group.cancel()

    asyncio.run(main())
    return wrong


def test_groups_are_admitted_whole_and_in_arrival_order():
    assert group_fairness() == []

    async def too_big():
        with pytest.raises(GateError, match="never be admitted"):
            await StalenessGate(max_staleness=0, batch_size=4).acquire_group(5)

    asyncio.run(too_big())


def test_a_gate_without_its_queue_lets_singles_overtake_groups():
    class NoQueue(StalenessGate):
        def _take(self, n, kind, on_stale, ticket=None):
            queue, self._queue = self._queue, []
            try:
                return super()._take(n, kind, on_stale, ticket)
            finally:
                self._queue = queue

    assert "a single overtook the waiting group" in group_fairness(NoQueue)


def test_unbounded_gate_admits_everything_and_counts():
    gate = StalenessGate()
    leases = [gate.acquire_now() for _ in range(1000)]
    assert gate.capacity() is None and gate.status()["running"] == 1000
    for lease in leases:
        gate.finish(lease)
    assert gate.status()["accepted"] == 1000


def test_acquire_waits_for_the_trainer_then_goes_on():
    async def main():
        gate = StalenessGate(max_staleness=0, batch_size=1)
        first = gate.acquire_now()
        gate.finish(first)
        waiter = asyncio.ensure_future(gate.acquire(timeout_s=30))
        await asyncio.sleep(0.2)
        assert not waiter.done()
        # the trainer reports from another thread (an HTTP handler, a trainer loop): the waiter wakes at once
        threading.Thread(target=gate.report, kwargs={"version": 1}).start()
        lease = await asyncio.wait_for(waiter, 5)
        assert lease.dispatch_version == 1 and gate.status()["waited"] == 1
        with pytest.raises(NoCapacity, match="report a newer version"):
            await gate.acquire(timeout_s=0.2)
        gone = []
        task = asyncio.ensure_future(gate.acquire(timeout_s=30, abandon=lambda: bool(gone)))
        await asyncio.sleep(0.1)
        gone.append(1)
        assert await asyncio.wait_for(task, 5) is None  # given up: no lease taken
        assert gate.status()["running"] == 1

    asyncio.run(main())


def test_threads_racing_for_capacity_never_overshoot():
    gate = StalenessGate(max_staleness=1, batch_size=16, max_concurrent=8)
    peak, errors = [0], []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(400):
            lease = gate.try_acquire()
            if lease is None:
                continue
            with gate._lock:
                peak[0] = max(peak[0], len(gate.running))
            gate.finish(lease, ok=rng.random() < 0.8)

    def trainer() -> None:
        for v in range(1, 30):
            try:
                gate.report(version=v)
            except GateError as e:
                errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)] + [threading.Thread(target=trainer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = gate.status()
    assert errors == [] and peak[0] <= 8 and s["running"] == 0
    assert s["admitted"] == s["accepted"] + s["rejected"] - s["recovered"]


def test_bad_reports_and_configs_are_refused_and_change_nothing():
    gate = StalenessGate(max_staleness=1, batch_size=4)
    gate.report(version=3)
    before = gate.status()
    for bad in ({"version": 2}, {"version": -1}, {"discarded": 10**6}, {"consumed": "3"}, {"version": True}):
        with pytest.raises(GateError):
            gate.report(**bad)
    for bad in ({"mode": "skip"}, {"batch_size": 0}, {"max_concurrent": 0}, {"replicas": 2, "replica": 2},
                {"max_staleness": -1}, {"admission_timeout_s": "soon"}):
        with pytest.raises(GateError):
            gate.configure(**bad)
    assert gate.status() == before
