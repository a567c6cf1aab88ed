"""Backends added and cleared while rollouts run (a trainer's checkpoint swap), against real HTTP LLM servers.

The LLM servers are the backends tier's named stand-in for vLLM (``tests/backends/standin_server.py``: aiohttp on
loopback, vLLM's ``/v1/completions`` token-id shapes, tokens sampled by the tiny real model through the ``hf``
backend). vLLM itself needs its own virtualenv and ~20 s to start, so the service tests use the stand-in.
"""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import pytest

from envhub.rollout.fidelity import check_trajectory
from envhub.rollout.trajectory import Trajectory
from envhub.training.client import RolloutClient

sys.path.insert(0, str(Path(__file__).parents[1] / "backends"))
from standin_server import StandIn  # noqa: E402

# random tokens from the tiny model; a third of the vocabulary ends a turn, so turns end "stop", not "length"
PARAMS = {"max_tokens": 12, "temperature": 1.0, "max_turns": 6, "stop_token_ids": list(range(3, 300))}


@pytest.fixture
def hf(tiny_model_path):
    from envhub.backends.hf import HFBackend

    # one torch thread: on a small, busy host torch's default (one per core) thrashes, ~50x slower here
    return HFBackend(tiny_model_path, num_threads=1)


async def test_swapping_llm_servers_mid_run_disturbs_no_rollout(serve, hf, tiny_tokenizer):
    import envhub

    ids = [r["task_id"] for r in envhub.get_spec("guess-number").load_tasks()][:4]
    old = await StandIn(hf, delay_s=0.1).start()
    new = await StandIn(hf, delay_s=0.02).start()
    srv = serve(backends=[], run_workers=8)
    try:
        async with RolloutClient(srv.url) as c:
            added = await c.add_llm_server(old.url + "/v1")  # ProRL clients send the /v1 base URL
            assert added[0]["backends"] == [old.url]
            # more turns than the other tests: every rollout must still be running when the swap comes, even on a
            # busy host where the four start far apart
            params = {**PARAMS, "max_turns": 12}
            jobs = [asyncio.ensure_future(c.process({"env_id": "guess-number", "task_id": t}, params, raw=True))
                    for t in ids]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # all four sessions on the old server (sticky), a turn or more each
                st = (await c.status())[0]
                if st["backends"][0]["assigned"] == 4 and len(old.bodies) >= 4:
                    break
                await asyncio.sleep(0.01)
            assert st["backends"][0]["name"] == old.url and st["backends"][0]["assigned"] == 4  # sticky sessions
            assert not any(j.done() for j in jobs)

            cleared = await c.clear_llm_server()  # checkpoint swap: old server out, a moment with none, new in
            assert cleared[0]["removed"] == [old.url]
            served_by_old = len(old.bodies)
            await asyncio.sleep(0.3)
            # a rollout whose turn was in flight on the old server may end with that turn; the others wait for a
            # backend instead of failing
            assert sum(not j.done() for j in jobs) >= 2
            await c.add_llm_server(new.url)
            results = await asyncio.wait_for(asyncio.gather(*jobs), 120)
            later = await c.process({"env_id": "guess-number", "task_id": ids[0]}, params, raw=True)
            st = (await c.status())[0]
    finally:
        await old.stop()
        await new.stop()
        await hf.close()
    for d in results + [later]:
        assert d["finish_reason"] in ("max_turns", "done", "length") and d["error"] is None, d["error"]
        assert d["critical_error"] is None
        assert check_trajectory(Trajectory.from_dict(d), tiny_tokenizer) == []
    assert len(old.bodies) == served_by_old  # nothing reached the old server after it was cleared
    assert len(new.bodies) >= sum(d["num_turns"] for d in results) - served_by_old  # the rest went to the new one
    assert [b["name"] for b in st["backends"]] == [new.url] and st["backends"][0]["assigned"] == 0
    assert st["jobs"]["done"] == 5 and st["jobs"]["failed"] == 0


async def test_two_llm_servers_share_rollouts_by_assignment(serve, hf):
    a = await StandIn(hf, delay_s=0.05).start()
    b = await StandIn(hf, delay_s=0.05).start()
    srv = serve(backends=[a.url, b.url], run_workers=8)
    try:
        async with RolloutClient(srv.url) as c:
            t0 = time.monotonic()
            results = await asyncio.gather(*(c.process({"env_id": "countdown", "task_id": f"countdown-2-000{i}"},
                                                       {"max_tokens": 4}, raw=True) for i in range(8)))
            assert time.monotonic() - t0 < 60
    finally:
        await a.stop()
        await b.stop()
        await hf.close()
    assert all(d["error"] is None for d in results), [d["error"] for d in results]
    assert len(a.bodies) == len(b.bodies) == 4  # least-assigned first: 8 single-turn rollouts split 4 / 4
