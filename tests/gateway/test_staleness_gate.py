"""The gateway admits every session through the staleness gate (envhub.rollout.staleness), whichever way it is
started -- AReaL's ``/rl/start_session``, envhub's ``/sessions``, a grant, the Python API -- so no session bypasses
it (AReaL#1481: online sessions trained stale data even at eta = 0). Real gateway on loopback, real tokenizer."""
from __future__ import annotations

import httpx
import pytest
from gw_helpers import TOOLS, agent_policy

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread
from envhub.rollout import staleness as st
from envhub.rollout.staleness import NoCapacity, StalenessGate

pytestmark = pytest.mark.timeout(180)
ADMIN = "admin-key"


@pytest.fixture
def gated(tiny_tokenizer):
    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    with GatewayThread(gw, token=ADMIN) as srv:
        yield srv, gw


def post(srv, path, body, key=ADMIN):
    return httpx.post(srv.url + path, json=body, headers={"Authorization": f"Bearer {key}"}, timeout=30)


def one_call(srv, key):
    r = post(srv, "/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "List files."}],
                                        "tools": TOOLS}, key)
    assert r.status_code == 200, r.text


def started_beyond_capacity(srv, gw) -> list[str]:
    """With eta = 0 and B = 2, fill the gate, then try every way of starting a session; returns the ways that got
    one anyway (a bypass)."""
    assert post(srv, "/staleness", {"max_staleness": 0, "batch_size": 2}).status_code == 200
    assert post(srv, "/sessions", {"task_id": "a"}).status_code == 200
    assert post(srv, "/grant_capacity", {}).json() == {"capacity": 1}
    assert post(srv, "/rl/start_session", {"task_id": "b"}).status_code == 200  # spends the grant
    bypass = []
    for route in ("/sessions", "/rl/start_session", "/grant_capacity"):
        r = post(srv, route, {"task_id": "late"})
        if r.status_code != 429:
            bypass.append(f"POST {route}: {r.status_code}")
        elif "capacity" not in r.text:
            bypass.append(f"POST {route}: 429 without saying why: {r.text}")
    try:
        gw.start_session("python")
        bypass.append("Gateway.start_session")
    except NoCapacity:
        pass
    return bypass


def test_no_route_starts_a_session_beyond_capacity(gated):
    srv, gw = gated
    assert started_beyond_capacity(srv, gw) == []
    status = httpx.get(srv.url + "/staleness", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert (status["capacity"], status["running"], status["refused"]) == (0, 2, 4)
    # the trainer moves on: the sessions of version 0 ended and were consumed, two more may start
    for sid in ("a-0", "b-0"):
        one_call(srv, gw.sessions[sid].api_key)  # an empty session would be rejected and give its slot back
        gw.end_session(gw.sessions[sid])
    assert post(srv, "/sessions", {"task_id": "c"}).status_code == 429
    assert post(srv, "/staleness/report", {"version": 1, "consumed": 2}).json()["capacity"] == 2
    assert post(srv, "/sessions", {"task_id": "c"}).status_code == 200
    assert post(srv, "/rl/start_session", {"task_id": "d"}).status_code == 200  # a gate that bounds: no grant needed


def test_a_session_path_that_skips_the_gate_is_caught(gated, monkeypatch):
    srv, gw = gated
    # as if start_session admitted without asking the rule: the check above must see the bypass
    monkeypatch.setattr(StalenessGate, "acquire_now", lambda self, kind="rollout", on_stale=None:
                        st.Lease(-1, self.version, kind))
    assert started_beyond_capacity(srv, gw) != []


def test_a_session_ending_stale_is_withheld_and_marked(gated):
    srv, gw = gated
    post(srv, "/staleness", {"max_staleness": 0, "batch_size": 1, "mode": "withhold"})
    key = post(srv, "/sessions", {"task_id": "slow"}).json()["api_key"]
    one_call(srv, key)
    post(srv, "/staleness/report", {"version": 1})  # the trainer moved on while the agent worked
    assert post(srv, "/rl/end_session", {}, key).status_code == 200
    summary = httpx.get(srv.url + "/sessions/slow-0", headers={"Authorization": f"Bearer {ADMIN}"}).json()
    assert "stale_withheld" in summary["flags"]
    trajs = post(srv, "/sessions/slow-0/trajectories", {}).json()["trajectories"]
    assert trajs and all("stale_withheld" in t["details"]["flags"] for t in trajs)
    s = gw.gate.status()
    assert (s["withheld"], s["running"]) == (1, 0)


def test_sessions_release_their_admission_however_they_end(gated):
    srv, gw = gated
    post(srv, "/staleness", {"max_staleness": 0, "batch_size": 3})
    fine = post(srv, "/sessions", {"task_id": "fine"}).json()
    one_call(srv, fine["api_key"])
    post(srv, "/sessions", {"task_id": "empty"})                 # never called the model
    swept = gw.start_session("swept")
    post(srv, "/rl/end_session", {}, fine["api_key"])
    gw.end_session(gw.sessions["empty-0"])
    gw.drop_session(swept)                                       # dropped (the idle sweep does this) before ending
    s = gw.gate.status()
    assert (s["running"], s["accepted"], s["rejected"]) == (0, 1, 2)  # only the session with a reply is accepted


def test_unbounded_gate_keeps_arealS_grant_rule(gated):
    """With no bound configured, the gateway behaves as before: AReaL's route needs a grant, envhub's does not."""
    srv, gw = gated
    assert post(srv, "/rl/start_session", {"task_id": "t"}).status_code == 429
    assert post(srv, "/sessions", {"task_id": "t"}).status_code == 200
    assert post(srv, "/grant_capacity", {}).json() == {"capacity": 1}
    assert post(srv, "/rl/start_session", {"task_id": "t"}).status_code == 200
    assert httpx.get(srv.url + "/stats").json()["capacity"] == 0  # /metrics: the same as Prometheus text (#26)


def test_bad_gate_requests_are_refused_and_change_nothing(gated):
    srv, gw = gated
    post(srv, "/staleness", {"max_staleness": 1, "batch_size": 4})
    before = gw.gate.status()
    for path, body in (("/staleness", {"mode": "skip"}), ("/staleness", {"batch_size": 0}),
                       ("/staleness", {"eta": 1}), ("/staleness/report", {"version": -1}),
                       ("/staleness/report", {"discarded": 5}), ("/staleness/report", {"versoin": 2})):
        r = post(srv, path, body)
        assert r.status_code == 400 and r.json()["error"]["message"], (path, body, r.text)
    assert post(srv, "/staleness/report", {"version": 2}, key="not-admin").status_code == 403
    assert gw.gate.status() == before


def test_a_session_under_a_callers_lease_takes_no_second_slot(tiny_tokenizer):
    """How a harness episode of a rollout-service job starts its session: under the job's lease, on the service's
    own gate (one budget for jobs and sessions). The gateway neither admits again nor releases the job's lease."""
    gate = StalenessGate(max_staleness=0, batch_size=1)
    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer, gate=gate)
    job_lease = gate.acquire_now("job")
    session = gw.start_session("harness", lease=job_lease)
    with pytest.raises(NoCapacity):
        gw.start_session("other")                  # the one slot is the job's
    gw.end_session(session)
    assert gate.status()["running"] == 1 and not job_lease.released  # the job releases it when it finishes
    assert gate.finish(job_lease)["verdict"] == "fresh"
