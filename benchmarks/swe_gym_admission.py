"""What swe-gym admission costs per task, old path against new, alternating in one run (#27).

The new path makes one grading fewer per task (the replay's second grading of the golden's artifacts is the
re-grading's first call, ``envhub.admission.FOLD_REPLAY``) and the grading interpreter loads the verdict runner's
modules from bytecode written beside them (``testrun.write_runner(precompiled=True)``) instead of compiling them at
every grading. The old path switches both off. Each round admits the same tasks once each way, the order alternating.

CPU is what the run's processes use *with every sandbox in them*: sandboxed processes leave this process's tree (bwrap
re-parents them), so ``os.times`` misses them. Where this host lets us make a cgroup-v1 ``cpuacct`` group, the
benchmark moves itself into one and reads its counter (every descendant, wherever it re-parents); elsewhere it prints
wall time and this process's CPU only. The re-grading is time-boxed (``Budget.seconds``): a cheaper grader makes more
re-grades in the same seconds, so the benchmark runs with ``--regrade-seconds 0`` by default (one re-grade call, the
one the replay's verdict comes from), which times the part that changed.

    python benchmarks/swe_gym_admission.py [--tasks 2] [--rounds 2] [--regrade-seconds 0]
"""
from __future__ import annotations

import argparse
import atexit
import functools
import os
import statistics
import tempfile
import time
import uuid

CPUACCT = "/sys/fs/cgroup/cpuacct"


def cpu_meter():
    """A function giving this process tree's CPU seconds so far, and what it counts."""
    group = os.path.join(CPUACCT, f"envhub-bench-{uuid.uuid4().hex[:8]}")
    try:
        os.mkdir(group)
        with open(os.path.join(group, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))
    except OSError:
        def own() -> float:
            t = os.times()
            return t.user + t.system + t.children_user + t.children_system
        return own, "this process and its waited children only (no cpuacct cgroup here: sandboxes not counted)"

    def usage() -> float:
        with open(os.path.join(group, "cpuacct.usage")) as f:
            return int(f.read()) / 1e9

    @atexit.register
    def leave() -> None:  # back to the parent group, then remove ours (best effort: it is empty by now)
        try:
            with open(os.path.join(CPUACCT, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))
            os.rmdir(group)
        except OSError:
            pass
    return usage, "a cpuacct cgroup of its own (every process of the run, sandboxes included)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--regrade-seconds", type=float, default=0.0)
    args = ap.parse_args()
    os.environ.setdefault("ENVHUB_CACHE", tempfile.mkdtemp(prefix="envhub-bench-cache-"))

    import envhub
    import envhub.admission as admission
    import envhub_swe_gym.grader as grader
    from envhub.grading import Budget
    from envhub_swe_gym import testrun

    cpu, counted = cpu_meter()
    spec = envhub.get_spec("swe-gym")
    ids = [t["task_id"] for t in spec.load_tasks()][: args.tasks]
    budget = Budget(seconds=args.regrade_seconds)
    calls = {"n": 0}
    verify = grader.SweGymVerifier.verify

    def counting(self, task, artifacts):
        calls["n"] += 1
        return verify(self, task, artifacts)

    grader.SweGymVerifier.verify = counting

    def run(new: bool) -> tuple[float, float, int]:
        admission.FOLD_REPLAY = new
        grader.write_runner = functools.partial(testrun.write_runner, precompiled=new)
        calls["n"] = 0
        c0, t0 = cpu(), time.perf_counter()
        report = admission.admit(spec, task_ids=ids, concurrency=args.concurrency, budget=budget)
        wall, used = time.perf_counter() - t0, cpu() - c0
        assert report.fit and report.passed == len(ids), report.unfit_reasons or report.quarantined
        return used, wall, calls["n"]

    run(True)  # warm: checkouts, the sandbox /etc, the bytecode of the sandbox's server
    got: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for r in range(args.rounds):
        for new in ((False, True) if r % 2 == 0 else (True, False)):
            got[new].append(run(new))
            print(f"round {r} {'new' if new else 'old'}: cpu {got[new][-1][0]:.2f} s, wall {got[new][-1][1]:.2f} s, "
                  f"{got[new][-1][2]} verify calls", flush=True)
    print(f"\n{len(ids)} swe-gym task(s), concurrency {args.concurrency}, re-grading {args.regrade_seconds:g} s; "
          f"CPU counted: {counted}; load {open('/proc/loadavg').read().split()[:3]}")
    for i, what in ((0, "CPU s per task"), (1, "wall s per task")):
        old = statistics.median(x[i] for x in got[False]) / len(ids)
        new = statistics.median(x[i] for x in got[True]) / len(ids)
        print(f"{what:16s} old {old:7.2f}  new {new:7.2f}  old/new {old / new:.2f}x")
    print(f"verify calls per task: old {got[False][0][2] / len(ids):.1f}, new {got[True][0][2] / len(ids):.1f}")


if __name__ == "__main__":
    main()
