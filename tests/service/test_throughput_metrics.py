"""Throughput metrics (issue #26 point 1): a real service on loopback, real bwrap sandboxes (``svc-hold``), a golden
player behind a long-tailed model latency, and a simulated trainer. ``/status.bound`` names the right side at three
consumption rates with idle ratios within 5 points of the simulation's own logs; each metric moves when its cause is
injected and stays put otherwise; ``GET /metrics`` is read with prometheus_client's own parser; and switching a
metric's update off makes its check fail."""
from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import svc_plugins
from tp_helpers import LatencyGolden, hold, mean_of, scrape, simulate, value

from envhub.rollout.throughput import Throughput

# the figures are timings (idle ratios within 5 points, a queue that must form): measured alone, not beside 3 other
# test workers on 2 cores (make test runs `serial` tests after the parallel ones)
pytestmark = [pytest.mark.timeout(240), pytest.mark.serial]
WINDOW = 6.0  # the service's metrics window = the simulation's measured span


def service(serve, backend=None, **kw):
    kw.setdefault("sandbox_pool", 4)
    kw.setdefault("run_workers", 8)
    return serve(backends=[backend or LatencyGolden()], **kw)


# ---- the simulated trainer at 0.5x, 1x, 2x production -------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_bound_names_the_right_side_and_idle_ratios_match_the_simulation(serve):
    seen, rates = {}, {}
    for factor, side in ((0.5, "trainer"), (1.0, "balanced"), (2.0, "generator")):
        out = await simulate(service(serve, metrics_window_s=WINDOW).url, factor=factor, window_s=WINDOW)
        bound, tp = out["status"]["bound"], out["status"]["throughput"]
        seen[factor] = (bound["side"], round(out["production"], 2), bound["ratio"], {k: (round(tp[k], 3), round(v, 3))
                                                        for k, v in out["truth"].items()})
        assert bound["side"] == side, (factor, bound, seen)
        for key, truth in out["truth"].items():
            assert abs(tp[key] - truth) <= 0.05, (factor, key, tp[key], truth, seen)
        rates[factor] = tp
    print(seen)
    # a slow trainer moves consumption down and the generator's idle ratio up; a fast one the trainer's idle up
    assert rates[0.5]["consumption_rate"] < rates[1.0]["consumption_rate"] < 1.5 * rates[2.0]["consumption_rate"]
    assert rates[0.5]["generator_idle_ratio"] > 0.2 > rates[2.0]["generator_idle_ratio"]
    assert rates[2.0]["trainer_idle_ratio"] > 0.2 > rates[0.5]["trainer_idle_ratio"]


# ---- each metric moves when its cause is injected, and stays put otherwise ----------------------------------------
async def run_jobs(url: str, jobs: list[dict], during: Any = None) -> list[dict]:
    """Send ``jobs`` at once; ``during(client)`` runs while they are in flight. Returns the replies."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        tasks = [asyncio.ensure_future(client.post("/process", json=j)) for j in jobs]
        extra = await during(client) if during is not None else None
        replies = [(await t).json() for t in tasks]
    return replies if extra is None else (replies, extra)


async def tool_and_model_means(serve, sleep: float) -> dict[str, float]:
    srv = service(serve)
    replies = await run_jobs(srv.url, [hold(i, sleep) for i in range(3)])
    assert all(r["critical_error"] is None for r in replies), replies
    fams = scrape(srv.url)
    out = {s: mean_of(fams, "envhub_stage_seconds", stage=s) for s in ("tool_call", "model_call", "init", "eval")}
    out["tool_total"] = value(fams, "envhub_stage_seconds_sum", stage="tool_call")
    return out


async def test_a_slow_tool_moves_the_tool_call_histogram_and_nothing_else(serve):
    fast, slow = await tool_and_model_means(serve, 0.0), await tool_and_model_means(serve, 1.5)
    # three jobs each sleep 1.5 s in their bash call: ~4.5 s more tool time (a sandbox's first shell start varies)
    assert slow["tool_total"] - fast["tool_total"] >= 3.0, (fast, slow)
    assert fast["tool_call"] < 0.5, fast
    assert abs(slow["model_call"] - fast["model_call"]) < 0.1, (fast, slow)  # the model did not change


class NoRuntime(svc_plugins.SandboxEnv):
    def sandbox_spec_for(self, task):
        from envhub.sandbox import SandboxSpec

        return SandboxSpec(runtime="no-such-runtime", memory_mb=512, max_procs=64, timeout_s=60)


@pytest.fixture(scope="module", autouse=True)
def _no_runtime_env():
    from envhub import EnvSpec
    from envhub.plugins import default_hub

    spec = EnvSpec(id="svc-no-runtime", env=NoRuntime, tasks=svc_plugins._rows("nr", sleep=0),
                   verifier=svc_plugins.SlowVerifier(), golden=svc_plugins._sandbox_golden, max_turns=4)
    if spec.id not in default_hub().specs:
        default_hub().register(spec, source="tests/service/test_throughput_metrics.py")


async def sandbox_failures(serve, env_id: str) -> tuple[dict, dict]:
    srv = service(serve)
    jobs = [{"instance": {"env_id": env_id, "task": {"task_id": f"x-{i}", "n": i, "sleep": 0}}} for i in range(3)]
    replies = await run_jobs(srv.url, jobs)
    return scrape(srv.url), replies


async def test_a_failing_sandbox_runtime_counts_init_failures_by_cause(serve):
    fams, replies = await sandbox_failures(serve, "svc-no-runtime")
    assert all(r["critical_error"] == "init" for r in replies), replies
    # one per job, and the prewarm pool (the spec repeats) fails its starts too
    assert value(fams, "envhub_sandbox_init_failures_total", cause="runtime_unavailable") >= 3
    assert value(fams, "envhub_rollouts_finished_total", outcome="error") == 3
    fams, replies = await sandbox_failures(serve, "svc-hold")  # a working runtime: nothing counted
    assert all(r["critical_error"] is None for r in replies), replies
    assert not fams["envhub_sandbox_init_failures"].samples
    assert value(fams, "envhub_sandboxes_limit") > 0


async def backend_load(serve, slots: int | None) -> tuple[float, float, dict]:
    backend = LatencyGolden(0.15, 0.1, slots=slots)
    srv = service(serve, backend)

    async def peak(client):
        seen = [0.0, 0.0]
        for _ in range(30):
            fams = scrape(srv.url)
            seen = [max(seen[0], sum(s.value for s in fams["envhub_backend_waiting"].samples)),
                    max(seen[1], sum(s.value for s in fams["envhub_backend_in_flight"].samples))]
            await asyncio.sleep(0.05)
        return seen

    replies, (waiting, in_flight) = await run_jobs(srv.url, [hold(i) for i in range(4)], peak)
    assert all(r["critical_error"] is None for r in replies), replies
    return waiting, in_flight, scrape(srv.url)


async def test_a_backend_that_queues_shows_its_queue_depth(serve):
    waiting, in_flight, fams = await backend_load(serve, slots=1)
    assert waiting >= 2 and in_flight >= 3, (waiting, in_flight)
    tokens = fams["envhub_backend_tokens"].samples
    assert tokens and all(s.value > 0 for s in tokens)
    waiting, in_flight, _ = await backend_load(serve, slots=None)  # same load, no queue in the backend
    assert waiting == 0 and in_flight >= 2, (waiting, in_flight)


async def test_staleness_oversampling_and_partial_rollouts(serve):
    """A version reported while jobs run makes them one version stale at hand-over (per sample and per token); a
    weight update between two model calls makes a partial rollout (span 1); a cancel is wasted compute; the trainer's
    reported discards lower acceptance. Without those causes each figure stays at zero."""
    async def calm(client):
        await asyncio.sleep(0.1)
        return None

    srv = service(serve, LatencyGolden(0.3, 0.05))
    await run_jobs(srv.url, [hold(i) for i in range(2)], calm)
    fams = scrape(srv.url)
    assert value(fams, "envhub_staleness_versions_sum", unit="sample") == 0
    assert value(fams, "envhub_staleness_versions_count", unit="token") > 0
    assert value(fams, "envhub_staleness_versions_sum", unit="token") == 0
    assert value(fams, "envhub_partial_rollouts_total") == 0
    assert not fams["envhub_rollout_wasted_seconds"].samples
    assert value(fams, "envhub_acceptance") == 1.0

    backend = LatencyGolden(0.3, 0.05, hold_first=True)
    srv = service(serve, backend)

    async def update_and_cancel(client):
        while len(backend.sessions) < 3:  # every job is inside its first model call, held there
            await asyncio.sleep(0.01)
        backend.release.set()
        (await client.post("/pause", json={"mode": "hold"})).raise_for_status()
        (await client.post("/resume", json={"version": 1})).raise_for_status()
        (await client.post("/staleness/report", json={"version": 1})).raise_for_status()
        (await client.post("/cancel", json={"job_id": "doomed"})).raise_for_status()
        return None

    jobs = [hold(i) for i in range(2)] + [{**hold(9), "job_id": "doomed"}]
    replies = await run_jobs(srv.url, jobs, update_and_cancel)
    assert [r["finish_reason"] for r in replies] == ["done", "done", "cancelled"], replies
    (httpx.post(srv.url + "/staleness/report", json={"discarded": 1}, timeout=10)).raise_for_status()
    fams = scrape(srv.url)
    assert value(fams, "envhub_staleness_versions_sum", unit="sample") == 2  # two jobs, one version behind each
    lag = value(fams, "envhub_staleness_versions_sum", unit="token")
    assert 0 < lag < value(fams, "envhub_staleness_versions_count", unit="token")  # the later tokens are fresh
    assert value(fams, "envhub_partial_rollouts_total") == 2
    assert value(fams, "envhub_partial_span_versions_sum", kind="partial") == 2
    assert value(fams, "envhub_rollout_wasted_seconds_total", outcome="cancelled") > 0
    assert value(fams, "envhub_rollouts_finished_total", outcome="cancelled") == 1
    assert value(fams, "envhub_trainer_discarded_total") == 1
    assert value(fams, "envhub_acceptance") == 0.5  # 2 produced, 1 discarded by the trainer


async def test_trainer_step_reports_are_checked_and_bad_ones_change_nothing(serve):
    srv = service(serve)
    for body in ({"phase": "middle"}, {"phase": "end", "samples": -1}, {"phase": "end", "samples": "4"},
                 {"phase": "begin", "extra": 1}, {}):
        r = httpx.post(srv.url + "/trainer/step", json=body, timeout=10)
        assert r.status_code == 422, (body, r.text)
        assert r.json()["detail"]
    assert srv.service.metrics.totals == {"steps": 0, "consumed": 0, "discarded": 0, "step_reports": 0}
    from envhub.training import RolloutClient

    async with RolloutClient(srv.url) as c:
        await c.trainer_step("begin")
        (out,) = await c.trainer_step("end", samples=8)
    assert out == {"phase": "end", "steps": 1, "consumed": 8}
    fams = scrape(srv.url)
    assert value(fams, "envhub_trainer_steps_total") == 1 and value(fams, "envhub_trainer_consumed_total") == 8
    assert httpx.get(srv.url + "/status", timeout=10).json()["bound"]["bound"] == "unknown"  # too little data


async def test_every_server_has_its_own_registry(serve):
    """Two servers in one process: each /metrics shows its own figures (a shared global registry would mix them or
    refuse the second registration)."""
    a, b = service(serve), service(serve)
    await run_jobs(a.url, [hold(0)])
    assert value(scrape(a.url), "envhub_rollouts_finished_total", outcome="accepted") == 1
    assert value(scrape(b.url), "envhub_rollouts_finished_total", outcome="accepted") == 0


# ---- break it on purpose: with a metric's update switched off, its check fails ------------------------------------
@pytest.mark.parametrize("hook,check", [
    ("tool_call", "test_a_slow_tool_moves_the_tool_call_histogram_and_nothing_else"),
    ("sandbox_failed", "test_a_failing_sandbox_runtime_counts_init_failures_by_cause"),
    ("model_call", "test_a_backend_that_queues_shows_its_queue_depth"),
    ("job_finished", "test_staleness_oversampling_and_partial_rollouts"),
    ("discarded", "test_staleness_oversampling_and_partial_rollouts"),
    ("trainer_step", "test_trainer_step_reports_are_checked_and_bad_ones_change_nothing"),
    ("job_left", "test_bound_arithmetic_on_exact_timelines"),
    ("job_started", "test_bound_arithmetic_on_exact_timelines"),
])
async def test_a_metric_whose_update_is_switched_off_fails_its_check(serve, monkeypatch, hook, check):
    original = getattr(Throughput, hook)

    def off(self, *a, **k):
        return None

    monkeypatch.setattr(Throughput, hook, off)
    check_fn = globals()[check]
    with pytest.raises(AssertionError):
        if asyncio.iscoroutinefunction(check_fn):
            await check_fn(serve)
        else:
            check_fn()
    monkeypatch.setattr(Throughput, hook, original)


# ---- the arithmetic, on a clock the test holds -------------------------------------------------------------------
class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def scripted_run(trainer_step_s: float, gap_s: float, *, rollout_s: float = 1.0, concurrency: int = 4,
                 gen_gap_s: float = 0.0, sandbox_wait: bool = False, failures: int = 0,
                 call_share: float = 0.2) -> dict:
    """Waves of ``concurrency`` rollouts of ``rollout_s``, ``gen_gap_s`` apart, for 20 s; a trainer stepping
    ``trainer_step_s`` with ``gap_s`` idle between steps, 4 samples each. Exact idle ratios: the trainer's
    ``gap / (step + gap)``, the generator's ``gen_gap / (rollout + gen_gap)``."""
    clock = Clock()
    t = Throughput(window_s=20.0, clock=clock)
    t0 = clock.t
    events = []
    wave = rollout_s + gen_gap_s
    for k in range(int(20 / wave)):
        for _ in range(concurrency):
            events.append((t0 + k * wave, "start"))
            events.append((t0 + k * wave + rollout_s - 1e-6, "finish"))
    s = t0
    while s < t0 + 20:
        events.append((s, "begin"))
        events.append((s + trainer_step_s, "end"))
        s += trainer_step_s + gap_s
    order = {"finish": 0, "end": 1, "start": 2, "begin": 3}  # at one instant: what ends goes first
    for when, what in sorted(events, key=lambda e: (e[0], order[e[1]])):
        clock.t = when
        if what == "start":
            t.job_started()
            if sandbox_wait:
                t.sandbox_waiting(+1)
        elif what == "finish":
            if sandbox_wait:
                t.sandbox_waiting(-1)
            t.model_call("vllm-a", call_share * rollout_s, 10)
            t.job_finished({"finish_reason": "done", "details": {}}, {"init": 0.0, "run": rollout_s, "eval": 0.0,
                                                                      "others": 0.0})
            t.job_left()
        else:
            t.trainer_step(what, 4 if what == "end" else None)
    for _ in range(failures):
        t.sandbox_failed("runtime_unavailable")
    clock.t = t0 + 20
    return t.snapshot()


def test_bound_arithmetic_on_exact_timelines():
    # the trainer eats 2/s without a pause; the generator could make 4/s and is held back half the time
    slow_trainer = scripted_run(trainer_step_s=2.0, gap_s=0.0, gen_gap_s=1.0)
    assert slow_trainer["bound"]["side"] == "trainer", slow_trainer["bound"]
    assert slow_trainer["trainer_idle_ratio"] < 0.01
    assert slow_trainer["generator_idle_ratio"] == pytest.approx(0.5, abs=0.01)
    assert slow_trainer["trainer_capacity"] == pytest.approx(2.0)
    assert slow_trainer["generator_capacity"] == pytest.approx(4.0, rel=0.01)
    fast = scripted_run(trainer_step_s=0.5, gap_s=0.5)  # waits half the time
    assert fast["trainer_idle_ratio"] == pytest.approx(0.5, abs=0.01)
    assert fast["bound"]["side"] == "generator" and fast["bound"]["bound"] == "generator", fast["bound"]
    assert scripted_run(0.5, 0.5, call_share=0.8)["bound"]["bound"] == "backend:vllm-a"
    assert scripted_run(0.5, 0.5, sandbox_wait=True)["bound"]["bound"] == "sandboxes"
    assert scripted_run(0.5, 0.5, failures=30)["bound"]["bound"] == "sandboxes"
    matched = scripted_run(trainer_step_s=1.0, gap_s=0.0)
    assert matched["bound"]["side"] == "balanced", matched["bound"]
    assert matched["bound"]["bound"] == "balanced", matched["bound"]
    # a synchronous schedule: each side idle 75 % waiting for the other, capacities matched (4/s and 4/s)
    serial = scripted_run(1.0, 3.0, gen_gap_s=3.0)["bound"]
    assert (serial["side"], serial["bound"]) == ("balanced", "serialized"), serial
    # both wait (a tight staleness bound): the capacities decide
    assert scripted_run(0.5, 0.5, gen_gap_s=1.0)["bound"]["side"] == "generator"  # 8/s vs 4/s
    assert scripted_run(4.0, 1.0, gen_gap_s=1.0)["bound"]["side"] == "trainer"  # 1/s vs 4/s
    assert Throughput().snapshot()["bound"]["bound"] == "unknown"
