"""The INIT/RUN/EVAL pipeline over HTTP: cancel in every place a job can be, phase-aware timeouts, plugins that
raise in each stage, and pool sizes."""
from __future__ import annotations

import asyncio
import time

import pytest

from envhub.training.client import RolloutClient

COUNTDOWN = {"env_id": "countdown", "task_id": "countdown-2-0001"}


def slow(task_id: str, **stage_s) -> dict:
    return {"env_id": "svc-slow", "task": {"task_id": task_id, "n": 3, **stage_s}}


async def wait_for(client: RolloutClient, pred, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = (await client.status())[0]
        if pred(st):
            return st
        await asyncio.sleep(0.02)
    raise AssertionError(f"status never matched: {st}")


@pytest.mark.parametrize("stage", ["queued", "init", "run", "eval"])
async def test_cancel_in_each_stage_answers_cancelled_and_frees_the_worker(serve, stage):
    srv = serve(init_workers=1, run_workers=1, eval_workers=1)
    async with RolloutClient(srv.url) as c:
        blocker = None
        if stage == "queued":  # the only INIT worker is busy, so the job waits in the INIT queue
            blocker = asyncio.ensure_future(c.process(slow("b", init_s=30), job_id="blocker", raw=True))
            await wait_for(c, lambda s: s["active_init"] == 1)
            job = asyncio.ensure_future(c.process(slow("q", init_s=0), job_id="victim", raw=True))
            await wait_for(c, lambda s: s["init_queue"] == 1)
        else:
            job = asyncio.ensure_future(c.process(slow("v", **{f"{stage}_s": 30}), job_id="victim", raw=True))
            await wait_for(c, lambda s: s["stages"][stage]["in_flight"] == 1)
        t0 = time.monotonic()
        assert await c.cancel("victim") is True
        d = await asyncio.wait_for(job, 10)
        took = time.monotonic() - t0
        assert d["finish_reason"] == "cancelled" and d["critical_error"] == "cancelled" and d["filter"] is True
        assert d["error"] == "cancelled by request" and d["reward"] == 0.0 and not d["passed"]
        assert took < 5, f"cancel took {took:.1f}s"
        assert await c.cancel("victim") is False  # already finished: nothing to cancel
        if blocker is not None:
            assert await c.cancel("blocker") is True
            assert (await blocker)["finish_reason"] == "cancelled"
        st = await wait_for(c, lambda s: s["total"] == 0)
        assert st["jobs"]["cancelled"] == (2 if blocker else 1) and st["jobs"]["in_flight"] == 0
        ok = await c.process(COUNTDOWN, raw=True)  # every worker is free again
        assert ok["passed"]


async def test_timeouts_count_only_time_inside_stages(serve):
    srv = serve(init_workers=1, run_workers=2, eval_workers=1, timeout_s=1.0)
    async with RolloutClient(srv.url) as c:
        # INIT alone exceeds the budget
        d = await c.process(slow("i", init_s=3), raw=True)
        assert d["finish_reason"] == "timeout" and d["critical_error"] == "timeout" and "INIT" in d["error"]
        assert d["timing"]["timeout_triggered"] and 0.9 < d["timing"]["counted_elapsed"] < 2.0
        # many short RUN turns add up across the stage
        d = await c.process(slow("r", run_s=0.25, turns=20), raw=True)
        assert d["finish_reason"] == "timeout" and "RUN" in d["error"] and 0 < d["num_turns"] < 20
        # a request can set its own budget
        d = await c.process(slow("e", eval_s=0.6), timeout=0.3, raw=True)
        assert d["finish_reason"] == "timeout" and "EVAL" in d["error"]
        # 1.5 s waiting in the INIT queue behind a slow job does not count: 0.8 s inside stages passes
        blocker = asyncio.ensure_future(c.process(slow("b", init_s=0.9), raw=True))
        await wait_for(c, lambda s: s["active_init"] == 1)
        d = await c.process(slow("w", init_s=0.4, run_s=0.2, eval_s=0.2), raw=True)
        assert d["finish_reason"] == "done" and d["passed"], d["error"]
        assert d["timing"]["others_time"] > 0.3 and d["timing"]["counted_elapsed"] < 1.0
        assert d["timing"]["counted_elapsed"] + d["timing"]["others_time"] > 1.0  # wall time did exceed 1 s
        assert (await blocker)["finish_reason"] == "done"
        st = (await c.status())[0]
    assert st["jobs"]["timeout"] == 3 and st["jobs"]["done"] == 2


@pytest.mark.parametrize("env_id,task_id,stage,words", [
    ("svc-raise-make", "rm-0", "init", "cannot be constructed"),
    ("svc-raise-init", "ri-0", "init", "plugin bug in reset"),
    ("svc-raise-run", "rr-0", "run", "plugin bug in step"),
    ("svc-raise-eval", "re-0", "eval", "plugin bug in the verifier"),
    ("svc-raise-aeval", "ra-0", "eval", "KeyError: 'plugin bug in averify'"),
])
async def test_a_plugin_raising_in_a_stage_gives_a_marked_trajectory(serve, env_id, task_id, stage, words):
    srv = serve()
    async with RolloutClient(srv.url) as c:
        bad = await asyncio.gather(*(c.process({"env_id": env_id, "task_id": task_id}, raw=True) for _ in range(3)))
        ok = await c.process(COUNTDOWN, raw=True)
        st = (await c.status())[0]
    for d in bad:
        assert d["finish_reason"] == "error" and d["critical_error"] == stage and d["filter"] is True
        assert stage.upper() in d["error"] and words in d["error"] and d["reward"] == 0.0
        assert d["prompt_ids"] == [] or stage != "init"
        assert set(d["timing"]) >= {"init_time", "run_time", "eval_time"}
    assert ok["passed"]  # the server keeps serving
    assert st["jobs"]["failed"] == 3 and st["jobs"]["done"] == 1 and st["total"] == 0


async def test_agent_text_that_reads_like_a_grader_crash_is_a_wrong_answer_not_a_failed_job(serve):
    """The service marks a grader crash from ``Score.crashed``; an agent whose answer the verifier quotes cannot
    get its failures filtered out of training by answering "verifier crashed: ..."."""
    srv = serve()
    async with RolloutClient(srv.url) as c:
        d = await c.process({"env_id": "svc-crash-text", "task_id": "ct-1"}, raw=True)
    assert d["finish_reason"] == "done" and d["error"] is None and d["filter"] is False, d
    assert d["reward"] == 0.0 and not d["passed"] and d["critical_error"] is None


async def test_each_stage_runs_at_most_its_pool_size(serve):
    srv = serve(init_workers=2, run_workers=3, eval_workers=1)
    async with RolloutClient(srv.url) as c:
        jobs = [asyncio.ensure_future(c.process(slow(f"p{i}", init_s=0.15, run_s=0.1, eval_s=0.1), raw=True))
                for i in range(8)]
        peaks = {"init": 0, "run": 0, "eval": 0}
        while not all(j.done() for j in jobs):
            st = (await c.status())[0]
            for s in peaks:
                peaks[s] = max(peaks[s], st["stages"][s]["in_flight"])
            await asyncio.sleep(0.01)
        results = [j.result() for j in jobs]
    assert all(d["passed"] for d in results)
    assert peaks["init"] == 2 and 1 <= peaks["run"] <= 3 and peaks["eval"] == 1
