"""The bottleneck verdict (``/status.bound``): which side of an RL pipeline waits for the other, from a
:meth:`envhub.rollout.throughput.Throughput.snapshot` (``docs/metrics.md`` has the rule and its figures).

A pure function over the snapshot dict, so the live view (:mod:`envhub.rollout.live`) applies the same rule to
figures summed over replicas.
"""
from __future__ import annotations

from typing import Any

IDLE = 0.25  # a side idle more than a quarter of the window is waiting for the other
TOLERANCE = 0.25  # both sides idle: capacities within 25 % of each other are balanced
SERIAL = 0.5  # balanced, yet both idle more than half the window: "serialized" (each waits for the other)
MIN_SAMPLES, MIN_STEPS = 4, 2  # fewer finished rollouts or trainer steps in the window: "unknown"


def bound(s: dict[str, Any]) -> dict[str, Any]:
    """The bottleneck from a :meth:`Throughput.snapshot`: ``{"bound", "side", "why", "ratio", figures...}``.

    ``side`` comes from the idle ratios (research note §3.4), the capacities break a tie. The trainer idle more than
    ``IDLE`` of the window while the generator is not: the **generator** is the bottleneck (the trainer waits for
    it); the reverse: the **trainer**; neither: ``balanced``. Both idle (a staleness bound that holds the generator
    back while the trainer waits for stragglers): the capacity ratio (trainer ÷ generator) decides, above
    ``1 + TOLERANCE`` generator, below its inverse trainer, else balanced -- named ``serialized`` when both are idle
    more than ``SERIAL`` of the window (a synchronous trainer). A generator-bound verdict is narrowed:
    ``sandboxes`` when INITs waited for a sandbox slot a quarter of the time or a tenth of sandbox starts failed,
    ``backend:<name>`` when model calls are at least half of RUN time (the backend with the most call-seconds),
    else ``generator``. Fewer than ``MIN_SAMPLES`` rollouts or ``MIN_STEPS`` trainer steps in the window:
    ``unknown``.
    """
    fig = {k: s.get(k) for k in ("production_rate", "effective_production_rate", "consumption_rate", "acceptance",
                                 "trainer_capacity", "generator_capacity", "trainer_idle_ratio",
                                 "generator_idle_ratio")}
    ti, gi = s["trainer_idle_ratio"], s["generator_idle_ratio"]
    if s["finished"] < MIN_SAMPLES or s["steps"] < MIN_STEPS or not s["trainer_capacity"] \
            or not s["generator_capacity"] or ti is None or gi is None:
        return {"bound": "unknown", "side": "unknown", "ratio": None, **fig,
                "why": f"too little data: {s['finished']} rollouts and {s['steps']} trainer steps in the window "
                       f"(need {MIN_SAMPLES} and {MIN_STEPS}; the trainer reports steps with POST /trainer/step)"}
    ratio = s["trainer_capacity"] / s["generator_capacity"]
    why = (f"idle: trainer {_pct(ti)}, generator {_pct(gi)}; trainer capacity {s['trainer_capacity']:.3g}/s "
           f"(samples per step / step time) vs generator {s['generator_capacity']:.3g}/s (acceptance x "
           f"{s['peak_concurrency']} concurrent / {s['rollout_latency_s']:.3g}s latency): ratio {ratio:.2f}")
    if ti > IDLE and gi <= IDLE or (ti > IDLE and gi > IDLE and ratio > 1 + TOLERANCE):
        side = name = "generator"
        sb, st = s["sandboxes"], s["stages"]
        starts = sum(sb["failures"].values()) + st["init"].get("count", 0)
        run = st["run"].get("mean", 0.0) * st["run"].get("count", 0)
        calls = {n: b["call_s"] for n, b in s["backends"].items() if b.get("call_s")}
        if sb["waiting_ratio"] >= 0.25 or (starts and sum(sb["failures"].values()) / starts >= 0.1):
            name = "sandboxes"
            why += f"; INIT waited for a sandbox slot {_pct(sb['waiting_ratio'])} of the time, failures " \
                   f"{sb['failures']}"
        elif calls and run > 0 and sum(calls.values()) >= 0.5 * run:
            name = "backend:" + max(calls, key=calls.__getitem__)
            why += f"; model calls are {_pct(sum(calls.values()) / run)} of RUN time"
    elif gi > IDLE and ti <= IDLE or (ti > IDLE and gi > IDLE and ratio < 1 / (1 + TOLERANCE)):
        side = name = "trainer"
    else:
        side = name = "balanced"
        if ti > SERIAL and gi > SERIAL:
            name = "serialized"
            why += ("; both sides idle most of the time with matched capacities: each waits for the other (a "
                    "synchronous schedule, or a staleness bound too tight for the rollout latency): a larger eta or "
                    "more rollouts in flight would overlap them")
    return {"bound": name, "side": side, "ratio": ratio, "why": why, **fig}


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"
