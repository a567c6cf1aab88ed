"""What the verdict runner's defences cost: grading the golden patch of swe-gym tasks with the grader of commit
``PREVIOUS`` (before #29: the sealed runner, test files readable) and with today's (test files handed over on stdin
and emptied on disk, git's store and caches removed, the compiled tests readable only from trusted stacks, a
snapshot of the trusted code), alternating, in one run. Prints seconds per grading and the ratio. (Against
``6e1e1fe``, the runner before the sealed verdicts of #13: set PREVIOUS.)

    python benchmarks/swe_gym_verdict.py [--tasks 6] [--reps 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PREVIOUS = "1f61ec3"
GRADE = """
import json, sys, time
from envhub_swe_gym import loader
from envhub_swe_gym.grader import SweGymVerifier
rows = {r["instance_id"]: r for r in loader.load_swe_gym("train", source="offline")}
ids = sorted(rows)[:int(sys.argv[1])]
out = {}
for i in ids:
    t = time.perf_counter()
    s = SweGymVerifier().verify(rows[i], {"patch": rows[i]["patch"]})
    out[i] = (time.perf_counter() - t, s.passed)
print(json.dumps(out))
"""


def grade(package_parent: Path, tasks: int) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{package_parent}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-c", GRADE, str(tasks)], env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tasks", type=int, default=6)
    p.add_argument("--reps", type=int, default=2)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        archive = subprocess.run(["git", "archive", PREVIOUS, "environments/swe_gym/envhub_swe_gym"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        trees = {"previous": old / "environments" / "swe_gym", "now": ROOT / "environments" / "swe_gym"}
        times: dict[str, list[float]] = {k: [] for k in trees}
        for _ in range(args.reps):
            for name, tree in trees.items():
                t0 = time.perf_counter()
                result = grade(tree, args.tasks)
                assert all(ok for _, ok in result.values()), f"{name}: the golden failed: {result}"
                times[name] += [s for s, _ in result.values()]
                print(f"{name}: {args.tasks} gradings in {time.perf_counter() - t0:.1f} s", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median seconds per grading (golden, sandboxed): previous ({PREVIOUS}) {med['previous']:.3f}, "
          f"now {med['now']:.3f}")
    print(f"ratio now / previous: {med['now'] / med['previous']:.2f}x (load {os.getloadavg()[0]:.1f})")


if __name__ == "__main__":
    main()
