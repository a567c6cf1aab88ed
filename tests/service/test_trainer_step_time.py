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


class OlderServer:
    """A stand-in for an envhub server from before ``at`` (named as such: the old code is not shipped any more),
    answering ``POST /trainer/step`` exactly as it did -- 422 ``unknown field(s) ['at']`` -- on loopback."""

    def __init__(self):
        self.bodies: list[dict] = []

    async def start(self) -> str:
        import json as _json

        async def handle(reader, writer):
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(next(v for k, v in (line.split(b":", 1) for line in head.split(b"\r\n")[1:] if b":" in line)
                              if k.strip().lower() == b"content-length"))
            body = _json.loads(await reader.readexactly(length))
            self.bodies.append(body)
            unknown = sorted(set(body) - {"phase", "samples"})
            status, reply = ((422, {"detail": f"unknown field(s) {unknown}: send {{phase: begin|end, samples?: int}}"})
                             if unknown else (200, {"phase": body["phase"], "steps": 0, "consumed": 0}))
            data = _json.dumps(reply).encode()
            writer.write(f"HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
                         f"connection: close\r\n\r\n".encode() + data)
            await writer.drain()
            writer.close()

        self.server = await asyncio.start_server(handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"


async def test_an_older_server_that_refuses_at_gets_the_report_without_it(caplog):
    from envhub.training.client import RolloutClient

    old = OlderServer()
    url = await old.start()
    async with RolloutClient(url, retries=0) as c:
        await c.trainer_step("begin")
        await c.trainer_step("end", samples=4)
    old.server.close()
    # the first report is refused once, resent without 'at'; the client remembers and sends the next one plain
    assert [sorted(b) for b in old.bodies] == [["at", "phase"], ["phase"], ["phase", "samples"]], old.bodies
    assert sum("does not take 'at'" in r.getMessage() for r in caplog.records) == 1
