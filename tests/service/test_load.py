"""Load: 10,000 concurrent ``/process`` jobs against one ``envhub serve`` process (countdown, golden player through
the real tokenizer). Every job is answered exactly once; wall time and peak memory are printed (``-s``) and bounded.
"""
from __future__ import annotations

import asyncio
import json
import os
import time

import pytest
from svc_helpers import spawn_server

from envhub.training.client import RolloutClient
from envhub.http.server import raise_fd_limit

JOBS = int(os.environ.get("ENVHUB_LOAD_JOBS", "10000"))


def peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@pytest.mark.slow
@pytest.mark.serial  # its clients' retry count is a timing: a starved host (3 other test workers) makes retries
async def test_ten_thousand_concurrent_jobs_all_answered_once():
    if raise_fd_limit() < JOBS + 512:
        pytest.skip(f"needs {JOBS + 512} open files (ulimit -n)")
    proc, url, _ = spawn_server("--backend", "golden", "--init-workers", "8", "--run-workers", "16",
                                "--eval-workers", "8")
    try:
        import envhub

        ids = [r["task_id"] for r in envhub.get_spec("countdown").load_tasks()]
        async with RolloutClient(url, retries=10, backoff_s=0.5, connect_timeout_s=60) as c:
            base_rss = peak_rss_mb(proc.pid)
            t0 = time.monotonic()
            jobs = [c.process({"env_id": "countdown", "task_id": ids[i % len(ids)], "trajectory_id": i},
                              {"temperature": 1.0}, job_id=f"load-{i}", raw=True) for i in range(JOBS)]
            peak = {"pending": 0, "queued": 0}

            async def watch():  # how many jobs the server holds at once (requests admitted, not yet answered)
                async with RolloutClient(url) as w:
                    while True:
                        st = (await w.status())[0]
                        peak["pending"] = max(peak["pending"], st["pending_jobs"])
                        peak["queued"] = max(peak["queued"], st["init_queue"] + st["run_queue"] + st["eval_queue"])
                        await asyncio.sleep(0.5)

            watcher = asyncio.ensure_future(watch())
            results = await asyncio.gather(*jobs, return_exceptions=True)
            wall = time.monotonic() - t0
            watcher.cancel()
            st = (await c.status())[0]
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, f"{len(errors)} jobs raised, e.g. {errors[0]!r}"
        assert [r["job_id"] for r in results] == [f"load-{i}" for i in range(JOBS)]  # each answer is its own job's
        assert [r["trajectory_id"] for r in results] == list(range(JOBS))
        assert all(r["passed"] and r["finish_reason"] == "done" for r in results)
        assert st["jobs"]["submitted"] == JOBS and st["jobs"]["done"] == JOBS  # none lost, none run twice
        figures = {"jobs": JOBS, "wall_s": round(wall, 1), "jobs_per_s": round(JOBS / wall, 1),
                   "server_rss_start_mb": round(base_rss), "server_peak_rss_mb": round(peak_rss_mb(proc.pid)),
                   "client_peak_rss_mb": round(peak_rss_mb(os.getpid())), "client_retries": c.counts["retried"],
                   "joined": st["jobs"]["joined"], "replayed": st["jobs"]["replayed"],
                   "peak_jobs_in_server": peak["pending"], "peak_queued": peak["queued"],
                   "mean_queue_s": round(sum(r["timing"]["others_time"] for r in results) / JOBS, 2)}
        print("\nLOAD", json.dumps(figures))
        assert wall < 900 and figures["server_peak_rss_mb"] < 6000
        # every connection was taken at once: none refused by a connection cap or lost to an accept-queue overflow
        # (with #12's fixed 4,096 cap this run needed 22,761 retries)
        assert c.counts["retried"] == 0, c.counts
    finally:
        proc.terminate()
        proc.wait(120)
