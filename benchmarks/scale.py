"""Concurrency: N jobs in flight at once in one rollout service (NeMo Gym's figure is 65,000 per instance).

Two ways, same jobs (countdown, a text env: the golden player through the real SmolLM2-sized tokenizer), one run:

* ``in-process``: every job handed to :class:`~envhub.service.service.RolloutService` at once, no HTTP: the
  pipeline's own ceiling on this machine;
* ``over HTTP``: ``envhub serve`` in a subprocess and :class:`~envhub.training.client.RolloutClient` sending all N
  ``/process`` calls at once (one connection per in-flight call, as ProRL's API works).

It checks every job is answered exactly once (its own job id and trajectory id, and the server's counters) and
prints jobs/s for each, their ratio (what HTTP costs at this concurrency: the HTTP layer must not be the
bottleneck), the server's memory per job held (peak RSS growth / peak jobs in the server), latency p50/p99, and how
many connections the client had to retry.

    python benchmarks/scale.py                 # 65,000 jobs (over HTTP, as many connections as descriptors allow)
    python benchmarks/scale.py --jobs 10000
"""
from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def rss_mb(pid: int, key: str = "VmHWM") -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def instances(n: int) -> list[dict]:
    import envhub

    ids = [r["task_id"] for r in envhub.get_spec("countdown").load_tasks()]
    return [{"env_id": "countdown", "task_id": ids[i % len(ids)], "trajectory_id": i} for i in range(n)]


async def in_process(n: int, tokenizer) -> dict:
    from envhub.service.schemas import ProcessRequest
    from envhub.service.service import RolloutService

    svc = RolloutService(tokenizer, backends=["golden"], init_workers=8, run_workers=16, eval_workers=8)
    await svc.start()
    insts = instances(n)
    t0 = time.perf_counter()
    lat: list[float] = []

    async def one(i: int, inst: dict) -> bytes:
        t = time.perf_counter()
        body = await svc.process(ProcessRequest(instance=inst, sampling_params={"temperature": 1.0},
                                                job_id=f"ip-{i}"))
        lat.append(time.perf_counter() - t)
        return body

    bodies = await asyncio.gather(*(one(i, inst) for i, inst in enumerate(insts)))
    wall = time.perf_counter() - t0
    await svc.stop()
    import json

    done = [json.loads(b) for b in bodies]
    assert [d["trajectory_id"] for d in done] == list(range(n)), "an answer went to the wrong job"
    assert all(d["passed"] for d in done), "a golden job failed"
    return {"wall": wall, "jobs_per_s": n / wall, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99)}


async def over_http(n: int, conns: int) -> dict:
    from envhub.training.client import RolloutClient

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-c", "import sys; from envhub.cli import main; sys.argv[0] = 'envhub'; main()",
           "serve", "--port", "0", "--tokenizer", "tiny", "--backend", "golden",
           "--init-workers", "8", "--run-workers", "16", "--eval-workers", "8"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    url = None
    deadline = time.monotonic() + 120
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        m = re.search(r"listening on (http://\S+)", line or "")
        url = m.group(1) if m else None
        if not line and proc.poll() is not None:
            raise SystemExit("envhub serve exited")
    try:
        base = rss_mb(proc.pid, "VmRSS")
        insts = instances(n)
        peak = {"in_server": 0}
        lat: list[float] = []
        async with RolloutClient(url, retries=20, backoff_s=0.5, connect_timeout_s=120,
                                 max_connections=conns) as c:

            async def one(i: int, inst: dict) -> dict:
                t = time.perf_counter()
                r = await c.process(inst, {"temperature": 1.0}, job_id=f"scale-{i}", raw=True)
                lat.append(time.perf_counter() - t)
                return r

            async def watch() -> None:
                async with RolloutClient(url) as w:
                    while True:
                        st = (await w.status())[0]
                        peak["in_server"] = max(peak["in_server"], st["pending_jobs"])
                        await asyncio.sleep(0.5)

            watcher = asyncio.ensure_future(watch())
            t0 = time.perf_counter()
            results = await asyncio.gather(*(one(i, inst) for i, inst in enumerate(insts)), return_exceptions=True)
            wall = time.perf_counter() - t0
            watcher.cancel()
            st = (await c.status())[0]
            retried = c.counts["retried"]
        errors = [r for r in results if isinstance(r, BaseException)]
        assert not errors, f"{len(errors)} jobs raised, e.g. {errors[0]!r}"
        assert [r["job_id"] for r in results] == [f"scale-{i}" for i in range(n)], "an answer went to the wrong job"
        assert st["jobs"]["submitted"] == n and st["jobs"]["done"] == n, f"lost or doubled: {st['jobs']}"
        grow = rss_mb(proc.pid) - base
        return {"wall": wall, "jobs_per_s": n / wall, "p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
                "peak_in_server": peak["in_server"], "server_peak_growth_mb": grow, "retried": retried,
                "kb_per_job_held": grow * 1024 / max(1, peak["in_server"])}
    finally:
        proc.terminate()
        proc.wait(120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=65_000)
    ap.add_argument("--http-only", action="store_true", help="skip the in-process run (no ratio)")
    args = ap.parse_args()
    from envhub.fdlimit import raise_nofile_limit
    from envhub.testing.models import load_tokenizer, resolve_model

    soft, hard = raise_nofile_limit()
    # every in-flight /process holds one connection, i.e. one descriptor in the client and one in the server: past
    # the open-files limit the client queues the rest itself (all N are still submitted at once)
    from envhub.http.limits import default_max_connections

    conns = min(args.jobs + 64, default_max_connections() - 64)  # under the server's own cap (same limit there)
    if conns < args.jobs:
        print(f"note       : RLIMIT_NOFILE is {soft} (hard {hard}, which this process cannot raise): at most {conns} "
              f"of the {args.jobs} jobs hold an HTTP connection at once; the client queues the rest", flush=True)
    tok = load_tokenizer(resolve_model("tiny"))
    ip = None if args.http_only else asyncio.run(in_process(args.jobs, tok))
    if ip:
        print(f"in-process : {args.jobs} jobs in {ip['wall']:.1f} s = {ip['jobs_per_s']:.0f} jobs/s; "
              f"latency p50 {ip['p50']:.1f} s p99 {ip['p99']:.1f} s", flush=True)
    http = asyncio.run(over_http(args.jobs, conns))
    print(f"over HTTP  : {args.jobs} jobs in {http['wall']:.1f} s = {http['jobs_per_s']:.0f} jobs/s; "
          f"latency p50 {http['p50']:.1f} s p99 {http['p99']:.1f} s; peak jobs held by the server "
          f"{http['peak_in_server']}; server RSS growth {http['server_peak_growth_mb']:.0f} MB "
          f"= {http['kb_per_job_held']:.1f} KB per job held; client retries {http['retried']}")
    if ip:
        print(f"ratio      : HTTP / in-process throughput = {http['jobs_per_s'] / ip['jobs_per_s']:.2f}x; "
              f"every job answered exactly once")


if __name__ == "__main__":
    main()
