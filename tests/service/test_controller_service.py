"""The concurrency controller in a real service (issue #26 point 3): a real ``RolloutService`` on loopback, real HTTP
clients, the golden player behind a backend with a limited number of slots whose queue the test changes at run
time. The limit rises while the backend keeps up, falls when it queues, stops at the sandbox limit; lowering the limit
never fails a rollout in flight (the excess drains); ``/status`` and ``/metrics`` carry the decisions with their
reasons; a vLLM server's ``/metrics`` is scraped over HTTP; ``envhub serve --controller aimd`` starts it."""
from __future__ import annotations

import asyncio
import http.server
import json
import logging
import threading
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from helpers import run_cli
from svc_helpers import spawn_server

from envhub.service.controller import Knobs
from envhub.service.golden import GoldenBackend
from envhub.service.pipeline import Pipeline

pytestmark = pytest.mark.timeout(120)
HERE = Path(__file__).parent


class Slots(GoldenBackend):
    """The envs' golden players behind a server with ``capacity`` slots: each call takes ``call_s`` once it has a
    slot, the others wait in this backend's queue, reported by :meth:`load` (what vLLM's scheduler does). The test
    changes ``capacity`` from its own thread while the service runs."""

    def __init__(self, capacity: int, call_s: float = 0.08):
        super().__init__()
        self.capacity, self.call_s = capacity, call_s
        self.running = self.waiting = 0

    def load(self) -> dict[str, int]:
        return {"waiting": self.waiting, "running": self.running}

    async def generate(self, prompt_ids, params, *, session_id=None):
        self.waiting += 1
        try:
            while self.running >= self.capacity:
                await asyncio.sleep(0.005)
        finally:
            self.waiting -= 1
        self.running += 1
        try:
            await asyncio.sleep(self.call_s)
            return await super().generate(prompt_ids, params, session_id=session_id)
        finally:
            self.running -= 1


def job(i: int, run_s: float = 0.0) -> dict:
    return {"instance": {"env_id": "svc-slow", "task": {"task_id": f"c-{i}", "n": i, "run_s": run_s}}}


class Load:
    """``outstanding`` /process requests kept in flight against ``url`` until :meth:`stop`; every reply kept."""

    def __init__(self, url: str, outstanding: int, run_s: float = 0.0):
        self.url, self.outstanding, self.run_s = url, outstanding, run_s
        self.replies: list[dict] = []
        self.done = False
        self.tasks: list[asyncio.Task] = []

    async def __aenter__(self) -> Load:
        self.client = httpx.AsyncClient(base_url=self.url, timeout=120)
        self.tasks = [asyncio.ensure_future(self._worker(w)) for w in range(self.outstanding)]
        return self

    async def _worker(self, w: int) -> None:
        n = 0
        while not self.done:
            r = await self.client.post("/process", json=job(10_000 * w + n, self.run_s))
            n += 1
            assert r.status_code == 200, r.text
            self.replies.append(r.json())

    async def stop(self) -> None:
        self.done = True
        await asyncio.gather(*self.tasks)

    async def __aexit__(self, *exc) -> None:
        self.done = True
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.client.aclose()


async def watch(url: str, until, timeout_s: float, trace: list) -> dict:
    """Poll ``/status`` every 50 ms, appending ``(limit, in_flight)`` to ``trace``, until ``until(controller)``."""
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while True:
            st = (await client.get("/status")).json()
            c = st["controller"]
            trace.append((c["limit"], st["concurrency"]["in_flight"]))
            if until(c):
                return c
            assert time.monotonic() < deadline, (c["limit"], c["log"][-5:])
            await asyncio.sleep(0.05)


# the limit follows a queue that forms and drains in real time: run alone, not beside 3 other test workers on 2 cores
@pytest.mark.serial
async def test_the_limit_rises_while_the_backend_keeps_up_and_falls_when_it_queues(serve):
    backend = Slots(capacity=6)
    srv = serve(backends=[backend], run_workers=32, max_sandboxes=12,
                controller=Knobs(start=2, interval_s=0.1, patience=2))
    trace: list = []
    async with Load(srv.url, outstanding=40) as load:
        # room on the server: slow start doubles 2 -> 4 -> 8 and holds with a small queue (2 waiting for 6)
        up = await watch(srv.url, lambda c: c["limit"] >= 8, 30, trace)
        backend.capacity = 1  # the server saturates: 7 waiting for 1 running
        down = await watch(srv.url, lambda c: c["limit"] <= 3, 30, trace)
        backend.capacity = 64  # room again, far more than the node allows: the sandbox limit (12) stops it
        top = await watch(srv.url, lambda c: c["limit"] == 12 and c["signals"]["in_flight"] >= 11, 40, trace)
        await asyncio.sleep(0.5)
        await load.stop()
        st = httpx.get(srv.url + "/status").json()["controller"]
    log = st["log"]
    print("\n".join(f"{d['action']} {d['old']}->{d['new']}: {d['reason']}" for d in log))
    assert up["ceiling"] == 12 and top["ceiling_by"] == "sandbox limit"
    assert any(d["action"] == "increase" and "slow start" in d["reason"] for d in log), log
    assert any(d["action"] == "decrease" and d["signal"] == "queue" and "waiting" in d["reason"] for d in log), log
    assert down["phase"] == "avoidance"
    assert max(lim for lim, _ in trace) == 12 and max(n for _, n in trace) <= 12, trace  # never past the ceiling
    assert st["limit"] == 12
    assert load.replies and all(r["critical_error"] is None for r in load.replies), \
        [r["critical_error"] for r in load.replies if r["critical_error"]][:3]
    # the same decisions as Prometheus metrics, read with prometheus_client's parser
    text = httpx.get(srv.url + "/metrics").text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    assert fams["envhub_controller_concurrency"].samples[0].value == 12
    assert fams["envhub_controller_ceiling"].samples[0].value == 12
    decided = {(s.labels["action"], s.labels["signal"]): s.value for s in fams["envhub_controller_decisions"].samples
               if s.name.endswith("_total")}
    assert decided[("increase", "queue")] >= 3 and decided[("decrease", "queue")] >= 1, decided


async def drain_trace(srv, n_first: int = 8, n_more: int = 4, lower_to: int = 2,
                      first_run_s: float = 1.0) -> tuple[list, list, int]:
    """``n_first`` slow jobs (``first_run_s`` each) under a limit of ``n_first``; once all hold a slot, the limit drops
    to ``lower_to`` and ``n_more`` jobs follow. Returns the replies, the in-flight counts seen from then on, and the
    limit."""
    svc = srv.service

    async def set_limit(n: int) -> None:
        svc.pipeline.set_concurrency(n)

    srv.call(set_limit(n_first))
    async with httpx.AsyncClient(base_url=srv.url, timeout=120) as client:
        first = [asyncio.ensure_future(client.post("/process", json=job(i, run_s=first_run_s))) for i in range(n_first)]
        deadline = time.monotonic() + 60
        while (await client.get("/status")).json()["concurrency"]["in_flight"] < n_first:
            assert time.monotonic() < deadline, "the first jobs never all held a slot"
            await asyncio.sleep(0.02)
        srv.call(set_limit(lower_to))
        more = [asyncio.ensure_future(client.post("/process", json=job(100 + i, run_s=0.3))) for i in range(n_more)]
        seen = []
        while not all(t.done() for t in first + more):
            seen.append((await client.get("/status")).json()["concurrency"]["in_flight"])
            await asyncio.sleep(0.02)
        replies = [(await t).json() for t in first + more]
    return replies, seen, lower_to


def drain_violations(seen: list[int], n_first: int, lower_to: int) -> list[str]:
    """What lowering the limit must not do: start new work while the excess drains (the count rising while above
    the limit), go back above the limit once drained, or pass the old limit."""
    bad = []
    reached = False
    for a, b in zip(seen, seen[1:]):
        if b > a and a >= lower_to:
            bad.append(f"rose {a} -> {b} while at or above the limit {lower_to}")
        reached = reached or b <= lower_to
        if reached and b > lower_to:
            bad.append(f"back to {b} above the limit {lower_to} after draining")
    if max(seen, default=0) > n_first:
        bad.append(f"{max(seen)} in flight, above the old limit {n_first}")
    return bad


async def test_lowering_the_limit_drains_and_never_fails_work_in_flight(serve):
    srv = serve(run_workers=16, init_workers=16)
    replies, seen, low = await drain_trace(srv)
    assert [r["critical_error"] for r in replies] == [None] * 12  # none of the 8 above the new limit was cancelled
    assert all(r["finish_reason"] != "cancelled" for r in replies)
    assert drain_violations(seen, 8, low) == [], seen
    assert seen[0] > low  # jobs above the new limit were in flight when it dropped: the drain was exercised


async def test_break_it_a_cap_that_does_not_wait_fails_the_drain_check(serve, monkeypatch):
    async def no_wait(self, job):  # a cap that counts but never holds a job back
        if not job.discarded:
            job.slot = True
            self.in_flight += 1

    monkeypatch.setattr(Pipeline, "_take_slot", no_wait)
    srv = serve(run_workers=16, init_workers=16)
    # the first jobs run 4 s, not 1: the cap is caught only if the later jobs arrive while they still run, and in a
    # CI run at load ~16 the later posts took over a second (seen: [8, 8, 4, 4, ...], never above 8)
    replies, seen, low = await drain_trace(srv, first_run_s=4.0)
    assert all(r["critical_error"] is None for r in replies)
    assert drain_violations(seen, 8, low), f"the check passed on a cap that does not hold jobs back: {seen}"


async def stop_under_a_gate_backlog(tokenizer) -> tuple[int, int, list]:
    """12 requests admitted by a gate of 12 (4 running under a cap of 4, 8 waiting for a slot) and 8 more waiting at
    the gate; then ``stop()``. The cancelled jobs give their leases back while ``stop()`` waits for the running ones to
    unwind, so the gate admits the 8. Returns the jobs submitted before and after the stop, and the outcomes."""
    from envhub.rollout.staleness import StalenessGate
    from envhub.service.schemas import ProcessRequest, ServiceError
    from envhub.service.service import RolloutService

    svc = RolloutService(tokenizer, backends=["golden"], gate=StalenessGate(max_concurrent=12))
    await svc.start()
    svc.pipeline.set_concurrency(4)
    reqs = [asyncio.ensure_future(svc.process(ProcessRequest(instance={"env_id": "svc-slow", "task": {
        "task_id": f"st-{i}", "n": i, "run_s": 0.4, "turns": 3}}))) for i in range(20)]
    deadline = time.monotonic() + 60
    while svc.pipeline.counts["submitted"] < 12 or svc.pipeline.in_flight < 4:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    before = svc.pipeline.counts["submitted"]
    await svc.stop()
    after = svc.pipeline.counts["submitted"]
    out = await asyncio.gather(*reqs, return_exceptions=True)
    await svc.shutdown()
    outcomes = [f"{o.status}" if isinstance(o, ServiceError) else
                (type(o).__name__ if isinstance(o, BaseException) else json.loads(o)["finish_reason"]) for o in out]
    return before, after, outcomes


async def test_stop_submits_nothing_the_gate_admits_while_it_stops(tiny_tokenizer):
    before, after, outcomes = await stop_under_a_gate_backlog(tiny_tokenizer)
    assert (before, after) == (12, 12), outcomes
    assert sorted(set(outcomes)) == ["503", "cancelled"], outcomes  # none ran to the end, none broke


async def test_break_it_without_the_stopping_flag_the_gate_backlog_starts_during_stop(tiny_tokenizer, monkeypatch):
    # the flag always reads False (and setting it does nothing): the old stop()
    monkeypatch.setattr(Pipeline, "stopping", property(lambda self: False, lambda self, v: None), raising=False)
    before, after, outcomes = await stop_under_a_gate_backlog(tiny_tokenizer)
    assert after > before, f"no admission during stop() without the flag: the check cannot fail ({outcomes})"


class MetricsServer(http.server.ThreadingHTTPServer):
    """A loopback HTTP server answering ``GET /metrics`` with ``self.body`` (and ``self.status``)."""

    def __init__(self, body: str):
        self.body, self.status = body, 200
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                data = outer.body.encode()
                self.send_response(outer.status if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a):
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


async def test_a_vllm_servers_metrics_are_scraped_over_http(serve):
    vllm = MetricsServer((HERE / "vllm_metrics_busy.txt").read_text())
    try:
        srv = serve(backends=[vllm.url], run_workers=8, controller=Knobs(start=8, interval_s=60, patience=1))
        ctl = srv.service.controller
        d = srv.call(ctl.tick())  # 60 waiting for 4 running at this server: saturated
        assert (d.action, d.new, d.signal) == ("decrease", 5, "queue"), d
        assert ctl.last.waiting == 60 and ctl.last.running == 4 and ctl.last.kv_usage == pytest.approx(0.0011, abs=1e-4)
        vllm.status = 500  # a server that fails its scrape is left out of the tick, and counted
        d = srv.call(ctl.tick())
        assert (d.action, d.signal) == ("hold", "none") and ctl.scrape_errors == 1
        vllm.status, vllm.body = 200, "<html>not metrics</html>\n"
        srv.call(ctl.tick())
        assert ctl.scrape_errors == 2 and ctl.limit == 5
        st = httpx.get(srv.url + "/status").json()["controller"]
        assert st["scrape_errors"] == 2 and st["log"][0]["action"] == "decrease"
    finally:
        vllm.shutdown()


async def test_a_smaller_gate_bound_clamps_the_limit_at_the_next_tick(serve):
    backend = Slots(capacity=64)
    srv = serve(backends=[backend], run_workers=32, controller=Knobs(start=16, interval_s=60))
    ctl = srv.service.controller
    r = httpx.post(srv.url + "/staleness", json={"max_staleness": 0, "batch_size": 3})  # admits (0 + 1) x 3 at most
    assert r.status_code == 200, r.text
    d = srv.call(ctl.tick())
    assert (d.action, d.new, d.signal) == ("clamp", 3, "ceiling") and "staleness gate" in d.reason
    st = httpx.get(srv.url + "/status").json()
    assert st["concurrency"]["limit"] == 3 and st["controller"]["ceiling_by"] == "staleness gate"


async def test_the_oversampling_factor_follows_what_the_trainer_discards(serve, caplog):
    caplog.set_level(logging.INFO, logger="envhub.service.controller")
    srv = serve(backends=[Slots(capacity=64, call_s=0.0)], run_workers=8, controller=Knobs(start=8, interval_s=600))
    ctl = srv.service.controller
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
        replies = await asyncio.gather(*(client.post("/process", json=job(i)) for i in range(8)))
        assert all(r.status_code == 200 and r.json()["critical_error"] is None for r in replies)
        srv.call(ctl.tick())
        assert ctl.aimd.oversampling == 1.2  # everything accepted: only the margin
        # DAPO's collector reports zero-variance groups as discarded: half of what was produced is not trained
        r = await client.post("/staleness/report", json={"discarded": 4})
        assert r.status_code == 200, r.text
        srv.call(ctl.tick())
        st = (await client.get("/status")).json()["controller"]
    assert st["oversampling"] == 2.4 and ctl.last.acceptance == 0.5
    last = [d for d in st["log"] if d["action"] == "oversample"][-1]
    assert last["reason"].startswith("acceptance 50%: oversampling 1.2 -> 2.4"), last
    logged = [r.getMessage() for r in caplog.records if r.name == "envhub.service.controller"]
    assert any("oversample" in m and "1.2 -> 2.4" in m for m in logged), logged  # the logging module has it too


@pytest.mark.timeout(300)  # envhub serve's start-up took 90 s on a loaded machine
@pytest.mark.slow
def test_envhub_serve_controller_aimd():
    proc, url, lines = spawn_server("--backend", "golden", "--run-workers", "6", "--controller", "aimd",
                                    "--controller-start", "3", "--controller-interval", "0.2",
                                    "--controller-knob", "beta=0.5", timeout=240)
    try:
        text = "".join(lines)
        while "API schema" not in text:
            text += proc.stdout.readline()
        assert "controller: aimd from 3" in text, text
        st = httpx.get(url + "/status", timeout=30).json()
        assert st["controller"]["limit"] == 3 and st["controller"]["knobs"]["beta"] == 0.5
        assert st["concurrency"]["limit"] == 3
        # golden reports no queue: the controller says so rather than guessing
        deadline = time.monotonic() + 30
        while not st["controller"]["log"]:
            assert time.monotonic() < deadline
            time.sleep(0.2)
            st = httpx.get(url + "/status", timeout=30).json()
        assert st["controller"]["log"][0]["signal"] == "none"
        shown = run_cli("status", url, timeout=120)
        assert shown.returncode == 0 and "controller: limit 3" in shown.stdout and "nothing to steer by" in \
            shown.stdout, shown.stdout + shown.stderr
    finally:
        proc.terminate()
        proc.wait(60)


def test_envhub_serve_refuses_bad_controller_settings():
    from click.testing import CliRunner

    from envhub.cli.serve import serve_cmd

    r = CliRunner().invoke(serve_cmd, ["--controller", "aimd", "--controller-knob", "beta=1.5", "--no-preflight"])
    assert r.exit_code == 2 and "beta=1.5" in r.output
    r = CliRunner().invoke(serve_cmd, ["--controller-max", "8", "--no-preflight"])
    assert r.exit_code == 2 and "--controller aimd" in r.output
