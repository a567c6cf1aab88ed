"""Exports that cannot lose a session, and waits that end (#28, items 1 and 6).

``/export_trajectories`` (AReaL's route) forgets a session once it is exported, and blocks until the session ends.
Both are only right when the request is a good one and someone is still there to receive it: a bad ``style`` or
``discount`` must be refused before anything waits or is consumed, a failed export must leave the session to be
exported again, and a wait must end when the client goes away or the gateway is asked to stop.
"""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from gw_helpers import TOOLS, Recording, agent_policy

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread, areal

ADMIN = "admin-key"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def served(tiny_tokenizer):
    gw = Gateway(Recording(ScriptedBackend(agent_policy)), tiny_tokenizer)
    with GatewayThread(gw, token=ADMIN) as srv:
        yield gw, srv


def post(srv, path, body, key=ADMIN, timeout=30.0):
    return httpx.post(srv.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=timeout)


def one_call_session(gw, srv, task="t"):
    s = gw.start_session(task)
    r = post(srv, "/v1/chat/completions", {"messages": [{"role": "user", "content": "List files."}], "tools": TOOLS},
             s.api_key)
    assert r.status_code == 200, r.text
    return s


BAD_EXPORTS = [({"style": "weird"}, "style"), ({"discount": "x"}, "discount"), ({"discount": None}, "discount"),
               ({"discount": True}, "discount"), ({"style": ["concat"]}, "style")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("bad,param", BAD_EXPORTS, ids=[str(b) for b, _ in BAD_EXPORTS])
def test_a_bad_export_request_is_refused_and_loses_nothing(served, bad, param):
    gw, srv = served
    s = one_call_session(gw, srv)
    gw.end_session(s)
    r = post(srv, "/export_trajectories", {"session_id": s.session_id, **bad})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["param"] == param
    assert s.session_id in gw.sessions  # not consumed
    fixed = post(srv, "/export_trajectories", {"session_id": s.session_id, "style": "individual", "discount": 0.9})
    assert fixed.status_code == 200 and len(fixed.json()["interactions"]) == 1
    assert s.session_id not in gw.sessions  # exported: now forgotten, as AReaL does


@pytest.mark.timeout(60)
def test_a_bad_export_is_refused_before_the_wait_for_the_sessions_end(served):
    """Before the fix, a bad style to a session still running waited for its end and only then failed."""
    gw, srv = served
    s = one_call_session(gw, srv)
    t0 = time.monotonic()
    r = post(srv, "/export_trajectories", {"session_id": s.session_id, "style": "weird"}, timeout=10)
    assert r.status_code == 400 and time.monotonic() - t0 < 5
    assert not s.ended and s.session_id in gw.sessions


@pytest.mark.timeout(60)
def test_an_export_that_fails_keeps_the_session(served, monkeypatch):
    """Whatever goes wrong while exporting (here: a bug of ours, a 500), the session stays to be exported again."""
    gw, srv = served
    s = one_call_session(gw, srv)
    gw.end_session(s)
    real = areal.export_pieces

    def broken(*a, **kw):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(areal, "export_pieces", broken)
    r = post(srv, "/export_trajectories", {"session_id": s.session_id})
    assert r.status_code == 500 and "disk on fire" in r.json()["error"]["message"]
    assert s.session_id in gw.sessions
    monkeypatch.setattr(areal, "export_pieces", real)
    assert post(srv, "/export_trajectories", {"session_id": s.session_id}).status_code == 200


@pytest.mark.timeout(60)
def test_an_export_waiting_for_the_end_stops_when_the_client_leaves(served):
    gw, srv = served
    s = one_call_session(gw, srv)
    with pytest.raises(httpx.ReadTimeout):
        post(srv, "/export_trajectories", {"session_id": s.session_id}, timeout=0.5)
    # the abandoned wait ended: nothing holds the session; it is still there, ended later, exported once
    for _ in range(100):
        if not srv.server.config.app.waiting:
            break
        time.sleep(0.05)
    assert srv.server.config.app.waiting == 0
    assert s.session_id in gw.sessions and not s.ended
    post(srv, "/rl/end_session", {}, s.api_key)
    assert post(srv, "/export_trajectories", {"session_id": s.session_id}).status_code == 200


@pytest.mark.timeout(60)
def test_an_export_waiting_for_the_end_gets_its_answer_when_the_session_ends(served):
    gw, srv = served
    s = one_call_session(gw, srv)
    out = {}
    th = threading.Thread(target=lambda: out.update(r=post(srv, "/export_trajectories", {"session_id": s.session_id})))
    th.start()
    time.sleep(0.3)
    assert th.is_alive()  # AReaL's contract: it waits for the end
    post(srv, "/rl/end_session", {}, s.api_key)
    th.join(10)
    assert out["r"].status_code == 200 and len(out["r"].json()["interactions"]) == 1


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_the_first_ctrl_c_stops_a_gateway_with_an_export_waiting(tmp_path):
    """``envhub gateway`` with an export waiting on a session that never ends: one SIGINT stops it (the waiting
    client gets a 503 saying so), where before the fix uvicorn waited for that request forever."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "envhub.cli", "gateway", "--model", "golden", "--policy",
                             "gw_helpers:agent_policy", "--tokenizer", "tiny", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            env={**env, "PYTHONPATH": str(Path(__file__).parent)},
                            # SIGINT at its default, as from a terminal: under `cmd &` (CI) it is inherited ignored,
                            # and uvicorn re-raises the SIGINT it handled into that ignored disposition (exit 0)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        import json

        url = json.loads(line)["gateway"]
        sid = httpx.post(url + "/sessions", json={"task_id": "x"}).json()["session_id"]
        out = {}
        th = threading.Thread(target=lambda: out.update(r=httpx.post(url + "/export_trajectories",
                                                                      json={"session_id": sid}, timeout=60)))
        th.start()
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=20)
        th.join(20)
        err = proc.stderr.read()
        assert rc == 130 and "Traceback" not in err and "stopped" in err, err  # 130: stopped by SIGINT
        assert out["r"].status_code == 503 and "shutting down" in out["r"].json()["error"]["message"]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_waits_stop_with_the_app_even_without_a_server(tiny_tokenizer):
    """The app's own stop (what the server's shutdown calls) ends a wait; the session is kept."""
    from envhub.gateway.app import GatewayApp, HTTPError

    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    app = GatewayApp(gw)

    async def run():
        s = gw.start_session("w")
        never = asyncio.Event()

        async def receive():
            await never.wait()
            return {"type": "http.disconnect"}

        task = asyncio.ensure_future(app._control("/export_trajectories", {"session_id": s.session_id}, None,
                                                  receive))
        await asyncio.sleep(0.05)
        assert not task.done()
        app.stop()
        with pytest.raises(HTTPError) as e:
            await asyncio.wait_for(task, 5)
        return s, e.value

    s, err = asyncio.run(run())
    assert err.status == 503 and s.session_id in gw.sessions
