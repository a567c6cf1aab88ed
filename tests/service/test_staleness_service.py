"""The rollout service admits every job through its staleness gate (envhub.rollout.staleness): ``/process`` jobs,
DAPO's oversampled and carried groups (they are jobs) -- none runs beyond capacity (AReaL#1481); stale work is
dropped (cancelled where it stands) or withheld (returned marked, its reward kept) as the mode says. Real service
on loopback, golden backend, the real client and DAPO collector."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from test_client import coin_prompts

from envhub.rollout import staleness as st
from envhub.service.service import RolloutService
from envhub.training import DAPOCollector, RolloutClient

pytestmark = pytest.mark.timeout(180)


def slow(n: int, run_s: float = 0.4, turns: int = 1) -> dict:
    return {"env_id": "svc-slow", "task": {"task_id": f"slow-{n}", "n": n, "run_s": run_s, "turns": turns}}


def live_jobs(srv) -> int:
    """Jobs in the pipeline that will run (a job cancelled while it waited for admission passes through cancelled)."""
    return sum(not j.discarded for j in list(srv.service.pipeline.jobs.values()))


async def peak_running(srv, body: dict, n_jobs: int, versions: int) -> tuple[int, list]:
    """Configure the gate, send ``n_jobs`` jobs at once, report a new version each time the jobs of the last one
    finished; returns the most jobs the *pipeline* (not the gate) ever held at once, and the replies."""
    httpx.post(srv.url + "/staleness", json=body, timeout=10).raise_for_status()
    peak = 0
    async with RolloutClient(srv.url) as c:
        jobs = [asyncio.ensure_future(c.process(slow(i), raw=True)) for i in range(n_jobs)]
        version = 0
        while not all(j.done() for j in jobs):
            peak = max(peak, live_jobs(srv))
            gate = srv.service.gate.status()
            if gate["running"] == 0 and gate["capacity"] == 0 and version < versions:
                version += 1
                await c.report_staleness(version=version, consumed=body["batch_size"])
            await asyncio.sleep(0.02)
        return peak, [j.result() for j in jobs]


async def test_no_job_runs_beyond_capacity(serve):
    srv = serve(run_workers=8)
    peak, replies = await peak_running(srv, {"max_staleness": 0, "batch_size": 2}, n_jobs=6, versions=3)
    assert peak <= 2
    assert all(r["critical_error"] is None and r["details"]["staleness"]["verdict"] == "fresh" for r in replies)
    assert sorted(r["details"]["staleness"]["dispatch_version"] for r in replies) == [0, 0, 1, 1, 2, 2]
    status = httpx.get(srv.url + "/status", timeout=10).json()["staleness"]
    assert (status["accepted"], status["running"], status["waited"]) == (6, 0, 4)


async def test_a_job_path_that_skips_the_gate_is_caught(serve, monkeypatch):
    async def no_admission(self, job_id, episode, instance):
        return None

    monkeypatch.setattr(RolloutService, "_admit", no_admission)
    srv = serve(run_workers=8)
    peak, _ = await peak_running(srv, {"max_staleness": 0, "batch_size": 2}, n_jobs=6, versions=3)
    assert peak > 2  # what the test above rules out


@pytest.mark.slow
async def test_dapo_oversampling_stays_within_capacity_and_reports_its_discards(serve):
    """DAPO submits max_inflight = 32 jobs at once against a gate with room for 8 (eta 0, B 8 = two groups of 4):
    the server runs at most 8; zero-variance groups are reported as discarded, so the gate never fills with samples
    nobody trains (which would leave the trainer waiting on a gate at capacity 0)."""
    srv = serve(run_workers=16)
    httpx.post(srv.url + "/staleness", json={"max_staleness": 0, "batch_size": 8}, timeout=10).raise_for_status()
    peak, stop = [0], asyncio.Event()

    async def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], srv.service.gate.status()["running"], live_jobs(srv))
            await asyncio.sleep(0.01)

    watcher = asyncio.ensure_future(watch())
    async with RolloutClient(srv.url) as c:
        dapo = DAPOCollector(c, coin_prompts(400, solved_first=3, run_s=0.05), group_size=4, max_inflight=32,
                             carry_groups=0)
        for version in range(3):
            groups = await asyncio.wait_for(dapo.collect(2, policy_version=version), 60)
            assert len(groups) == 2 and all(g.informative and all(g.trainable) for g in groups)
        await dapo.close()
    stop.set()
    await watcher
    assert peak[0] <= 8
    assert dapo.stats["zero_variance"] >= 3 and dapo.stats["discarded"] >= 12
    gate = srv.service.gate.status()
    assert gate["discarded"] == dapo.stats["discarded"] and gate["running"] == 0


async def test_drop_mode_cancels_a_job_once_it_is_stale(serve):
    srv = serve(run_workers=4)
    httpx.post(srv.url + "/staleness", json={"max_staleness": 0, "batch_size": 1, "mode": "drop"}, timeout=10)
    async with RolloutClient(srv.url) as c:
        job = asyncio.ensure_future(c.process(slow(1, run_s=1.0, turns=20), raw=True))  # ~20 s if left alone
        while srv.service.gate.status()["running"] == 0:
            await asyncio.sleep(0.02)
        t0 = time.monotonic()
        await c.report_staleness(version=1)
        reply = await asyncio.wait_for(job, 15)
    assert time.monotonic() - t0 < 5
    assert reply["finish_reason"] == "cancelled" and reply["filter"] is True
    assert reply["details"]["staleness"]["verdict"] == "dropped" and "stale" in reply["error"]
    gate = srv.service.gate.status()
    assert (gate["dropped"], gate["stale_cancelled"], gate["running"]) == (1, 1, 0)


async def test_drop_mode_without_its_staleness_test_lets_stale_jobs_run(serve, monkeypatch):
    monkeypatch.setattr(st, "is_stale", lambda lag, eta: False)
    srv = serve(run_workers=4)
    httpx.post(srv.url + "/staleness", json={"max_staleness": 0, "batch_size": 1, "mode": "drop"}, timeout=10)
    async with RolloutClient(srv.url) as c:
        job = asyncio.ensure_future(c.process(slow(1, run_s=0.5, turns=6), raw=True))
        while srv.service.gate.status()["running"] == 0:
            await asyncio.sleep(0.02)
        await c.report_staleness(version=1)
        reply = await asyncio.wait_for(job, 30)
    assert reply["finish_reason"] != "cancelled"  # the test above requires it cancelled


async def test_withhold_mode_returns_stale_work_marked_with_its_reward(serve):
    srv = serve(run_workers=4)
    httpx.post(srv.url + "/staleness", json={"max_staleness": 0, "batch_size": 1, "mode": "withhold"}, timeout=10)
    async with RolloutClient(srv.url) as c:
        job = asyncio.ensure_future(c.process(slow(3, run_s=0.5), raw=True))
        while srv.service.gate.status()["running"] == 0:
            await asyncio.sleep(0.02)
        await c.report_staleness(version=1)
        reply = await asyncio.wait_for(job, 30)
        traj = await c.process(slow(4, run_s=0.0))  # fresh: dispatched at version 1
    assert reply["finish_reason"] == "done" and reply["reward"] == 1.0 and reply["critical_error"] is None
    assert reply["filter"] is True and reply["details"]["staleness"]["verdict"] == "withheld"
    assert traj.details["filter"] is False and traj.details["staleness"]["verdict"] == "fresh"
    gate = srv.service.gate.status()
    assert (gate["withheld"], gate["accepted"], gate["running"]) == (1, 2, 0)  # 1 = the v=1 floor, + the fresh one


async def test_waiting_for_capacity_is_bounded_and_cancellable(serve):
    srv = serve(run_workers=4)
    httpx.post(srv.url + "/staleness", json={"max_staleness": 0, "batch_size": 1, "admission_timeout_s": 0.5},
               timeout=10)
    async with RolloutClient(srv.url) as c:
        first = await c.process(slow(1, run_s=0.0), raw=True)
        assert first["critical_error"] is None
        t0 = time.monotonic()
        r = httpx.post(srv.url + "/process", json={"instance": slow(2, run_s=0.0)}, timeout=30)
        assert r.status_code == 429 and "report a newer version" in r.json()["detail"]
        assert 0.4 < time.monotonic() - t0 < 10
        httpx.post(srv.url + "/staleness", json={"admission_timeout_s": 60}, timeout=10)
        waiting = asyncio.ensure_future(c.process(slow(3, run_s=0.0), job_id="waits", raw=True))
        while srv.service.gate.status()["waited"] < 2:
            await asyncio.sleep(0.02)
        assert await c.cancel("waits")
        reply = await asyncio.wait_for(waiting, 15)
    assert reply["finish_reason"] == "cancelled"
    gate = srv.service.gate.status()
    assert (gate["running"], gate["admitted"]) == (0, 1)  # the cancelled job never took a slot


async def test_bad_gate_requests_are_refused_and_change_nothing(serve):
    srv = serve()
    httpx.post(srv.url + "/staleness", json={"max_staleness": 1, "batch_size": 4}, timeout=10).raise_for_status()
    before = httpx.get(srv.url + "/staleness", timeout=10).json()
    for path, body in (("/staleness", {"mode": "skip"}), ("/staleness", {"batch_size": 0}),
                       ("/staleness", {"eta": 1}), ("/staleness/report", {"version": -1}),
                       ("/staleness/report", {"discarded": 5})):
        r = httpx.post(srv.url + path, json=body, timeout=10)
        assert r.status_code == 400 and r.json()["detail"], (path, body, r.text)
    assert httpx.post(srv.url + "/staleness/report", json={"version": 3}, timeout=10).json()["version"] == 3
    r = httpx.post(srv.url + "/staleness/report", json={"version": 2}, timeout=10)
    assert r.status_code == 400 and "backwards" in r.json()["detail"]
    after = httpx.get(srv.url + "/staleness", timeout=10).json()
    assert {k: v for k, v in after.items() if k not in ("version", "accepted", "recovered", "capacity")} == \
        {k: v for k, v in before.items() if k not in ("version", "accepted", "recovered", "capacity")}


@pytest.mark.slow
async def test_dapo_without_its_discard_reports_stalls_on_a_full_gate(serve, monkeypatch):
    """The reason the collector reports discards: without them the two zero-variance groups it was admitted first
    fill the budget (eta 0, B 8) with samples nobody trains, and the trainer waits on a gate at capacity 0."""
    monkeypatch.setattr(DAPOCollector, "_discard", lambda self, outcomes: None)
    srv = serve(run_workers=16)
    httpx.post(srv.url + "/staleness", json={"max_staleness": 0, "batch_size": 8}, timeout=10).raise_for_status()
    async with RolloutClient(srv.url) as c:
        dapo = DAPOCollector(c, coin_prompts(400, solved_first=3, run_s=0.05), group_size=4, max_inflight=32,
                             carry_groups=0)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(dapo.collect(2, policy_version=0), 8)
        gate = srv.service.gate.status()
        assert gate["capacity"] == 0 and gate["running"] == 0 and gate["accepted"] == 8
        await dapo.close()


def test_withheld_members_stay_in_the_group_baseline_and_out_of_training():
    """prime-rl#2960: a member the gate withheld keeps its reward in the group (the baseline the fresh members'
    advantages are computed against) and is not trained on."""
    from envhub.rollout.trajectory import Trajectory
    from envhub.training.advantages import grpo_advantages
    from envhub.training.dapo import Group

    rewards = [1.0, 0.0, 0.0, 1.0]
    verdicts = ["fresh", "withheld", "fresh", "fresh"]
    trajs = [Trajectory("e", "t", reward=r, details={"staleness": {"verdict": v}}) for r, v in zip(rewards, verdicts)]
    group = Group("g", {}, trajs)
    assert group.rewards == rewards and group.informative
    assert group.trainable == [True, False, True, True]
    adv = grpo_advantages(group.rewards, group_size=4)
    fresh_only = grpo_advantages([r for r, k in zip(rewards, group.trainable) if k], group_size=3)
    trained = [a for a, k in zip(adv, group.trainable) if k]
    assert trained == grpo_advantages(rewards, group_size=4)[:1] + grpo_advantages(rewards, group_size=4)[2:]
    assert trained != fresh_only  # the baseline really differs without the withheld reward
