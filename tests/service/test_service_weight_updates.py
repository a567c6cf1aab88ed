"""``POST /pause`` / ``POST /resume`` on the rollout service over real HTTP, with the real ``hf`` backend: a job
submitted while paused waits (its timeout does not run), continues after the resume, and every model token of its
reply is tagged with the resumed version (per assistant message too); misuse gets a 409 that says why."""
from __future__ import annotations

import asyncio
import time

import httpx
import pytest

import envhub

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def hf_serve(serve, tiny_model_path):
    from envhub.backends.hf import HFBackend

    def start(**kw):
        return serve(backends=[HFBackend(tiny_model_path)], **kw)

    return start


def job(timeout: float) -> dict:
    row = dict(envhub.get_spec("guess-number").load_tasks()[0])
    return {"instance": {"env_id": "guess-number", "task": row},
            "sampling_params": {"max_tokens": 16, "temperature": 1.0, "seed": 1, "max_turns": 2}, "timeout": timeout}


async def paused_job(srv) -> dict:
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        assert (await c.post("/pause", json={"mode": "hold"})).status_code == 200
        t0 = time.monotonic()
        pending = asyncio.create_task(c.post("/process", json=job(timeout=3.0)))
        await asyncio.sleep(4.0)  # more than the job's timeout, all of it paused
        weights = (await c.get("/status")).json()["weights"]
        assert weights["paused"] and weights["mode"] == "hold"
        r = await c.post("/resume", json={"version": 5})
        assert r.status_code == 200 and r.json()["version"] == 5
        reply = await pending
        assert reply.status_code == 200, reply.text
        return {**reply.json(), "waited_s": time.monotonic() - t0}


async def test_a_job_waits_out_a_pause_and_is_tagged_with_the_new_version(hf_serve):
    d = await paused_job(hf_serve())
    assert d["waited_s"] >= 4.0
    assert d["finish_reason"] in ("max_turns", "length", "done"), d["error"]
    assert d["critical_error"] is None
    versions, mask = d["response_versions"], d["response_mask"]
    assert len(versions) == len(d["response_ids"]) and sum(mask) > 0
    assert all(v == 5 for v, m in zip(versions, mask) if m) and all(v == -1 for v, m in zip(versions, mask) if not m)
    assistant = [m for m in d["messages"] if m.get("role") == "assistant"]
    assert assistant and all(m["versions"] == [5] * len(m["token_ids"]) for m in assistant)
    assert d["metrics"]["paused_s"] >= 3.5


async def test_paused_time_counting_towards_the_timeout_would_fail_the_job(hf_serve, monkeypatch):
    """The defence off (the job timer counts paused time): the same job times out."""
    from envhub.service import jobs

    monkeypatch.setattr(jobs.PhaseTimer, "_split", lambda self, now: (now - self._since, 0.0))
    d = await paused_job(hf_serve())
    assert d["finish_reason"] == "timeout"


async def test_misuse_gets_a_409_that_says_why(hf_serve):
    srv = hf_serve()
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as c:
        r = await c.post("/resume", json={"version": 1})
        assert r.status_code == 409 and "without a pause" in r.json()["detail"]
        assert (await c.post("/pause", json={"mode": "sometimes"})).status_code == 422
        assert (await c.post("/pause", json={})).status_code == 200
        r = await c.post("/pause", json={})
        assert r.status_code == 409 and "already paused" in r.json()["detail"]
        assert (await c.post("/resume", json={"version": 4})).status_code == 200
        assert (await c.post("/pause", json={"mode": "abort"})).status_code == 200
        r = await c.post("/resume", json={"version": 2})
        assert r.status_code == 409 and "backwards" in r.json()["detail"]
        assert (await c.post("/resume", json={})).status_code == 200
        assert (await c.get("/status")).json()["weights"]["version"] == 4
