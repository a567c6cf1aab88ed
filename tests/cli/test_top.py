"""``envhub top`` (issue #26 point 2) against real rollout services and a real gateway on loopback: ``--once`` shows
the figures the service's ``/status`` reports; two replicas and a dead one give per-replica lines, a DOWN line with
the error and a TOTAL that sums; the figures move when load is injected; on a terminal the screen refreshes and
Ctrl-C exits cleanly. The sums are checked against the per-replica figures, and the check is shown to fail when the
sum is replaced by a mean (the bug it guards against)."""
from __future__ import annotations

import asyncio
import os
import pty
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from envhub.cli import main
from envhub.cli.top_view import COLS, num, pct, secs
from envhub.rollout import live
from envhub.rollout.livepoll import Poller

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent / "service"))  # the service tests' envs (svc-slow: a text env with set delays)
import svc_plugins  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def serve(tiny_tokenizer):
    """``serve(**RolloutService kwargs) -> ServerThread`` on loopback (golden backend); stopped at the end."""
    from envhub.service import RolloutService, ServerThread

    svc_plugins.register_all()
    servers = []

    def start(token=None, **kw):
        kw.setdefault("backends", ["golden"])
        srv = ServerThread(RolloutService(tiny_tokenizer, **kw), host="127.0.0.1", token=token).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.stop()


def job(i: int, run_s: float = 0.05) -> dict:
    return {"instance": {"env_id": "svc-slow", "task": {"task_id": f"slow-{i}", "n": i, "run_s": run_s}}}


async def load(url: str, jobs: int, steps: int = 3, run_s: float = 0.05) -> None:
    """``jobs`` rollouts at once and ``steps`` trainer steps of 2 samples beside them."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as c:
        sent = [asyncio.ensure_future(c.post("/process", json=job(i, run_s))) for i in range(jobs)]
        for _ in range(steps):
            (await c.post("/trainer/step", json={"phase": "begin"})).raise_for_status()
            await asyncio.sleep(0.02)
            (await c.post("/trainer/step", json={"phase": "end", "samples": 2})).raise_for_status()
        replies = await asyncio.gather(*sent)
    assert all(r.status_code == 200 for r in replies)


def freeze(srv) -> float:
    """Stop the service's metrics clock: its windowed rates stop sliding, so two reads of ``/status`` (the test's
    and ``envhub top``'s) see the same figures. The server, its pipeline and its HTTP are untouched."""
    now = srv.service.metrics.clock()
    srv.service.metrics.clock = lambda: now
    return now


def top(*args: str) -> list[str]:
    """``envhub top ... --once`` (click's runner: stdout is not a terminal, so one plain screen)."""
    r = CliRunner().invoke(main, ["top", *args, "--once"])
    assert r.exit_code == 0, r.output
    assert "\x1b[" not in r.output  # plain text off a terminal
    return r.output.splitlines()


def cells(line: str) -> dict[str, str]:
    """A replica line cut into the columns of the table (``COLS``)."""
    out, at = {}, 0
    for name, width in COLS:
        out[name] = line[at:at + width].strip()
        at += width + 1
    return out


def line_of(lines: list[str], prefix: str) -> dict[str, str]:
    found = [ln for ln in lines if ln.startswith(prefix)]
    assert len(found) == 1, (prefix, lines)
    return cells(found[0])


def dead_url() -> str:
    """A loopback port nobody listens on (bound, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


# ---- one replica: what /status says, on the screen ----------------------------------------------------------------
def test_top_once_shows_the_figures_status_reports(serve):
    srv = serve(max_sandboxes=37, metrics_window_s=30)
    asyncio.run(load(srv.url, 8))
    freeze(srv)
    lines = top(srv.url)
    st = httpx.get(srv.url + "/status", timeout=10).json()
    tp, bd = st["throughput"], st["bound"]
    row = line_of(lines, srv.url.removeprefix("http://"))
    assert row["prod/s"] == num(tp["production_rate"]) and tp["production_rate"] > 0
    assert row["eff/s"] == num(tp["effective_production_rate"])
    assert row["cons/s"] == num(tp["consumption_rate"]) and tp["consumption_rate"] > 0
    assert row["accept"] == pct(tp["acceptance"])
    assert row["trn idle"].endswith(pct(tp["trainer_idle_ratio"]))
    assert row["gen idle"].endswith(pct(tp["generator_idle_ratio"]))
    assert row["bound"] == bd["bound"]
    assert row["sandboxes"] == f"0/{37}"
    assert row["lat"] == secs(tp["rollout_latency_s"])
    text = "\n".join(lines)
    assert bd["why"].split(";")[0] in text  # the verdict's figures, in its own words
    assert f"outcomes: accepted {tp['outcomes']['accepted']}" in text and tp["outcomes"]["accepted"] == 8
    stage = next(ln for ln in lines if ln.strip().startswith("run "))
    assert stage.split()[1:] == [str(tp["stages"]["run"]["count"]), *(secs(tp["stages"]["run"][k]) for k in
                                                                      ("mean", "p50", "p90", "p99"))]
    golden = next(ln for ln in lines if ln.strip().startswith("golden"))
    assert golden.split()[1] == num(tp["backends"]["golden"]["tokens_per_s"])
    assert "staleness" in text and "live 0 of 37" in text


# ---- several replicas: per replica, the dead one named, the whole summed -------------------------------------------
def check_total(lines: list[str], urls: list[str]) -> None:
    """The TOTAL line's rates are the sums of the replica lines' (within the rounding of what is printed)."""
    rows = [line_of(lines, u.removeprefix("http://")) for u in urls]
    tot = line_of(lines, "TOTAL")
    for col in ("prod/s", "eff/s", "cons/s"):
        parts = [r[col] for r in rows]
        slack = sum(map(half_ulp, [*parts, tot[col]]))  # each printed figure is rounded by up to half its last digit
        assert abs(float(tot[col]) - sum(map(float, parts))) <= slack + 1e-9, (col, tot, rows)


def half_ulp(printed: str) -> float:
    return 0.5 * 10 ** -len(printed.partition(".")[2])


def test_two_replicas_and_a_dead_one(serve):
    a, b = serve(metrics_window_s=30), serve(metrics_window_s=30, max_sandboxes=5)
    asyncio.run(load(a.url, 8))
    asyncio.run(load(b.url, 4, steps=2))
    freeze(a), freeze(b)
    dead = dead_url()
    lines = top(a.url, dead, b.url)
    assert "3 replica(s), 1 down" in lines[0]
    down = next(ln for ln in lines if ln.startswith(dead.removeprefix("http://")))
    assert "DOWN" in down and "Connection refused" in down
    check_total(lines, [a.url, b.url])
    assert float(line_of(lines, "TOTAL")["prod/s"]) > float(line_of(lines, a.url.removeprefix("http://"))["prod/s"])
    assert line_of(lines, "TOTAL")["sandboxes"].endswith("/2505")  # 2500 (the default limit here) + 5
    text = "\n".join(lines)
    assert "outcomes: accepted 12" in text  # 8 + 4


def test_the_total_check_fails_when_the_sum_is_a_mean(serve, monkeypatch):
    """Break it on purpose: a TOTAL that averages the replicas' rates instead of adding them is caught."""
    a, b = serve(metrics_window_s=30), serve(metrics_window_s=30)
    asyncio.run(load(a.url, 6))
    asyncio.run(load(b.url, 6))
    freeze(a), freeze(b)
    check_total(top(a.url, b.url), [a.url, b.url])
    real = live.total

    def averaged(rows):
        t = real(rows)
        for k in ("production_rate", "effective_production_rate", "consumption_rate"):
            t[k] = t[k] / t["services"]
        return t

    monkeypatch.setattr(live, "total", averaged)
    monkeypatch.setattr("envhub.rollout.livepoll.total", averaged)
    with pytest.raises(AssertionError, match="prod/s"):
        check_total(top(a.url, b.url), [a.url, b.url])


def test_generator_idle_of_the_whole_weighs_replicas_by_their_slots(serve, monkeypatch):
    """A replica running 1 of its slots and one running 6: the whole's generator idle is the share of all slots
    unused (Σ busy ÷ Σ peak), not the mean of the two ratios; a plain mean is caught."""
    a, b = serve(metrics_window_s=30), serve(metrics_window_s=30)

    async def both() -> None:
        await asyncio.gather(load(a.url, 1, steps=0, run_s=0.3), load(b.url, 6, steps=0, run_s=1.0))

    asyncio.run(both())
    freeze(a), freeze(b)
    rows, tot = Poller([a.url, b.url]).poll()

    def weighted(rows, tot) -> bool:
        busy = sum((1 - r["generator_idle_ratio"]) * r["peak_concurrency"] for r in rows)
        return abs(tot["generator_idle_ratio"] - (1 - busy / sum(r["peak_concurrency"] for r in rows))) < 1e-9

    assert rows[0]["peak_concurrency"] == 1 and rows[1]["peak_concurrency"] >= 3  # 6 sent at once
    assert weighted(rows, tot)
    plain = sum(r["generator_idle_ratio"] for r in rows) / 2
    assert abs(plain - tot["generator_idle_ratio"]) > 1e-3  # the two rules differ on these replicas...
    tot_mean = dict(tot, generator_idle_ratio=plain)
    assert not weighted(rows, tot_mean)  # ...so the check would catch a mean


def test_a_server_that_needs_a_token_says_so_and_bad_urls_are_refused(serve):
    srv = serve(token="s3cret")
    url = srv.url.removeprefix("http://")
    without = next(ln for ln in top(srv.url) if ln.startswith(url))
    assert "DOWN" in without and "401" in without and "--token" in without
    assert "DOWN" not in "\n".join(top(srv.url, "--token", "s3cret"))
    r = CliRunner().invoke(main, ["top", "127.0.0.1:8000", "--once"])
    assert r.exit_code == 2 and "http://HOST:PORT" in r.output


# ---- the figures move with load ----------------------------------------------------------------------------------
def test_figures_move_when_load_is_injected(serve):
    srv = serve(run_workers=2, metrics_window_s=30)
    url = srv.url.removeprefix("http://")
    idle = line_of(top(srv.url), url)
    assert idle["prod/s"] in ("-", "0") and idle["queue"] == "0"

    async def inject() -> list[str]:
        async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
            sent = [asyncio.ensure_future(c.post("/process", json=job(i, run_s=1.5))) for i in range(6)]
            deadline = time.monotonic() + 30
            while (await c.get("/status")).json()["run_queue"] < 1 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            busy = await asyncio.to_thread(top, srv.url)
            await asyncio.gather(*sent)
            return busy

    busy = asyncio.run(inject())
    row = line_of(busy, url)
    assert int(row["queue"]) >= 1, busy  # 6 jobs, 2 RUN workers: a queue
    assert any(ln.startswith("queue:") and "run " in ln and "run 0" not in ln for ln in busy), busy
    after = line_of(top(srv.url), url)
    assert float(after["prod/s"]) > 0 and after["queue"] == "0"


def test_a_service_with_a_controller_shows_its_limit_and_last_decision(serve):
    from envhub.service.controller import Knobs

    srv = serve(controller=Knobs(start=3, interval_s=0.1), metrics_window_s=30)
    asyncio.run(load(srv.url, 8, run_s=0.3))
    deadline = time.monotonic() + 30
    while not httpx.get(srv.url + "/status", timeout=10).json()["controller"]["log"] and time.monotonic() < deadline:
        time.sleep(0.1)
    lines = top(srv.url)
    ctl = httpx.get(srv.url + "/status", timeout=10).json()["controller"]
    line = next(ln for ln in lines if ln.startswith("controller: "))
    assert re.match(r"controller: limit \d+ \(\d+ in flight, ceiling \d+ by \w+", line), line
    assert f"by {ctl['ceiling_by']}" in line and "; last: " in "\n".join(lines)
    last = ctl["log"][-1]
    assert last["action"] in "\n".join(lines)


# ---- a gateway replica --------------------------------------------------------------------------------------------
def test_a_gateway_replica_shows_its_calls(serve, tiny_tokenizer):
    from envhub.backends.scripted import ScriptedBackend
    from envhub.env import Action
    from envhub.gateway import Gateway, GatewayThread

    srv = serve(metrics_window_s=30)
    gw = Gateway(ScriptedBackend(lambda task, messages: Action("hello")), tiny_tokenizer)
    with GatewayThread(gw) as g:
        key = httpx.post(g.url + "/sessions", json={"task_id": "t"}, timeout=30).json()["api_key"]
        for _ in range(3):
            r = httpx.post(g.url + "/chat/completions", json={"model": "m", "messages": [
                {"role": "user", "content": "hi"}]}, headers={"Authorization": f"Bearer {key}"}, timeout=30)
            assert r.status_code == 200, r.text
        lines = top(srv.url, g.url)
    gline = next(ln for ln in lines if ln.startswith(g.url.removeprefix("http://")))
    assert "gateway" in gline and "calls 3" in gline and "sessions 1" in gline
    assert any(ln.startswith("gateways: calls 3") for ln in lines), lines


# ---- on a terminal: redrawn, and Ctrl-C leaves cleanly -----------------------------------------------------------
def test_on_a_terminal_it_refreshes_and_ctrl_c_exits_cleanly(serve):
    srv = serve()
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "envhub.cli", "top", srv.url, dead_url(), "-n", "0.2"],
                            stdin=slave, stdout=slave, stderr=slave, close_fds=True,
                            env={**os.environ, "COLUMNS": "150", "LINES": "50"},
                            # as started from a terminal: a run under `cmd &` (CI's) inherits SIGINT ignored, and
                            # Python then installs no KeyboardInterrupt handler -- Ctrl-C would never arrive
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    os.close(slave)
    out = b""
    try:
        deadline = time.monotonic() + 60
        while out.count(b"\x1b[H") < 3 and time.monotonic() < deadline:  # three screens drawn
            if select.select([master], [], [], 0.5)[0]:
                out += os.read(master, 65536)
        assert out.count(b"\x1b[H") >= 3, out[-2000:]
        proc.send_signal(signal.SIGINT)
        # keep reading, as a terminal does: unread, the pty's buffer fills and the exiting process blocks on its
        # last write (seen on a loaded host: no exit within 20 s)
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    out += os.read(master, 65536)
                except OSError:
                    break
        assert proc.wait(timeout=5) == 0
        while select.select([master], [], [], 0.2)[0]:
            try:
                out += os.read(master, 65536)
            except OSError:
                break
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    text = out.decode(errors="replace")
    assert "Traceback" not in text
    assert "Ctrl-C quits" in text and "DOWN" in text and "\x1b[31m" in text  # coloured on a terminal
    assert re.search(r"127\.0\.0\.1:\d+ +\S", text)
