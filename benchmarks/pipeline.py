"""The rollout service's three-pool pipeline vs one worker per job, and the HTTP overhead per job. One run prints all.

Part 1, throughput. An env whose stages take configurable times (``--init-ms``, ``--run-ms`` per turn x
``--turns``, ``--eval-ms``; ``--jitter exp`` draws each from an exponential with that mean) runs ``--jobs`` rollouts
with the golden player through the real tokenizer, three ways, in this process, on the same backend:

* ``pipeline``: the service's :class:`~envhub.service.pipeline.Pipeline` (INIT/RUN/EVAL pools of ``--pools
  I,R,E`` workers), jobs admitted through :class:`~envhub.service.service.RolloutService` (no HTTP here);
* ``naive, equal total``: ``I+R+E`` workers, each taking a job and running INIT, RUN and EVAL itself
  (``envhub.rollout.executor.rollout``), the design the pipeline replaces;
* ``naive, equal RUN``: ``R`` such workers, i.e. as many concurrent agent loops as the pipeline's RUN pool, which is
  how that design is sized in practice (its worker count is the LLM concurrency it puts on the servers).

It prints each one's jobs/s, the bound set by the slowest stage (``min(n_s / L_s)`` over stages for the pipeline,
``W / (L_init + L_run + L_eval)`` for ``W`` naive workers), and the ratios. Note what Little's law implies: with
``n_init + n_run + n_eval = W`` workers, ``min(n_s / L_s) <= W / sum(L_s)``, so at *equal total workers* no
pipeline can beat a naive scheme that meets its own bound; the pipeline's gain is that RUN concurrency (the LLM's)
is sized on its own while INIT and EVAL run beside it.

It also prints the CPU cost per job of each scheme with zero stage latency (what eats into the bound on a busy host).

Part 2, HTTP overhead. ``envhub serve`` in a subprocess (golden backend) answers ``--http-jobs`` countdown jobs one
at a time over HTTP; the same jobs run in-process through ``rollout()``. The difference of the medians is the
service's HTTP overhead per job (client + server: request, admission, queues, JSON both ways).

    python benchmarks/pipeline.py     # defaults, an SWE-like profile: INIT 60 ms (sandbox), RUN 3 x 20 ms (LLM),
                                      # EVAL 40 ms (tests), pools 8,6,5 (RUN, the LLM, is the bottleneck), 600 jobs
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from envhub import EnvSpec, Response, Score, TextEnv

ROOT = Path(__file__).resolve().parents[1]


class Stages(TextEnv):
    """Each stage sleeps (asyncio: the wait of a sandbox start, an LLM turn on a remote GPU, a test run)."""

    blocking = False
    lat: dict = {}

    async def areset(self, *, seed=None, options=None):
        await asyncio.sleep(_draw(self.lat["init"]))
        return self.reset(seed=seed, options=options)

    async def astep(self, action):
        await asyncio.sleep(_draw(self.lat["run"]))
        return self.step(action)

    def start(self, task):
        return f"Say {task['n']}."

    def respond(self, action):
        return Response("again", done=self.turn >= self.lat["turns"], artifacts={"answer": action.text})


class StageVerifier:
    def verify(self, task, artifacts):
        return Score(1.0, True)

    async def averify(self, task, artifacts):
        await asyncio.sleep(_draw(Stages.lat["eval"]))
        return Score(1.0, True)


def _draw(mean: float) -> float:
    return random.expovariate(1 / mean) if Stages.lat.get("jitter") == "exp" and mean > 0 else mean


def spec() -> EnvSpec:
    rows = [{"task_id": f"t{i}", "n": i} for i in range(64)]
    return EnvSpec(id="bench-stages", env=Stages, tasks=lambda split: rows, verifier=StageVerifier(),
                   golden=lambda t, m: str(t["n"]), max_turns=1000)


# ---- part 1 -------------------------------------------------------------------------------------------------------
async def run_pipeline(tok, n_jobs: int, pools: tuple[int, int, int]) -> float:
    from envhub.service.schemas import ProcessRequest
    from envhub.service.service import RolloutService

    svc = RolloutService(tok, backends=["golden"], init_workers=pools[0], run_workers=pools[1],
                         eval_workers=pools[2], timeout_s=None)
    await svc.start()
    reqs = [ProcessRequest(instance={"env_id": "bench-stages", "task_id": f"t{i % 64}"}) for i in range(n_jobs)]
    await asyncio.gather(*(svc.process(r) for r in reqs[:20]))  # warm up
    t0 = time.perf_counter()
    out = await asyncio.gather(*(svc.process(r) for r in reqs))
    wall = time.perf_counter() - t0
    assert all(b'"passed":true' in b for b in out), "a benchmark rollout failed"
    await svc.shutdown()
    return n_jobs / wall


async def run_naive(tok, n_jobs: int, workers: int) -> float:
    from envhub.backends.scripted import ScriptedBackend
    from envhub.rollout.executor import rollout

    s = spec()
    backend = ScriptedBackend(s.golden)
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(n_jobs):
        queue.put_nowait({"task_id": f"t{i % 64}", "n": i % 64})
    done = []

    async def worker():
        while not queue.empty():
            task = queue.get_nowait()
            done.append(await rollout(s, task, backend, tok))  # INIT, RUN, EVAL, one after the other

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    wall = time.perf_counter() - t0
    assert len(done) == n_jobs and all(t.passed for t in done)
    return n_jobs / wall


# ---- part 2 -------------------------------------------------------------------------------------------------------
def spawn_server() -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-c", "import sys; from envhub.cli import main; sys.argv[0]='envhub'; main()", "serve",
           "--port", "0", "--tokenizer", "tiny", "--backend", "golden"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    for line in proc.stdout:
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return proc, m.group(1)
    raise RuntimeError("envhub serve did not start")


async def http_overhead(tok, n: int) -> tuple[float, float]:
    import envhub
    from envhub.backends.scripted import ScriptedBackend
    from envhub.rollout.executor import rollout
    from envhub.training.client import RolloutClient

    cd = envhub.get_spec("countdown")
    rows = [dict(r) for r in cd.load_tasks()]
    backend = ScriptedBackend(cd.golden)
    inproc = []
    for i in range(n):
        t0 = time.perf_counter()
        t = await rollout(cd, rows[i % len(rows)], backend, tok)
        inproc.append(time.perf_counter() - t0)
        assert t.passed
    proc, url = spawn_server()
    try:
        over_http = []
        async with RolloutClient(url) as c:
            for i in range(n + 20):
                t0 = time.perf_counter()
                d = await c.process({"env_id": "countdown", "task_id": rows[i % len(rows)]["task_id"]}, raw=True)
                if i >= 20:  # the first ones warm the server up
                    over_http.append(time.perf_counter() - t0)
                assert d["passed"]
    finally:
        proc.terminate()
        proc.wait(60)
    return statistics.median(inproc), statistics.median(over_http)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--init-ms", type=float, default=60)
    ap.add_argument("--run-ms", type=float, default=20, help="per turn")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--eval-ms", type=float, default=40)
    ap.add_argument("--pools", default="8,6,5", help="INIT,RUN,EVAL workers of the pipeline")
    ap.add_argument("--jitter", choices=["none", "exp"], default="exp")
    ap.add_argument("--jobs", type=int, default=600)
    ap.add_argument("--http-jobs", type=int, default=300)
    args = ap.parse_args()
    pools = tuple(int(x) for x in args.pools.split(","))
    Stages.lat = {"init": args.init_ms / 1000, "run": args.run_ms / 1000, "turns": args.turns,
                  "eval": args.eval_ms / 1000, "jitter": args.jitter}
    from envhub.testing.models import build_tiny_model, load_tokenizer
    from envhub.plugins import default_hub

    tok = load_tokenizer(build_tiny_model(template="chatml"))
    default_hub().register(spec(), source="benchmarks/pipeline.py")
    lat = [Stages.lat["init"], Stages.lat["run"] * args.turns, Stages.lat["eval"]]
    total = sum(pools)
    bound = min(n / L for n, L in zip(pools, lat))
    print(f"stages: INIT {args.init_ms:g} ms, RUN {args.turns} x {args.run_ms:g} ms, EVAL {args.eval_ms:g} ms "
          f"({args.jitter} jitter); pipeline pools {pools}; {args.jobs} jobs; load {os.getloadavg()[0]:.1f}")
    pipe = asyncio.run(run_pipeline(tok, args.jobs, pools))
    naive_total = asyncio.run(run_naive(tok, args.jobs, total))
    naive_run = asyncio.run(run_naive(tok, args.jobs, pools[1]))
    rows = [
        ("pipeline (three pools)", pipe, bound),
        (f"naive, equal total ({total} workers)", naive_total, total / sum(lat)),
        (f"naive, equal RUN ({pools[1]} workers)", naive_run, pools[1] / sum(lat)),
    ]
    print(f"{'scheme':38s} {'jobs/s':>8s} {'bound':>8s} {'of bound':>9s}")
    for name, x, b in rows:
        print(f"{name:38s} {x:8.1f} {b:8.1f} {x / b:9.1%}")
    print(f"pipeline / bound of its slowest stage: {pipe / bound:.1%}   (target >= 90%)")
    print(f"pipeline / naive, equal total workers: {pipe / naive_total:.2f}x")
    print(f"pipeline / naive, equal RUN workers:   {pipe / naive_run:.2f}x   (target >= 2x)")
    saved, Stages.lat = Stages.lat, {"init": 0, "run": 0, "turns": args.turns, "eval": 0, "jitter": "none"}
    cpu_pipe = 1e3 / asyncio.run(run_pipeline(tok, 1000, pools))
    cpu_naive = 1e3 / asyncio.run(run_naive(tok, 1000, total))
    Stages.lat = saved
    print(f"CPU per job with zero stage latency: pipeline {cpu_pipe:.2f} ms (admission, queues, JSON reply), "
          f"naive {cpu_naive:.2f} ms")

    inproc, http = asyncio.run(http_overhead(tok, args.http_jobs))
    print(f"one countdown job, median: in-process {inproc * 1e3:.2f} ms, over HTTP {http * 1e3:.2f} ms -> "
          f"HTTP overhead {(http - inproc) * 1e3:.2f} ms per job   (target <= 2 ms)")


if __name__ == "__main__":
    main()
