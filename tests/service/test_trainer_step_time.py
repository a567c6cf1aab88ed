"""A step boundary is placed when the trainer says it happened (``at``), not when a busy server reads the report.

The attack on the metric is plain load: a server whose loop is busy reads ``POST /trainer/step begin`` late, and
timed on arrival that delay is counted as trainer idle (the online example: 43 % idle by the server, 16 % by the
trainer). Tested on :class:`Throughput` with its own clock, and over real HTTP with the real client.
"""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from envhub.rollout.throughput import Throughput

pytestmark = pytest.mark.timeout(60)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def late_reports(use_at: bool) -> float:
    """Ten steps of 1 s compute with 0.1 s between them; each ``begin`` report is read 0.5 s late (sent while the
    server's loop is busy), each ``end`` at once (sent after the resume, the loop quiet). The true idle: 0.1 / 1.1."""
    clock = Clock()
    tp = Throughput(window_s=600, clock=clock)

    def report(phase, happened, samples=None):
        at = time.time() - (clock.t - happened) if use_at else None  # Unix time of the moment ``happened``
        tp.trainer_step(phase, samples, at=at)

    for i in range(10):
        began = 1000.0 + 1.1 * i
        clock.t = began + 0.5
        report("begin", began)
        clock.t = began + 1.0
        report("end", began + 1.0, samples=8)
    return tp.snapshot(now=1000.0 + 11.0)["trainer_idle_ratio"]


def test_late_reports_with_at_give_the_true_idle_ratio():
    idle = late_reports(use_at=True)
    assert idle == pytest.approx(0.1 / 1.1, abs=0.02)


def test_late_reports_timed_on_arrival_inflate_idle():
    """The defence off (no ``at``): the same trainer looks idle 0.6 / 1.1 -- the check above fails on it."""
    assert late_reports(use_at=False) > 0.45  # ~0.6 / 1.1 (the window starts at the first report)


def test_at_is_bounded_and_checked():
    clock = Clock()
    tp = Throughput(window_s=600, clock=clock)
    tp.trainer_step("end", samples=1)
    clock.t += 10
    tp.trainer_step("begin", at=time.time() - 3600)  # a skewed clock: never before the previous boundary
    assert tp.trainer.changes[-1][0] >= 1000.0
    tp.trainer_step("end", at=time.time() + 3600)  # from the future: now
    assert tp.trainer.changes[-1][0] == clock.t
    for bad in ("soon", True, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="Unix time"):
            tp.trainer_step("begin", at=bad)


async def test_the_client_sends_at_and_a_bad_at_is_a_422(serve):
    from envhub.training import RolloutClient

    srv = serve()
    seen = []
    original = srv.service.trainer_step
    srv.service.trainer_step = lambda phase, samples=None, at=None: seen.append(at) or original(phase, samples, at)
    async with RolloutClient(srv.url) as client:
        before = time.time()
        await client.trainer_step("begin")
        await client.trainer_step("end", samples=4)
    assert len(seen) == 2 and all(before <= t <= time.time() for t in seen)
    async with httpx.AsyncClient(base_url=srv.url) as c:
        r = await c.post("/trainer/step", json={"phase": "begin", "at": "yesterday"})
        assert r.status_code == 422 and "Unix time" in r.text
    await asyncio.sleep(0)
