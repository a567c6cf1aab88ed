"""Sandboxes at scale in one service: a node's limit queues jobs instead of failing them, lazy sandboxes cost
nothing until a tool needs them, and (slow tier) a thousand sandboxed rollouts live at once with 0 init errors and
0 orphans after ``/stop``."""
from __future__ import annotations

import asyncio
import json
import os
import statistics
import threading
import time

import pytest

from envhub.training.client import RolloutClient
from envhub.service.golden import GoldenBackend

pytestmark = pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap (make sys-deps)")


async def _watch(url: str, seen: dict, stop: asyncio.Event) -> None:
    async with RolloutClient(url) as w:
        while not stop.is_set():
            sb = (await w.status())[0]["sandboxes"]
            seen["max_live"] = max(seen.get("max_live", 0), sb["live"])
            seen["max_waiting"] = max(seen.get("max_waiting", 0), sb["waiting"])
            seen["limit"] = sb["limit"]
            await asyncio.sleep(0.05)


async def test_at_the_sandbox_limit_jobs_wait_in_init_and_all_finish(serve):
    srv = serve(max_sandboxes=2, init_workers=6, run_workers=6, sandbox_pool=0)
    seen: dict = {}
    stop = asyncio.Event()
    async with RolloutClient(srv.url) as c:
        watcher = asyncio.ensure_future(_watch(srv.url, seen, stop))
        results = await asyncio.gather(*(c.process({"env_id": "svc-hold", "task_id": f"hold-{i}"}, raw=True)
                                         for i in range(6)))
        stop.set()
        await watcher
    assert [r["finish_reason"] for r in results] == ["done"] * 6, [r["error"] for r in results]
    assert all(r["passed"] for r in results)
    assert seen["limit"] == 2 and seen["max_live"] <= 2, seen  # never more than the limit at once
    assert seen["max_waiting"] >= 1, seen  # the others waited (and /status said so) instead of failing


async def test_a_lazy_sandbox_starts_only_when_a_tool_needs_it(serve):
    from envhub import get_spec

    env = get_spec("svc-lazy").make()
    started = []

    def factory(spec):
        from envhub.sandbox import start

        started.append(spec)
        return start(spec)

    env.sandbox_factory = factory
    try:
        env.reset(options={"task": {"task_id": "lazy-0", "n": 3, "sleep": 0}})
        assert not env.sandbox_started and started == []  # reset started nothing
        env.step("no tool call this turn")  # a reminder, no sandbox
        assert not env.sandbox_started and started == []
        env.step(_two_calls())  # two tool calls in one turn (run in parallel): one sandbox
        assert env.sandbox_started and len(started) == 1
        box = env.sandbox
        env.release_sandbox()
        assert box.stopped and not env.sandbox_started
        env.reset(options={"task": {"task_id": "lazy-1", "n": 4, "sleep": 0}})
        env.close()  # an episode that never used its sandbox: nothing to stop, nothing started
        assert len(started) == 1
    finally:
        env.close()


def _two_calls():
    from envhub import Action, ToolCall

    return Action(text="", tool_calls=[ToolCall(name="bash", arguments={"cmd": "echo a"}, id="c1"),
                                       ToolCall(name="bash", arguments={"cmd": "echo b"}, id="c2")])


# ---- the slow tier: a thousand live sandboxes ------------------------------------------------------------------------
LIVE = int(os.environ.get("ENVHUB_SCALE_SANDBOXES", "1000"))


class HoldingBackend(GoldenBackend):
    """The golden player, but a session's second model call (made after its tool call, i.e. with its sandbox live
    and its shell started) waits until ``target`` sessions have got there, or until released: a stand-in for a slow
    model that keeps every episode alive at once. ``all_live`` is set (a threading event) when they all have."""

    def __init__(self, target: int, hold_s: float):
        super().__init__()
        self.target, self.hold_s = target, hold_s
        self.calls: dict[str, int] = {}
        self.waiting = 0
        self.all_live = threading.Event()
        self.release: asyncio.Event | None = None
        self.loop: asyncio.AbstractEventLoop | None = None

    async def generate(self, prompt_ids, params, *, session_id=None):
        n = self.calls[session_id] = self.calls.get(session_id, 0) + 1
        if n == 2:
            if self.release is None:
                self.release, self.loop = asyncio.Event(), asyncio.get_running_loop()
            self.waiting += 1
            if self.waiting >= self.target:
                self.all_live.set()
            try:
                await asyncio.wait_for(self.release.wait(), self.hold_s)
            except asyncio.TimeoutError:
                pass
        return await super().generate(prompt_ids, params, session_id=session_id)


def _pss_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


@pytest.mark.slow
async def test_a_thousand_live_sandboxed_rollouts_on_one_node(serve):
    from envhub.sandbox import lifecycle
    from envhub.sandbox.common import sandbox_root

    backend = HoldingBackend(LIVE, hold_s=600)
    srv = serve(backends=[backend], init_workers=32, run_workers=LIVE + 16, eval_workers=8, sandbox_pool=0,
                timeout_s=900)
    t0 = time.monotonic()
    async with RolloutClient(srv.url, connect_timeout_s=120) as c:
        jobs = [asyncio.ensure_future(c.process({"env_id": "svc-hold", "task_id": f"hold-{i % 8}",
                                                 "trajectory_id": i}, job_id=f"live-{i}", raw=True))
                for i in range(LIVE)]
        ok = await asyncio.to_thread(backend.all_live.wait, 600)
        started_s = time.monotonic() - t0
        st = (await c.status())[0]
        mine = {sb.id for sb in lifecycle.live()}  # this process's sandboxes (other test runs may share the host)
        ours = {sid: pids for sid, pids in lifecycle.sandbox_pids().items() if sid in mine}
        pss_mb = sum(_pss_kb(p) for pids in ours.values() for p in pids) / 1024
        procs = sum(len(p) for p in ours.values())
        assert ok, f"only {backend.waiting} of {LIVE} episodes got a live sandbox; status {st}"
        assert st["sandboxes"]["live"] >= LIVE and len(ours) >= LIVE, (st["sandboxes"], len(ours))
        backend.loop.call_soon_threadsafe(backend.release.set)  # every episode is alive: let them finish
        results = await asyncio.gather(*jobs)
        wall = time.monotonic() - t0
        stopped = await c.stop()
    errors = [r["error"] for r in results if r["finish_reason"] != "done"]
    assert not errors, f"{len(errors)} failed, e.g. {errors[:3]}"
    assert sum(r["critical_error"] == "init" for r in results) == 0
    init_s = [r["metrics"]["init_s"] for r in results]
    left = {sid for sid in lifecycle.sandbox_pids() if sid in ours}
    assert not left, f"{len(left)} sandboxes left processes after /stop"
    leftover_dirs = [d for d in os.listdir(sandbox_root()) if d in ours]
    assert not leftover_dirs, leftover_dirs
    figures = {"live_sandboxes": LIVE, "all_live_after_s": round(started_s, 1), "wall_s": round(wall, 1),
               "jobs_per_s": round(LIVE / wall, 1), "pss_per_sandbox_mb": round(pss_mb / max(1, len(ours)), 2),
               "processes_per_sandbox": round(procs / max(1, len(ours)), 1),
               "init_p50_s": round(statistics.median(init_s), 3),
               "init_p99_s": round(sorted(init_s)[int(0.99 * (len(init_s) - 1))], 3), "stopped": stopped}
    print("\nSCALE", json.dumps(figures))
