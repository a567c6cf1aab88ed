"""The concurrency controller's decisions (issue #26 point 3): AIMD over the rollouts the service runs at once, and
DAPO's oversampling factor from the measured acceptance. Pure logic: no clock, no I/O, no service; the wiring that
gathers the signals and applies the decisions is :mod:`envhub.service.control_loop`.

The question it answers each tick: *would more rollouts at once produce more, or only wait longer?* The LLM servers
say so. A server with free KV cache and an empty queue has room (more concurrent rollouts keep it busier); one
whose queue grows or whose KV cache is nearly full is saturated (more rollouts only queue there, and age: staleness).
So, as prime-rl's ``ConcurrencyController`` and TCP's congestion window:

* **Increase** while the servers keep up *and the limit is what holds production back* (``bind``: at least 90 % of
  the slots are in use; a client that sends less is not helped by more slots). Until the first saturation the limit
  grows by ``growth`` per tick (slow start, x2: from 4 to 32 in three ticks); after it, by ``step`` (additive).
* **Decrease** by ``beta`` (multiplicative) when a server is saturated: its queue holds more than ``queue_high`` x
  what it runs for ``patience`` ticks in a row (one noisy scrape is not a queue), its KV usage is at or above
  ``kv_high``, or it preempted requests (evicted KV: recomputation, pure waste). A cut takes effect only as the
  rollouts above the new limit finish (lowering never kills work), so no second cut is made while more rollouts
  are in flight than the limit: the last cut is still draining.
* **Hold** in between: a small queue (between ``queue_low`` and ``queue_high`` x running) keeps a server saturated
  without adding much latency, which is where a matched pipeline wants to sit.
* **Never above the ceiling**: ``min(max, the node's sandbox limit, the staleness gate's largest admission)``. The
  gate admits at most ``min(max_concurrent, (eta + 1) x B)`` rollouts at once (``running <= (eta + v + 1) B -
  accepted`` and ``accepted >= v B``): slots above that would never be filled. A ceiling that drops below the limit
  (``POST /staleness`` with a smaller bound) clamps it at once.

The **oversampling factor** is DAPO's: of the samples produced, only ``acceptance`` are trained (zero-variance
groups, failures and stale ones are not), so a collector that needs ``n`` keeps ``n x margin / acceptance`` in
flight, at most ``oversample_max`` x. A change of less than 10 % is not a decision (acceptance over a window moves
a little with every group).

Every decision says why (``Decision.reason``, one line with the figures); the loop keeps a bounded log of them.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

ACTIONS = ("increase", "decrease", "hold", "clamp", "oversample")


@dataclass(frozen=True)
class Knobs:
    """The controller's settings (``envhub serve --controller aimd --controller-<knob> ...``).

    Args:
        start: the limit at start (a cold start).
        min: never below this many.
        max: never above this many (default: the RUN pool's size).
        interval_s: seconds between ticks.
        growth: slow start: the limit is multiplied by this per increase until the first saturation.
        step: after it, the limit grows by this much per increase (additive increase).
        beta: a decrease multiplies the limit by this (multiplicative decrease).
        queue_low, queue_high: a backend queue of at most ``queue_low`` x running leaves room; above
            ``queue_high`` x running it is saturated.
        kv_low, kv_high: KV-cache usage below ``kv_low`` leaves room; at or above ``kv_high`` it is saturated.
        bind: increase only while at least this share of the limit is in use.
        patience: ticks a queue must stay above ``queue_high`` before a decrease.
        oversample_margin, oversample_max: the oversampling factor is ``margin / acceptance``, in ``[1, max]``.
    """

    start: int = 4
    min: int = 1
    max: int | None = None
    interval_s: float = 1.0
    growth: float = 2.0
    step: int = 1
    beta: float = 0.7
    queue_low: float = 0.1
    queue_high: float = 0.5
    kv_low: float = 0.6
    kv_high: float = 0.9
    bind: float = 0.9
    patience: int = 2
    oversample_margin: float = 1.2
    oversample_max: float = 8.0

    def __post_init__(self) -> None:
        for name in ("start", "min", "step", "patience"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"controller {name} must be an integer >= 1, got {getattr(self, name)!r}")
        if self.max is not None and (not isinstance(self.max, int) or self.max < self.min):
            raise ValueError(f"controller max must be an integer >= min ({self.min}), got {self.max!r}")
        checks = {"interval_s": self.interval_s > 0, "growth": self.growth > 1, "beta": 0 < self.beta < 1,
                  "queue_low": 0 <= self.queue_low <= self.queue_high, "kv_low": 0 <= self.kv_low <= self.kv_high <= 1,
                  "bind": 0 < self.bind <= 1, "oversample_margin": self.oversample_margin >= 1,
                  "oversample_max": self.oversample_max >= self.oversample_margin}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"controller settings out of range: {', '.join(f'{k}={getattr(self, k)!r}' for k in bad)} "
                             "(need interval_s > 0, growth > 1, 0 < beta < 1, 0 <= queue_low <= queue_high, "
                             "0 <= kv_low <= kv_high <= 1, 0 < bind <= 1, 1 <= oversample_margin <= oversample_max)")


@dataclass
class Signals:
    """What the loop measured this tick. ``None``: no backend reports it."""

    in_flight: int                      # rollouts holding a slot (admitted into the pipeline, not finished)
    waiting: int | None = None          # requests queued inside the LLM servers, summed
    running: int | None = None          # requests the servers are running, summed
    kv_usage: float | None = None       # the fullest server's KV-cache usage, 0..1
    preempted: int = 0                  # preemptions since the last tick
    sandbox_limit: int | None = None    # the node's live-sandbox limit
    gate_limit: int | None = None       # the staleness gate's largest admission (gate_ceiling)
    acceptance: float | None = None     # share of produced rollouts the trainer can use


@dataclass
class Decision:
    action: str                         # one of ACTIONS
    old: int
    new: int
    reason: str
    signal: str                         # what drove it: queue, kv, preemption, ceiling, bind, acceptance, none
    oversampling: float = 1.0
    t: float = 0.0                      # the loop's clock (wall time), set by the loop
    figures: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gate_ceiling(gate_status: dict[str, Any]) -> int | None:
    """The most rollouts the staleness gate (its ``status()``) can ever admit at once; ``None``: no bound."""
    bounds = []
    if gate_status.get("local_max_concurrent") is not None:
        bounds.append(int(gate_status["local_max_concurrent"]))
    if gate_status.get("max_staleness") is not None:
        bounds.append((int(gate_status["max_staleness"]) + 1) * int(gate_status["local_batch_size"]))
    return min(bounds) if bounds else None


def oversampling_factor(acceptance: float | None, margin: float = 1.2, most: float = 8.0) -> float | None:
    """Samples to launch per sample the trainer needs: ``margin / acceptance`` in ``[1, most]`` (``None``: no
    acceptance measured yet)."""
    if acceptance is None:
        return None
    if acceptance <= 0:
        return most
    return min(most, max(1.0, margin / acceptance))


class AIMD:
    """The decision rule (module docstring). ``decide(signals)`` once per tick; ``limit`` is the current limit."""

    def __init__(self, knobs: Knobs | None = None, ceiling: int | None = None):
        self.knobs = knobs or Knobs()
        top = [x for x in (self.knobs.max, ceiling) if x is not None]
        self.limit = min([self.knobs.start, *top])
        self.slow_start = True
        self.hot = 0                    # consecutive ticks with a queue above queue_high
        self.oversampling = 1.0

    def ceiling(self, s: Signals) -> tuple[int | None, str]:
        """The lowest bound and its name (``None``: unbounded)."""
        named = [(b, n) for b, n in ((self.knobs.max, "max"), (s.sandbox_limit, "sandbox limit"),
                                     (s.gate_limit, "staleness gate")) if b is not None]
        return min(named) if named else (None, "none")

    def decide(self, s: Signals) -> Decision:
        k, old = self.knobs, self.limit
        top, which = self.ceiling(s)
        fig = {"in_flight": s.in_flight, "waiting": s.waiting, "running": s.running, "kv_usage": s.kv_usage,
               "preempted": s.preempted, "ceiling": top, "ceiling_by": which}

        def out(action: str, new: int, reason: str, signal: str) -> Decision:
            self.limit = new
            return Decision(action, old, new, reason, signal, self.oversampling, figures=fig)

        if top is not None and old > top:  # the bound moved below the limit: obey it now, draining the excess
            return out("clamp", max(1, top), f"the {which} allows {top}: limit {old} -> {top}", "ceiling")
        floor = min(k.min, top) if top is not None else k.min
        running = s.running if s.running is not None else max(0, s.in_flight - (s.waiting or 0))
        queue_hot = s.waiting is not None and s.waiting > k.queue_high * max(running, 1)
        self.hot = self.hot + 1 if queue_hot else 0
        why = None
        if s.preempted > 0:
            why, signal = f"the servers preempted {s.preempted} request(s) (KV cache exhausted)", "preemption"
        elif s.kv_usage is not None and s.kv_usage >= k.kv_high:
            why, signal = f"KV cache {s.kv_usage:.0%} >= {k.kv_high:.0%}", "kv"
        elif queue_hot and self.hot >= k.patience:
            why, signal = (f"backend queue {s.waiting} waiting > {k.queue_high:g} x {running} running for "
                           f"{self.hot} ticks"), "queue"
        if why is not None:
            if s.in_flight > old:
                return out("hold", old, f"{why}, but {s.in_flight} rollouts are still in flight above the limit "
                                        f"{old}: the last cut is draining", signal)
            new = max(floor, math.floor(old * k.beta))
            self.slow_start, self.hot = False, 0
            if new >= old:
                return out("hold", old, f"{why}, but the limit is at its floor {floor}", signal)
            return out("decrease", new, f"{why}: limit {old} -> {new} (x{k.beta:g})", signal)
        if s.waiting is None and s.kv_usage is None:
            return out("hold", old, "no backend reports a queue or KV usage (load() or a vLLM/SGLang /metrics): "
                                    "nothing to steer by", "none")
        if queue_hot:
            return out("hold", old, f"backend queue {s.waiting} waiting > {k.queue_high:g} x {running} running for "
                                    f"{self.hot} of {k.patience} ticks", "queue")
        room = (s.kv_usage is None or s.kv_usage < k.kv_low) and \
            (s.waiting is None or s.waiting <= k.queue_low * max(running, 1))
        if not room:
            return out("hold", old, f"in band: queue {s.waiting} for {running} running, KV "
                                    f"{_pct(s.kv_usage)}", "queue" if s.kv_usage is None else "kv")
        if s.in_flight < k.bind * old:
            return out("hold", old, f"room on the servers, but only {s.in_flight} of {old} slots are in use: the "
                                    "limit is not what holds production back", "bind")
        if top is not None and old >= top:
            return out("hold", old, f"room on the servers, but the limit is at the {which} ({top})", "ceiling")
        new = math.ceil(old * k.growth) if self.slow_start else old + k.step
        new = min(new, top) if top is not None else new
        mode = f"slow start x{k.growth:g}" if self.slow_start else f"+{k.step}"
        return out("increase", new, f"room: queue {s.waiting} for {running} running, KV {_pct(s.kv_usage)}, "
                                    f"{s.in_flight}/{old} slots in use: limit {old} -> {new} ({mode})",
                   "queue" if s.kv_usage is None else "kv")

    def oversample(self, acceptance: float | None) -> Decision | None:
        """A new oversampling factor when the measured acceptance moves it by 10 % or more, else ``None``."""
        k = self.knobs
        want = oversampling_factor(acceptance, k.oversample_margin, k.oversample_max)
        if want is None or abs(want - self.oversampling) < 0.1 * self.oversampling:
            return None
        old, self.oversampling = self.oversampling, round(want, 3)
        return Decision("oversample", self.limit, self.limit,
                        f"acceptance {acceptance:.0%}: oversampling {old:g} -> {self.oversampling:g} "
                        f"(margin {k.oversample_margin:g} / acceptance, at most {k.oversample_max:g})",
                        "acceptance", self.oversampling, figures={"acceptance": acceptance})


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


# ---- the servers' own figures ----------------------------------------------------------------------------------------
# Names as vLLM's v1 engine exports them (vllm/v1/metrics/loggers.py, vLLM 0.32: vllm:kv_cache_usage_perc,
# vllm:num_requests_waiting, vllm:num_requests_running, vllm:num_preemptions), the older engine's
# vllm:gpu_cache_usage_perc, and SGLang's, read from its SchedulerMetricsCollector (sglang 0.5.23,
# sglang/srt/observability/metrics_collector.py): the gauges sglang:token_usage (the fullest of its KV pools, 0..1),
# sglang:num_queue_reqs and sglang:num_running_reqs, and the counter sglang:num_retracted_requests_total (a decode
# batch retracted for want of KV: SGLang's preemption). Not its gauge sglang:num_retracted_reqs: that one holds the
# retractions since the scheduler's last stats line and is reset after each, so it is no counter to take deltas of.
SERVER_METRICS = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "preemptions": ("vllm:num_preemptions", "sglang:num_retracted_requests"),
}
# Labels under which a server repeats part of a total it also exports: SGLang's per-priority queues (a sample with a
# non-empty value here is a breakdown and is skipped).
BREAKDOWN_LABELS = ("priority",)


def parse_server_metrics(text: str) -> dict[str, float]:
    """``{kv_usage?, waiting?, running?, preemptions?}`` from a server's Prometheus text (``GET /metrics``), read
    with ``prometheus_client``'s parser. Over several engines (vLLM's ``engine`` label, SGLang's ``dp_rank``): queues
    and preemptions add up, KV usage is the fullest engine's. SGLang with priority scheduling adds a breakdown of
    each queue under ``priority="<n>"`` beside the total under ``priority=""``: only the total counts (else every
    request would count twice). A figure the server does not export is absent. Raises ``ValueError`` on text that is
    not the Prometheus format."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {name: key for key, names in SERVER_METRICS.items() for name in names}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        key = wanted.get(fam.name)
        if key is None:
            continue
        values = [s.value for s in fam.samples if s.name in (fam.name, fam.name + "_total")
                  and not any(s.labels.get(b) for b in BREAKDOWN_LABELS) and not math.isnan(s.value)]
        if not values:
            continue
        v = max(values) if key == "kv_usage" else sum(values)
        out[key] = max(out.get(key, v), v) if key == "kv_usage" else out.get(key, 0.0) + v
    return out
