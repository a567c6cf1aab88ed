"""Weight updates through the gateway (#25 point 2): a black-box client's call stays one uninterrupted reply across
``/pause`` → new weights → ``/resume``, in hold and abort modes, streaming or not; every sampled token is recorded
with the version that sampled it, in the session's trajectories and in AReaL's export."""
from __future__ import annotations

import threading
import time

import httpx
import pytest

from envhub.gateway import Gateway, GatewayThread, build
from envhub.gateway.areal import decode_tensor

torch = pytest.importorskip("torch")
openai = pytest.importorskip("openai")

pytestmark = pytest.mark.timeout(180)
ADMIN = "admin-key"


@pytest.fixture
def gateway(tiny_model_path, tiny_tokenizer):
    from envhub.backends.hf import HFBackend

    backend = HFBackend(tiny_model_path)
    gw = Gateway(backend, tiny_tokenizer)
    with GatewayThread(gw, token=ADMIN) as srv:
        yield srv, gw, backend


def admin(srv, path, body):
    return httpx.post(srv.url + path, json=body, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=60)


def perturb(backend, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in backend.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))


def test_a_streaming_call_waits_out_a_pause_in_one_stream(gateway):
    srv, gw, backend = gateway
    s = gw.start_session("t")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=s.api_key, max_retries=0, timeout=60)
    assert admin(srv, "/pause", {"mode": "hold"}).status_code == 200
    out: dict = {}

    def call():
        chunks = list(client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "Count to ten."}], max_tokens=24, stream=True))
        out["chunks"] = chunks

    t = threading.Thread(target=call)
    t.start()
    time.sleep(1.0)
    assert "chunks" not in out  # held: the client is still waiting, nothing was answered
    perturb(backend, 1)
    assert admin(srv, "/resume", {"version": 3}).json()["version"] == 3
    t.join(60)
    chunks = out["chunks"]
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes in (["stop"], ["length"])  # one stream, one end
    gw.end_session(s)
    (traj,) = build(s)
    sampled = [v for v, m in zip(traj.response_versions, traj.response_mask) if m]
    assert sampled and set(sampled) == {3}


def test_an_abort_mid_generation_is_re_sent_and_the_client_gets_one_whole_reply(gateway):
    srv, gw, backend = gateway
    for attempt in range(6):  # the pause must land inside the generation; a reply that ended first is retried
        s = gw.start_session(f"t{attempt}")
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=s.api_key, max_retries=0, timeout=60)
        out: dict = {}

        def call(client=client, out=out):
            out["reply"] = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "Write a long story."}], max_tokens=600)

        start, aborted = backend.tokens_sampled, gw.lifecycle.status()["aborted"]
        t = threading.Thread(target=call)
        t.start()
        deadline = time.monotonic() + 30
        while backend.tokens_sampled - start < 5 and time.monotonic() < deadline:
            time.sleep(0.001)
        r = admin(srv, "/pause", {"mode": "abort"})
        assert r.status_code == 200, r.text
        perturb(backend, 2 + attempt)
        version = gw.lifecycle.version + 1
        admin(srv, "/resume", {"version": version})
        t.join(60)
        if gw.lifecycle.status()["aborted"] > aborted:
            break
    else:
        pytest.fail("no pause landed inside a generation in 6 tries")
    reply = out["reply"]
    (call_record,) = [c for c in s.calls if c.ok]
    assert reply.usage.completion_tokens == len(call_record.sampled_ids)
    if reply.choices[0].finish_reason == "length":
        assert len(call_record.sampled_ids) == 600
    versions = call_record.versions
    assert versions[0] == version - 1 and versions[-1] == version and sorted(versions) == versions  # two versions
    gw.end_session(s)
    (inter,) = gw_export(srv, s)["interactions"].values()
    td = inter["tensor_dict"]
    v, m = decode_tensor(td["versions"])[0], decode_tensor(td["loss_mask"])[0]
    assert set(v[m == 1].tolist()) == {version - 1, version} and set(v[m == 0].tolist()) == {-1}
    assert "mixed_policy_versions" in s.flags


def lifecycle_counts(gw):
    return gw.lifecycle.status()


def gw_export(srv, s):
    r = admin(srv, "/export_trajectories", {"session_id": s.session_id})
    assert r.status_code == 200, r.text
    return r.json()


def test_misuse_gets_a_409_that_says_why(gateway):
    srv, _, _ = gateway
    r = admin(srv, "/resume", {"version": 1})
    assert r.status_code == 409 and "without a pause" in r.text
    assert admin(srv, "/pause", {"mode": "sometimes"}).status_code == 400
    assert httpx.post(srv.url + "/pause", json={}).status_code in (401, 403)  # admin only
    assert admin(srv, "/pause", {}).status_code == 200
    assert admin(srv, "/resume", {"version": 5}).status_code == 200
    r = admin(srv, "/rl/set_version", {"version": 2})
    assert r.status_code == 409 and "backwards" in r.text
