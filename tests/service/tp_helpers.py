"""Helpers for the throughput-metrics tests: a golden player with a long-tailed (and optionally queueing) model
latency, a scrape parsed by prometheus_client's own parser, and the simulated trainer of issue #26's check."""
from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from envhub.service.golden import GoldenBackend


class LatencyGolden(GoldenBackend):
    """The envs' golden players, each call delayed by a lognormal draw (median ``median_s``, shape ``sigma``: a
    long tail, p99 ~ 6x the median at sigma 0.8). ``slots``: at most that many calls are served at once, the rest
    wait in this backend's queue (what a saturated vLLM does), reported by :meth:`load` as ``waiting``."""

    def __init__(self, median_s: float = 0.05, sigma: float = 0.8, *, slots: int | None = None, seed: int = 0,
                 hold_first: bool = False):
        super().__init__()
        # hold_first: each session's first call waits until the test sets ``release`` (a threading event: the
        # server runs on its own loop in another thread)
        self.release = threading.Event() if hold_first else None
        self.median_s, self.sigma, self.rng = median_s, sigma, random.Random(seed)
        self.slots = slots
        self._sem: asyncio.Semaphore | None = None
        self.waiting = 0
        self.sessions: set[str] = set()  # sessions that began a call (a test waits for jobs to be inside one)

    def load(self) -> dict[str, int]:
        return {"waiting": self.waiting}

    async def generate(self, prompt_ids, params, *, session_id=None):
        delay = self.median_s * self.rng.lognormvariate(0.0, self.sigma)
        first = session_id not in self.sessions
        self.sessions.add(session_id)
        while first and self.release is not None and not self.release.is_set():
            await asyncio.sleep(0.01)
        if self.slots is None:
            await asyncio.sleep(delay)
            return await super().generate(prompt_ids, params, session_id=session_id)
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.slots)
        self.waiting += 1
        try:
            await self._sem.acquire()
        finally:
            self.waiting -= 1
        try:
            await asyncio.sleep(delay)
            return await super().generate(prompt_ids, params, session_id=session_id)
        finally:
            self._sem.release()


def hold(n: int, sleep: float = 0.0) -> dict[str, Any]:
    """A ``svc-hold`` job: a real bwrap sandbox, one bash tool call (``sleep``), then the answer."""
    return {"instance": {"env_id": "svc-hold", "task": {"task_id": f"hold-{n}", "n": n, "sleep": sleep}}}


def scrape(url: str) -> dict[str, Any]:
    """``GET /metrics`` parsed by prometheus_client's parser: ``{family name: family}`` (the parity check)."""
    r = httpx.get(url + "/metrics", timeout=30)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def value(fams: dict[str, Any], sample: str, **labels: str) -> float:
    """The value of one sample (``envhub_stage_seconds_count`` with ``stage="tool_call"``...); 0 when absent."""
    family = fams[sample.removesuffix("_total").removesuffix("_count").removesuffix("_sum")]
    for s in family.samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    return 0.0


def mean_of(fams: dict[str, Any], family: str, **labels: str) -> float:
    n = value(fams, f"{family}_count", **labels)
    return value(fams, f"{family}_sum", **labels) / n if n else 0.0


async def simulate(url: str, *, factor: float, concurrency: int = 4, batch: int = 2, cap: int = 8,
                   warm_s: float = 2.5, window_s: float = 6.0, sleep: float = 0.3) -> dict[str, Any]:
    """A generator (``concurrency`` workers feeding a buffer of at most ``cap`` samples) and a trainer taking
    ``batch`` samples per step whose step lasts ``batch / (factor x production)`` seconds.

    The generator first runs alone, unbounded, for ``warm_s`` (sandbox pools fill). Then the buffer keeps half its
    bound (the trainer starts neither starved nor flooded), the trainer runs for ``window_s`` (the service's
    metrics window) and ``/status`` is read. The production rate the trainer is set against is taken before each
    step from the generator's last 8 rollouts (concurrency / their mean latency): this host is shared, and its
    load moves the generator's speed by 2x within seconds, so a calibration made once drifts off. Every request and step is
    logged with this process's monotonic clock; the ground-truth idle ratios come from those logs over the same
    window: the trainer's is the time between its steps, the generator's its unused slots (1 - request-seconds
    in flight / (concurrency x window)), the definitions docs/metrics.md gives. Each rollout's tool call sleeps
    ``sleep`` seconds: the client's request-seconds include the HTTP round trip the server cannot see (10-15 ms on a
    loaded 2-core host), a bias of 5 points on 0.25 s rollouts that this halves."""
    rate: float | None = None
    buffer: list[dict] = []
    outstanding = [0]
    done = [False]
    cond = asyncio.Condition()
    requests: list[list] = []  # [sent, answered or None]
    steps: list[tuple[float, float]] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:

        async def worker(i: int) -> None:
            n = 0
            while True:
                async with cond:
                    await cond.wait_for(lambda: done[0] or rate is None or len(buffer) + outstanding[0] < cap)
                    if done[0]:
                        return
                    outstanding[0] += 1
                entry = [time.monotonic(), None]  # logged when sent: one still in flight at the query counts
                requests.append(entry)
                r = await client.post("/process", json=hold(1000 * i + n, sleep))
                entry[1] = time.monotonic()
                n += 1
                assert r.status_code == 200 and r.json()["critical_error"] is None, r.text
                async with cond:
                    outstanding[0] -= 1
                    buffer.append(r.json())
                    cond.notify_all()

        workers = [asyncio.ensure_future(worker(i)) for i in range(concurrency)]
        try:
            t_warm = time.monotonic()
            await asyncio.sleep(0.4 * warm_s)
            t_measure = time.monotonic()
            await asyncio.sleep(0.6 * warm_s)

            def produced_since() -> int:
                return sum(1 for a, b in requests if b is not None and b >= t_measure)

            # a loaded host (a parallel test run) can be slower than warm_s: measure until 2 rollouts came back
            while produced_since() < 2 and time.monotonic() - t_measure < 120:
                await asyncio.sleep(0.1)
            t_start = time.monotonic()
            produced = produced_since()
            assert produced >= 2, f"the generator made {produced} rollouts in {t_start - t_warm:.1f}s of warm-up"
            production = produced / (t_start - t_measure)
            async with cond:
                del buffer[cap // 2:]
                rate = factor * production  # from now on the buffer is bounded (the workers' wait sees rate set)
                cond.notify_all()
            def step_time() -> float:
                # the generator's rate at full concurrency now: concurrency / the latency of its last 8 rollouts.
                # Taken afresh every step, because this host's load (other jobs) moves it by 2x within seconds
                done_ = sorted((b, b - a) for a, b in requests if b is not None)[-8:]
                latency = sum(d for _, d in done_) / len(done_)
                return batch / (factor * concurrency / latency)

            step_s = step_time()
            while time.monotonic() - t_start < window_s - step_s:
                step_s = step_time()
                async with cond:
                    await cond.wait_for(lambda: len(buffer) >= batch)
                    del buffer[:batch]
                    cond.notify_all()
                # each boundary carries when it happened ('at', as RolloutClient sends it): a busy host reads a
                # request late, and the trainer's idle ratio is the trainer's, not the server's reading delay
                tb, at = time.monotonic(), time.time()
                (await client.post("/trainer/step", json={"phase": "begin", "at": at})).raise_for_status()
                await asyncio.sleep(step_s)
                te, at = time.monotonic(), time.time()
                (await client.post("/trainer/step", json={"phase": "end", "samples": batch, "at": at})
                 ).raise_for_status()
                steps.append((tb, te))
            t_query = time.monotonic()
            status = (await client.get("/status")).json()
        finally:
            async with cond:
                done[0] = True
                cond.notify_all()
            await asyncio.gather(*workers, return_exceptions=True)
    g0 = t_query - window_s
    t0 = max(g0, steps[0][0])
    busy_t = sum(min(te, t_query) - max(tb, t0) for tb, te in steps if te > t0)
    live = [(max(a, g0), t_query if b is None else min(b, t_query)) for a, b in requests
            if a < t_query and (b is None or b > g0)]
    slot_s = sum(b - a for a, b in live)  # request-seconds in the window: the generator's used slots
    return {
        "status": status,
        "truth": {"trainer_idle_ratio": 1 - busy_t / (t_query - t0),
                  "generator_idle_ratio": 1 - slot_s / (concurrency * (t_query - g0))},
        "steps": len(steps), "rollouts": sum(1 for a, b in requests if b is not None and b > g0),
        "production": production,
    }
