"""Asynchronous RL through envhub: samples/s and reward of sync, one-step-off, eta=2 and eta=4 (naive and decoupled)
in one run, on the long-tailed ``echo-digit`` env (``examples/online_grpo``: a tiny model trained online with GRPO
through the real rollout service, a weight update every step).

    python benchmarks/async_speedup.py [--steps 16 --steps-async 32] [--latency-s 0.3 --latency-sigma 1.5]

Prints each run's report, then the ratios the asynchronous-RL issue sets as targets, measured here, side by side:
eta=2 (abort-and-continue) >= 2.5x sync in samples/s, one-step-off >= 1.3x, and eta=4 with the decoupled loss
reaching sync's final reward within 3 % in <= 60 % of sync's wall time (naive PPO at eta=4 beside it).

The asynchronous schedules run more steps than sync (``--steps-async``, default twice ``--steps``): the question is
*when* they reach sync's final reward, and a run cut at sync's step count could only answer "at its last step or
never". Samples/s is each run's trained samples over its wall time, at the same batch (8 groups x 8) everywhere. The
rollout service and its generator run in a process of their own (``examples/online_grpo/generator.py``), as beside
any trainer.
"""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "online_grpo"))

import run  # noqa: E402


def first_time_at(report, reward: float) -> float | None:
    """Wall seconds until the trained batches' reward, smoothed over 3 steps, first reaches ``reward``."""
    rs = [s.reward for s in report.steps]
    for i in range(len(rs)):
        window = rs[max(0, i - 2): i + 1]
        if sum(window) / len(window) >= reward:
            return report.steps[i].t
    return None


async def main() -> None:
    argv = sys.argv[1:]
    if "--steps" not in argv:
        argv += ["--steps", "16"]
    if "--steps-async" not in argv:
        argv += ["--steps-async", str(2 * int(argv[argv.index("--steps") + 1]))]
    reports = {r.schedule["name"]: r for r in await run.main(argv)}
    sync = reports.get("sync")
    if sync is None:
        return
    print("\n== targets (same run, same machine)")
    for name, target in (("eta2", 2.5), ("one-step-off", 1.3)):
        if name in reports:
            ratio = reports[name].samples_per_s / sync.samples_per_s
            print(f"   {name}: {ratio:.2f}x sync in samples/s (target >= {target}x): "
                  f"{'MET' if ratio >= target else 'NOT MET'}")
    final = sum(s.reward for s in sync.steps[-3:]) / 3
    for name in ("eta4-decoupled", "eta4-loglinear", "eta4-naive"):
        if name in reports:
            r = reports[name]
            t = first_time_at(r, 0.97 * final)
            frac = None if t is None else t / sync.wall_s
            print(f"   {name}: reaches 97% of sync's final batch reward ({final:.3f}) at "
                  f"{'never' if t is None else f'{t:.1f} s = {frac:.0%} of sync wall'}; held-out "
                  f"{r.eval_before:.3f} -> {r.eval_after:.3f} (sync {sync.eval_before:.3f} -> {sync.eval_after:.3f})"
                  + ("" if name == "eta4-naive" else
                     f"  (target <= 60%: {'MET' if frac is not None and frac <= 0.6 else 'NOT MET'})"))


if __name__ == "__main__":
    asyncio.run(main())
