"""Train a tiny model online with GRPO through envhub's rollout service, under several schedules, and compare.

    python examples/online_grpo/run.py                       # sync, one-step-off, eta=2, eta=4 naive / decoupled
    python examples/online_grpo/run.py --schedules sync,eta2 --steps 20 --json out.json

Each schedule gets a fresh service (real HTTP on loopback, the ``hf`` backend sampling a tiny random Qwen2 model
built here), the same initial weights and the same seeds; the env is ``echo-digit`` (``echo_digit.py``: a reward a
random model can raise, and a lognormal "tool" latency per episode). Before any task is used the env passes envhub's
admission. Per schedule it prints reward against steps and wall time, samples/s, the lag histogram (trainer version
minus the oldest version of each trained sample's tokens), dropped / withheld counts, trainer idle and generator
idle, and the reward of 4 samples on each of 32 held-out prompts before and after training.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import echo_digit  # noqa: E402
from generator import GeneratorProcess  # noqa: E402
from trainer import OnlineGRPO, Report, Schedule, evaluate  # noqa: E402
from warmup import format_warmup  # noqa: E402

SCHEDULES = {
    "sync": dict(eta=0),
    "one-step-off": dict(eta=1),
    "eta2": dict(eta=2),
    "eta4-naive": dict(eta=4),
    "eta4-decoupled": dict(eta=4, decoupled=True),
    "eta4-loglinear": dict(eta=4, decoupled=True, prox="loglinear"),
}


def prompts(rows: list[dict[str, Any]]):
    """Endless instances over the training rows, in order."""
    for row in itertools.cycle(rows):
        yield {"env_id": echo_digit.ENV_ID, "task": row}


async def run_schedule(schedule: Schedule, model_path: Path, *, latency_s: float, latency_sigma: float,
                       n_eval: int = 32, run_dir: Path | None = None) -> Report:
    """One run: a fresh service and generator (in a process of their own), the trainer's model from the same initial
    weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from envhub.training import RolloutClient

    torch.manual_seed(schedule.seed)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager")
    model.config.use_cache = False
    model.train()
    rows = echo_digit.rows(400, latency_s=latency_s, latency_sigma=latency_sigma, seed=schedule.seed)
    train_rows, eval_rows = rows[n_eval:], rows[:n_eval]
    eval_instances = [{"env_id": echo_digit.ENV_ID, "task": r} for r in eval_rows]
    with GeneratorProcess(model_path) as srv:  # the service and its generator: a process of their own
        print(f"-- {schedule.name}: evaluating the initial weights", flush=True)
        before = await evaluate(srv.url, eval_instances, max_tokens=schedule.max_tokens)
        trainer = OnlineGRPO(model, srv.parameters, srv.url, prompts(train_rows), schedule,
                             pad_token_id=srv.pad_token_id)
        trainer.on_step = lambda st: on_step(st, schedule, srv.url, run_dir)
        recorder = None
        if run_dir is not None:  # the figures `envhub top` shows, every second: `envhub show DIR --plot`
            from envhub.rollout.livepoll import Recorder

            shutil.rmtree(run_dir / schedule.name, ignore_errors=True)  # a series of this run only
            recorder = Recorder(run_dir / schedule.name, [srv.url], interval_s=1.0).start()
        try:
            report = await trainer.run()
        finally:
            if recorder is not None:
                recorder.stop()
        report.eval_before = before
        async with RolloutClient(srv.url) as client:  # the held-out evaluation is not the trainer's: no bound on it
            await client.configure_staleness(max_staleness=None)
        report.eval_after = await evaluate(srv.url, eval_instances, max_tokens=schedule.max_tokens)
    return report


def on_step(st: Any, schedule: Schedule, url: str, run_dir: Path | None) -> None:
    """Progress, and half-way through a recorded run, what ``envhub top`` shows then (``DIR/<schedule>/top.txt``)."""
    print(f"   [{schedule.name}] step {st.step:3d}  t={st.t:6.1f}s  reward {st.reward:.3f}  waited {st.waited_s:.2f}s  "
          f"train {st.train_s:.2f}s  sync {st.sync_s:.2f}s", flush=True)
    if run_dir is not None and st.step == schedule.steps // 2:
        (run_dir / schedule.name).mkdir(parents=True, exist_ok=True)
        with open(run_dir / schedule.name / "top.txt", "w") as f:  # the child keeps its own copy of the descriptor
            subprocess.Popen([sys.executable, "-m", "envhub.cli", "top", "--once", url], stdout=f,
                             stderr=subprocess.STDOUT)


def print_report(r: Report, out=sys.stdout) -> None:
    s = r.schedule
    tp = r.throughput
    gen_idle = tp.get("generator_idle_ratio")
    print(f"\n== {s['name']}  (eta={s['eta']}, {'decoupled (' + s['prox'] + ')' if s['decoupled'] else 'PPO-clip'} loss, "
          f"{s['steps']} steps x {s['groups']}x{s['group_size']} samples)", file=out)
    print(f"   wall {r.wall_s:.1f} s   trained {r.trained} samples   {r.samples_per_s:.1f} samples/s   "
          f"trainer idle {r.trainer_idle:.0%}   generator idle "
          f"{'n/a' if gen_idle is None else f'{gen_idle:.0%}'}", file=out)
    print(f"   held-out reward {r.eval_before:.3f} -> {r.eval_after:.3f}   lag histogram {r.lag_histogram()}   "
          f"dropped {r.collector.get('stale_groups', 0)} stale groups, zero-variance {r.collector['zero_variance']}, "
          f"withheld {r.gate.get('counts', {}).get('withheld', 0)}", file=out)
    marks = sorted({0, len(r.steps) // 4, len(r.steps) // 2, 3 * len(r.steps) // 4, len(r.steps) - 1})
    print("   step  wall_s  reward  waited_s  train_s  sync_s", file=out)
    for i in marks:
        st = r.steps[i]
        print(f"   {st.step:4d}  {st.t:6.1f}  {st.reward:6.3f}  {st.waited_s:8.2f}  {st.train_s:7.2f}  {st.sync_s:6.2f}", file=out)


async def main(argv: list[str] | None = None) -> list[Report]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--schedules", default=",".join(SCHEDULES), help=f"comma-separated, of {list(SCHEDULES)}")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--steps-async", type=int, default=None,
                    help="steps of the asynchronous schedules (default: --steps); a longer run shows when they reach "
                         "sync's final reward, where equal steps would cut that comparison short")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--minibatches", type=int, default=1,
                    help="optimizer steps per batch, every schedule (AReaL's ppo_n_minibatches)")
    ap.add_argument("--latency-s", type=float, default=0.3, help="median tool latency (0: no tail)")
    ap.add_argument("--latency-sigma", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="write every report here")
    ap.add_argument("--run-dir", type=Path, default=None,
                    help="record each run's throughput series under DIR/<schedule>/ (envhub show DIR/<s> --plot)")
    args = ap.parse_args(argv)

    import torch

    from envhub.admission import admit
    from envhub.testing.models import build_tiny_model, default_cache_dir

    torch.set_num_threads(1)  # the trainer and the generator each get one of the two cores
    spec = echo_digit.register()
    verdict = await asyncio.to_thread(admit, spec, n=8)  # its own event loop, as `envhub validate` runs it
    print(f"admission of {spec.id}: {'admitted' if verdict.fit else 'REFUSED: ' + '; '.join(verdict.unfit_reasons)}")
    if not verdict.fit:
        raise SystemExit(1)
    tiny = build_tiny_model()
    model_path = format_warmup(tiny, default_cache_dir())
    reports = []
    for name in args.schedules.split(","):
        steps = args.steps if SCHEDULES[name]["eta"] == 0 or args.steps_async is None else args.steps_async
        sched = Schedule(name=name, steps=steps, groups=args.groups, group_size=args.group_size, lr=args.lr,
                         minibatches=args.minibatches,
                         seed=args.seed, **SCHEDULES[name])
        t = time.monotonic()
        report = await run_schedule(sched, model_path, latency_s=args.latency_s, latency_sigma=args.latency_sigma,
                                    run_dir=args.run_dir)
        report.extra["run_s"] = time.monotonic() - t
        print_report(report)
        reports.append(report)
    base = next((r for r in reports if r.schedule["eta"] == 0), None)
    if base is not None:
        print("\nsamples/s relative to sync:", ", ".join(
            f"{r.schedule['name']} {r.samples_per_s / base.samples_per_s:.2f}x" for r in reports))
    if args.json:
        args.json.write_text(json.dumps([r.as_dict() for r in reports], indent=1))
    return reports


if __name__ == "__main__":
    asyncio.run(main())
