"""``/stop`` and process exit with jobs in flight: every job answered, every sandbox process gone (checked with
psutil over the server's process tree). A real ``envhub serve`` subprocess, real bwrap sandboxes."""
from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from svc_helpers import alive, descendants, spawn_server

from envhub.training.client import RolloutClient

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap (make sys-deps)")


def sandbox_job(task_id: str, sleep: int) -> dict:
    return {"env_id": "svc-sandbox", "task": {"task_id": task_id, "n": 5, "sleep": sleep}}


async def wait_for(client: RolloutClient, pred, timeout: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout
    st = {}
    while time.monotonic() < deadline:
        st = (await client.status())[0]
        if pred(st):
            return st
        await asyncio.sleep(0.05)
    raise AssertionError(f"status never matched: {st}")


def sandbox_pids(server_pid: int) -> list[int]:
    import psutil

    out = []
    for pid in descendants(server_pid):
        try:
            if "bwrap" in psutil.Process(pid).name() or "sleep" in psutil.Process(pid).name():
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow
async def test_stop_with_jobs_in_flight_answers_all_and_leaves_no_process():
    proc, url, _ = spawn_server("--backend", "golden", "--init-workers", "2", "--run-workers", "3",
                                "--eval-workers", "1", "--sandbox-pool", "1")
    try:
        async with RolloutClient(url, retries=0) as c:
            jobs = [asyncio.ensure_future(c.process(sandbox_job(f"sb{i}", 60), raw=True)) for i in range(3)]
            jobs += [asyncio.ensure_future(c.process({"env_id": "svc-slow", "task": {"task_id": f"s{i}", "n": 1,
                                                                                    "init_s": 60}}, raw=True))
                     for i in range(3)]  # two inside INIT, one queued
            st = await wait_for(c, lambda s: s["active_run"] == 3 and s["active_init"] == 2 and s["init_queue"] == 1)
            assert st["sandboxes"]["live"] >= 3
            pids = sandbox_pids(proc.pid)
            assert len(pids) >= 3, descendants(proc.pid)  # bwrap + the agent's `sleep` inside each sandbox

            t0 = time.monotonic()
            stopped = (await c.stop())[0]
            results = await asyncio.wait_for(asyncio.gather(*jobs), 30)
            assert stopped["cancelled"] == 6 and time.monotonic() - t0 < 30
            for d in results:
                assert d["finish_reason"] == "cancelled" and "stopped" in d["error"] and d["filter"]
            st = (await c.status())[0]
            assert st["status"] == "stopped" and st["total"] == 0 and st["sandboxes"]["live"] == 0
            assert alive(pids) == [] and descendants(proc.pid) == []  # no sandbox, no stray child

            await c.start()  # and it starts again, sandboxes included
            d = await c.process(sandbox_job("again", 0), raw=True)
            assert d["passed"] and d["finish_reason"] == "done", d["error"]
    finally:
        proc.kill()
        proc.wait(30)


async def test_init_takes_prewarmed_sandboxes_and_run_frees_its_sandbox_before_eval(serve):
    srv = serve(sandbox_pool=2, init_workers=1, run_workers=1, eval_workers=1)
    async with RolloutClient(srv.url) as c:
        first = await c.process(sandbox_job("w0", 0), raw=True)
        second = await c.process(sandbox_job("w1", 0), raw=True)  # the spec repeats: a pool starts for it
        st = await wait_for(c, lambda s: s["sandboxes"]["ready"] == 2)  # refilled in the background
        assert st["sandboxes"]["pools"] == 1 and st["sandboxes"]["acquired"] == 2
        third = await c.process(sandbox_job("w2", 0), raw=True)
        assert all(d["passed"] for d in (first, second, third)), [d["error"] for d in (first, second, third)]
        st = await wait_for(c, lambda s: s["sandboxes"]["ready"] == 2)
        assert st["sandboxes"]["acquired"] == 3 and st["sandboxes"]["live"] == 2  # only the prewarmed ones

        # during EVAL the episode's sandbox is already gone: only the two waiting in the pool are alive
        job = asyncio.ensure_future(c.process({"env_id": "svc-sandbox", "task": {"task_id": "e", "n": 5, "sleep": 0,
                                                                                  "eval_s": 3}}, raw=True))
        st = await wait_for(c, lambda s: s["active_eval"] == 1 and s["sandboxes"]["ready"] == 2)
        assert st["sandboxes"]["live"] == 2 and st["active_run"] == 0  # 2 in the pool, none held by the job
        assert (await job)["passed"]
        # the answer of the sandbox's command made it into the conversation
        assert any("slept" in m.get("content", "") for m in third["messages"] if m["role"] == "tool")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
@pytest.mark.slow
async def test_process_exit_leaves_no_sandbox_behind(sig):
    proc, url, _ = spawn_server("--backend", "golden", "--sandbox-pool", "2")
    try:
        async with RolloutClient(url, retries=0) as c:
            jobs = [asyncio.ensure_future(c.process(sandbox_job(f"x{i}", 60), raw=True)) for i in range(2)]
            await wait_for(c, lambda s: s["active_run"] == 2)
            pids = sandbox_pids(proc.pid)
            assert len(pids) >= 2
            proc.send_signal(sig)
            assert proc.wait(60) is not None
            gathered = await asyncio.gather(*jobs, return_exceptions=True)
        if sig == signal.SIGTERM:  # a graceful exit answers the jobs (cancelled) before exiting; uvicorn then
            assert proc.returncode in (0, -signal.SIGTERM)  # re-raises the signal, as a process killed by it would
            assert all(not isinstance(g, BaseException) and g["finish_reason"] == "cancelled" for g in gathered)
        deadline = time.monotonic() + 10  # SIGKILL: the kernel's parent-death signal takes the sandboxes down
        while alive(pids) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert alive(pids) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_a_sandbox_that_arrives_after_its_job_closed_is_stopped():
    import threading

    from envhub.sandbox import SandboxError, SandboxSpec, live_sandboxes, start
    from envhub.service.sandboxes import JobSandboxes, SandboxProvider

    gate, started, outcome = threading.Event(), [], []

    def slow_start(spec):  # a reset thread still starting the sandbox when the job is cancelled
        gate.wait(30)
        started.append(start(spec))
        return started[-1]

    job = JobSandboxes(SandboxProvider(pool_size=0, starter=slow_start))

    def reset_thread():
        try:
            outcome.append(job(SandboxSpec(memory_mb=256)))
        except SandboxError as e:
            outcome.append(e)

    t = threading.Thread(target=reset_thread)
    t.start()
    time.sleep(0.05)
    assert job.close() == 0  # nothing held yet
    gate.set()
    t.join(60)
    assert isinstance(outcome[0], SandboxError) and "cancelled" in str(outcome[0])
    assert started and started[0].stopped and started[0] not in live_sandboxes()
    with pytest.raises(SandboxError):
        job(SandboxSpec())


async def test_cancel_while_init_starts_a_sandbox_leaves_none_running(serve):
    srv = serve(sandbox_pool=0)
    async with RolloutClient(srv.url) as c:
        for i in range(3):
            job = asyncio.ensure_future(c.process(sandbox_job(f"c{i}", 60), job_id=f"c{i}", raw=True))
            await wait_for(c, lambda s: s["active_init"] == 1 or s["active_run"] == 1, timeout=30)
            assert await c.cancel(f"c{i}")
            assert (await job)["finish_reason"] == "cancelled"
        st = await wait_for(c, lambda s: s["sandboxes"]["live"] == 0, timeout=30)
        assert st["total"] == 0 and st["jobs"]["cancelled"] == 3
