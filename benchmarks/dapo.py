"""DAPO dynamic sampling over the rollout service: batch by batch vs the async collector, same env, same server.

Both collect ``--groups`` informative groups (``--group-size`` samples per prompt; a group whose rewards are all
equal is dropped, as DAPO does) from one ``envhub serve`` process over HTTP:

* ``batch by batch`` (verl's DAPO recipe): submit ``--batch`` prompts x group size, wait for every rollout of the
  batch, keep the informative groups, repeat until there are enough (extra informative groups are discarded);
* ``async collector`` (:class:`~envhub.training.dapo.DAPOCollector`): the same number of rollouts in flight at most,
  refilled as each one lands, groups checked as they complete, the rest cancelled once the target is reached.

The env (``bench-dapo``): prompts of mixed difficulty. The player solves prompt ``i`` with probability ``p_i``
(a third hopeless, a third trivial, a third in between: the zero-variance groups DAPO drops), and each rollout's
RUN stage takes a heavy-tailed time (lognormal, median ``--median-ms``), standing in for generation lengths on a
GPU server, which cannot run here. Prints both wall times and the ratio.

    python benchmarks/dapo.py --groups 16 --group-size 8 --batch 16
"""
from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import envhub
from envhub import EnvSpec, Response, Score, TextEnv

HERE = Path(__file__).resolve().parent
MEDIAN_S = float(os.environ.get("BENCH_DAPO_MEDIAN_S", "0.2"))
SIGMA = float(os.environ.get("BENCH_DAPO_SIGMA", "1.0"))


class Stochastic(TextEnv):
    """One turn whose wait is drawn from a lognormal (a generation of random length)."""

    blocking = False

    async def astep(self, action):
        await asyncio.sleep(random.lognormvariate(math.log(MEDIAN_S), SIGMA))
        return self.step(action)

    def start(self, task):
        return f"Say {task['n']}."

    def respond(self, action):
        return Response(done=True, artifacts={"answer": action.text})


def _verify(task, artifacts):
    ok = artifacts.get("answer", "").strip() == str(task["n"])
    return Score(float(ok), ok)


def _player(task, messages):
    return str(task["n"]) if random.random() < task["p"] else "no idea"


def _p(i: int) -> float:
    return (0.0, 1.0, 0.25, 0.5, 0.75, 0.0, 1.0, 0.5, 0.0)[i % 9]  # 1/3 hopeless, 2/9 trivial, the rest mixed


def _tasks(split):  # prompts are sent inline; this split only serves `envhub validate`-style lookups
    return [{"task_id": f"d{i}", "n": i, "p": _p(i)} for i in range(90)]


@envhub.hookimpl
def envhub_register(registry):
    registry.register(EnvSpec(id="bench-dapo", env=Stochastic, tasks=_tasks, verifier=_verify, golden=_player,
                              max_turns=1))


def prompts(offset: int = 0):
    i = offset
    while True:
        yield {"env_id": "bench-dapo", "task": {"task_id": f"d{i}", "n": i, "p": _p(i)}}
        i += 1


def informative(trajs) -> bool:
    """The collector's rule (``Group.informative``, i.e. ``dapo_keep``), so both ways keep the same groups."""
    from envhub.training.dapo import Group

    return Group("", {}, list(trajs)).informative


async def batch_by_batch(client, n_groups: int, g: int, batch: int, start: int) -> tuple[float, int]:
    it, accepted, rollouts = prompts(start), 0, 0
    t0 = time.perf_counter()
    while accepted < n_groups:
        insts = [next(it) for _ in range(batch)]
        res = await asyncio.gather(*(asyncio.gather(*(client.process({**inst, "trajectory_id": k}) for k in range(g)))
                                     for inst in insts))
        rollouts += batch * g
        accepted += sum(informative(group) for group in res)
    return time.perf_counter() - t0, rollouts, 0


async def with_collector(client, n_groups: int, g: int, batch: int, start: int) -> tuple[float, int]:
    from envhub.training.dapo import DAPOCollector

    t0 = time.perf_counter()
    dapo = DAPOCollector(client, prompts(start), group_size=g, max_inflight=batch * g)
    groups = await dapo.collect(n_groups)
    wall = time.perf_counter() - t0
    assert len(groups) == n_groups and all(x.informative for x in groups)
    await dapo.close()
    return wall, dapo.stats["submitted"], dapo.stats["cancelled"]


def spawn(run_workers: int) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-c", "import sys; from envhub.cli import main; sys.argv[0]='envhub'; main()", "serve",
           "--port", "0", "--tokenizer", "tiny", "--backend", "golden", "--plugin", "dapo",
           "--run-workers", str(run_workers), "--init-workers", "16", "--eval-workers", "16"]
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    for line in proc.stdout:
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            return proc, m.group(1)
    raise RuntimeError("envhub serve did not start")


async def run(args) -> None:
    from envhub.training.client import RolloutClient

    proc, url = spawn(args.run_workers)
    try:
        async with RolloutClient(url) as c:
            base, ours = [], []
            for rep in range(args.repeats):
                start = rep * 10_000  # a fresh slice of prompts each time, the same slice for both schemes
                base.append(await batch_by_batch(c, args.groups, args.group_size, args.batch, start))
                ours.append(await with_collector(c, args.groups, args.group_size, args.batch, start))
                await asyncio.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(60)
    b = statistics.median(t for t, _, _ in base)
    o = statistics.median(t for t, _, _ in ours)
    print(f"{args.groups} informative groups of {args.group_size}; at most {args.batch * args.group_size} rollouts in "
          f"flight; RUN lognormal(median {MEDIAN_S * 1000:g} ms, sigma {SIGMA:g}); {args.repeats} repeats; "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"batch by batch:  {b:6.2f} s  (rollouts run: {statistics.median(n for _, n, _ in base):.0f})")
    print(f"async collector: {o:6.2f} s  (rollouts submitted: {statistics.median(n for _, n, _ in ours):.0f}, "
          f"cancelled once the target was reached: {statistics.median(c for _, _, c in ours):.0f})")
    print(f"speed-up: {b / o:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--batch", type=int, default=16, help="prompts per batch (and the collector's in-flight cap)")
    ap.add_argument("--run-workers", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
