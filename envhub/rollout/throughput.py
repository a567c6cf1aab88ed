"""Throughput figures of a rollout server: one place that holds them (:class:`Throughput`), one dict that says them
(:meth:`Throughput.snapshot`), one verdict that names the bottleneck (:func:`~envhub.rollout.bottleneck.bound`), and Prometheus text for
``GET /metrics`` (:mod:`envhub.rollout.throughput_export`, rendered by ``prometheus_client``).

The arithmetic is the queue model the asynchronous-RL systems use (``docs/metrics.md`` defines every figure): a
generator produces samples into a queue, a trainer consumes them.

* **Production** ``R_G`` = rollouts finished per second (cancelled ones are not production). **Effective
  production** = ``acceptance × R_G``, where acceptance counts out what the trainer cannot use (errors, timeouts,
  withheld or dropped as stale, and the samples the trainer reports it discarded, e.g. DAPO's zero-variance groups).
* **Consumption** ``R_T`` = samples the trainer took per second (its step reports, ``POST /trainer/step``).
* **Idle ratios.** The trainer is idle between a step's ``end`` and the next ``begin`` (it waits for data). The
  generator's idle ratio is its unused share of slots: 1 − (requests being worked on, time-averaged) ÷ (the most
  it has worked on at once). A request takes a slot from its arrival to its reply, except while it waits for the
  staleness gate's admission. A generator that a bounded buffer or the gate holds to half its concurrency is half
  idle even though it is never empty.
* **Capacities**, what each side would do if the other never held it back: the trainer's is samples per step ÷
  step compute time (``begin`` to ``end``); the generator's is ``acceptance × concurrency ÷ latency`` (Little's
  law), with the most rollouts the pipeline held at once in the window as the concurrency and the mean time a
  rollout spends in the pipeline (queues included) as the latency.
* **The bottleneck** (:func:`~envhub.rollout.bottleneck.bound`): the side the other waits for, by the idle ratios; the capacities' ratio breaks
  the tie when both wait (and is shown either way, with the figures).

Every rate and ratio is taken over a sliding window (``window_s``, 60 s by default, shortened to the time since the
first event); counters and histograms are cumulative, as Prometheus expects. Hooks are a few dict/deque operations
each; nothing is computed until someone asks (``/status``, a scrape). ``prometheus_client`` is imported only by
the export module, so the rollout layer does not need it installed.
"""
from __future__ import annotations

import math
import threading
import time
from bisect import bisect_left
from collections import deque
from typing import Any, Callable

from envhub.rollout.bottleneck import bound

STAGE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
LAG_BUCKETS = (0.0, 1.0, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0)
STAGES = ("queue", "init", "run", "eval", "model_call", "tool_call")
FAILED = {"error", "timeout"}


class Occupancy:
    """An on/off signal in time (the generator busy, the trainer in a step); :meth:`on_fraction` integrates it over
    any span inside the last ``keep_s`` seconds."""

    def __init__(self, keep_s: float):
        self.keep_s = keep_s
        self.changes: deque[tuple[float, bool]] = deque()  # (time, on from then)
        self.first: float | None = None

    def set(self, on: bool, t: float) -> None:
        if self.first is None:
            self.first = t
        if self.changes and self.changes[-1][1] == on:
            return
        self.changes.append((t, on))
        while len(self.changes) > 2 and self.changes[1][0] < t - self.keep_s:
            self.changes.popleft()  # the first kept change still says the state at the window's start

    def on_fraction(self, start: float, end: float) -> float | None:
        if end <= start or not self.changes:
            return None
        on_s, state, since = 0.0, False, start
        for t, on in self.changes:
            if t > end:
                break
            if t > since:
                on_s += (t - since) if state else 0.0
                since = t
            state = on
        on_s += (end - since) if state else 0.0
        return on_s / (end - start)


class Hist:
    """A cumulative histogram (Prometheus buckets, sum, count) that also keeps recent observations for windowed
    quantiles."""

    __slots__ = ("buckets", "counts", "sum", "count", "recent")

    def __init__(self, buckets: tuple[float, ...], keep: int = 2048):
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum, self.count = 0.0, 0
        self.recent: deque[tuple[float, float, int]] = deque(maxlen=keep)

    def observe(self, v: float, t: float, n: int = 1) -> None:
        """``n`` observations of value ``v`` at time ``t`` (``n``: the tokens of one rollout sharing one lag)."""
        self.counts[bisect_left(self.buckets, v)] += n  # the first bucket with v <= le (len: +Inf)
        self.sum += v * n
        self.count += n
        self.recent.append((t, v, n))

    def summary(self, since: float) -> dict[str, Any]:
        vals = sorted((v, n) for t, v, n in self.recent if t >= since)
        total = sum(n for _, n in vals)
        if not total:
            return {"count": 0}

        def q(p: float) -> float:
            acc, want = 0, p * total
            for v, n in vals:
                acc += n
                if acc > want:
                    return v
            return vals[-1][0]

        return {"count": total, "mean": sum(v * n for v, n in vals) / total, "p50": q(0.5), "p90": q(0.9),
                "p99": q(0.99), "max": vals[-1][0]}

    def cumulative(self) -> list[tuple[str, int]]:
        out, acc = [], 0
        for b, c in zip([*map(str, self.buckets), "+Inf"], self.counts):
            acc += c
            out.append((b, acc))
        return out


class Throughput:
    """Every throughput figure of one server (see the module docstring). The server calls the hooks; readers call
    :meth:`snapshot` (a dict, what ``/status`` shows) or scrape ``GET /metrics`` (``throughput_export``).

    Args:
        window_s: the sliding window of rates and ratios.
        gauges: ``() -> dict`` of live figures read at snapshot time: ``queue_depth`` ``{stage: n}``,
            ``sandboxes`` ``{live, limit, waiting}``, ``backends`` ``{name: {in_flight, waiting?}}``.
        clock: seconds, monotonic (tests may pass their own).
    """

    def __init__(self, window_s: float = 60.0, gauges: Callable[[], dict[str, Any]] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.window_s, self.gauges, self.clock = float(window_s), gauges, clock
        keep = self.window_s * 2
        self._gen_first: float | None = None  # the first rollout's start: the generator's window begins there
        self.trainer = Occupancy(keep)  # the trainer inside a step
        self.sandbox_wait = Occupancy(keep)  # an INIT waiting for a sandbox slot at the node's limit
        self._inflight = 0
        self._waiting = 0
        self._lock = threading.Lock()  # sandbox hooks come from INIT threads
        self.finished: deque[tuple[float, str, float]] = deque()  # (t, outcome, seconds in the pipeline)
        self.load: deque[tuple[float, int]] = deque()  # (t, rollouts in the pipeline from then), at every change
        self.steps: deque[tuple[float, float, int]] = deque()  # (end t, compute seconds, samples)
        self.consumed_events: deque[tuple[float, int]] = deque()
        # model calls in one-second bins per backend, [second, backend, calls, seconds, tokens]: memory bounded by
        # the window, not by the call rate (a busy node answers thousands of calls a second)
        self.calls: deque[list[Any]] = deque()
        self._bins: dict[str, list[Any]] = {}
        self._step_began: float | None = None
        self.stages = {s: Hist(STAGE_BUCKETS) for s in STAGES}
        self.lag = {"sample": Hist(LAG_BUCKETS), "token": Hist(LAG_BUCKETS)}
        self.span = Hist(LAG_BUCKETS)
        self.counts: dict[str, int] = {}  # outcome / verdict -> rollouts
        self.wasted_s: dict[str, float] = {}  # reason -> in-stage seconds spent on rollouts not trained on
        self.sandbox_failures: dict[str, int] = {}
        self.backend_tokens: dict[str, int] = {}
        self.partial = {"rollouts": 0, "interruptions": 0}
        self.totals = {"steps": 0, "consumed": 0, "discarded": 0, "step_reports": 0}

    # ---- hooks: the generator ---------------------------------------------------------------------------------------
    def job_started(self) -> None:
        """A request started to take a generator slot (arrived, or admitted by the gate after waiting)."""
        self._inflight += 1
        now = self.clock()
        if self._gen_first is None:
            self._gen_first = now
        self.load.append((now, self._inflight))

    def job_finished(self, result: dict[str, Any], times: dict[str, float]) -> None:
        """A rollout finished with ``result`` (the ``/process`` reply dict; :meth:`job_left` follows once it is
        sent back); ``times`` is its
        :class:`~envhub.service.jobs.PhaseTimer`'s (``init``, ``run``, ``eval``, ``others`` = queued)."""
        now = self.clock()
        for stage, key in (("queue", "others"), ("init", "init"), ("run", "run"), ("eval", "eval")):
            if key != "eval" or times.get("eval"):
                self.stages[stage].observe(times.get(key, 0.0), now)
        in_stage = times.get("init", 0.0) + times.get("run", 0.0) + times.get("eval", 0.0)
        verdict = ((result.get("details") or {}).get("staleness") or {})
        reason = result.get("finish_reason")
        if reason == "cancelled":
            outcome = "cancelled"  # an oversampled job stopped once its group was complete, or a drop
            if verdict.get("verdict") == "dropped":
                outcome = "dropped"
        elif reason in FAILED:
            outcome = reason
        elif verdict.get("verdict") in ("withheld", "dropped"):
            outcome = verdict["verdict"]
        else:
            outcome = "accepted"
        self.counts[outcome] = self.counts.get(outcome, 0) + 1
        if outcome != "accepted":
            self.wasted_s[outcome] = self.wasted_s.get(outcome, 0.0) + in_stage
        self.finished.append((now, outcome, in_stage + times.get("others", 0.0)))
        version = verdict.get("version")
        versions = result.get("response_versions") or []
        # distinct versions by set(), tokens per version by list.count (both C loops; a rollout has thousands of
        # tokens and one to a few versions, so this costs microseconds where a Python loop would cost a millisecond)
        tokens = {v: versions.count(v) for v in set(versions) if v >= 0}  # -1: the env's tokens, never sampled
        model = list(tokens)
        if isinstance(version, int) and outcome != "cancelled":  # staleness of what is handed to the trainer
            if isinstance(verdict.get("dispatch_version"), int):
                self.lag["sample"].observe(max(0, version - verdict["dispatch_version"]), now)
            for v in model:  # one observation per distinct version, weighted by its tokens
                self.lag["token"].observe(max(0, version - v), now, tokens[v])
        span = (max(model) - min(model)) if model else 0
        stops = int((result.get("metrics") or {}).get("interruptions", 0) or 0)
        if span or stops:
            self.partial["rollouts"] += 1
            self.partial["interruptions"] += stops
            self.span.observe(span, now)
        self._trim(now)

    def job_left(self) -> None:
        """A request stopped taking a slot (answered, refused, or waiting for the gate's admission)."""
        now = self.clock()
        self._inflight = max(0, self._inflight - 1)
        self.load.append((now, self._inflight))

    def model_call(self, backend: str, seconds: float, tokens: int) -> None:
        """One generate call answered by ``backend`` (the pool's observer)."""
        now = self.clock()
        self.stages["model_call"].observe(seconds, now)
        b = self._bins.get(backend)
        if b is None or b[0] != int(now):
            b = self._bins[backend] = [int(now), backend, 0, 0.0, 0]
            self.calls.append(b)
        b[2] += 1
        b[3] += seconds
        b[4] += tokens
        self.backend_tokens[backend] = self.backend_tokens.get(backend, 0) + tokens

    def tool_call(self, seconds: float) -> None:
        """One env step (the tool calls of one turn) took ``seconds``."""
        self.stages["tool_call"].observe(seconds, self.clock())

    def sandbox_failed(self, cause: str) -> None:
        with self._lock:
            self.sandbox_failures[cause] = self.sandbox_failures.get(cause, 0) + 1

    def sandbox_waiting(self, delta: int) -> None:
        """An INIT started (+1) or stopped (-1) waiting for a sandbox slot under the node's limit."""
        with self._lock:
            self._waiting = max(0, self._waiting + delta)
            self.sandbox_wait.set(self._waiting > 0, self.clock())

    # ---- hooks: the trainer ------------------------------------------------------------------------------------------
    def trainer_step(self, phase: str, samples: int | None = None, at: float | None = None) -> dict[str, Any]:
        """The trainer's step boundary: ``begin`` (it has its batch) or ``end`` (``samples`` trained in the step).

        ``at``: when the boundary happened, in Unix seconds (the trainer's ``time.time()``). A report reaches a busy
        server late -- 0.7 s on a loaded 2-core node, every step -- and timed on arrival it would count that delay as
        trainer idle. The boundary is placed ``time.time() - at`` before now, at most 60 s back (a skewed clock) and
        never before the trainer's previous boundary; without ``at``, on arrival."""
        if phase not in ("begin", "end"):
            raise ValueError(f"phase must be 'begin' or 'end', got {phase!r}")
        if samples is not None and (not isinstance(samples, int) or isinstance(samples, bool) or samples < 0):
            raise ValueError(f"samples must be an integer >= 0, got {samples!r}")
        if at is not None and (isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at)):
            raise ValueError(f"at must be a Unix time in seconds, got {at!r}")
        now = self.clock()
        if at is not None:
            late = min(max(time.time() - float(at), 0.0), 60.0)
            last = self.trainer.changes[-1][0] if self.trainer.changes else now - late
            now = max(now - late, last)
        self.totals["step_reports"] += 1
        self.trainer.set(phase == "begin", now)
        if phase == "begin":
            self._step_began = now
        else:
            began, self._step_began = self._step_began, None
            if began is not None:
                self.steps.append((now, now - began, int(samples or 0)))
                self.totals["steps"] += 1
            if samples:
                self.consumed(samples, from_step=True)
        self._trim(now)
        return {"phase": phase, "steps": self.totals["steps"], "consumed": self.totals["consumed"]}

    def consumed(self, n: int, from_step: bool = False) -> None:
        """``n`` samples taken by the trainer. Step reports count them; a gate report's ``consumed`` counts only for
        a trainer that never said ``samples`` in a step report (else each sample would count twice)."""
        if not from_step and any(s for _, _, s in self.steps):
            return
        self.totals["consumed"] += n
        self.consumed_events.append((self.clock(), n))

    def discarded(self, n: int) -> None:
        """The trainer threw away ``n`` delivered samples (DAPO's zero-variance groups)."""
        self.totals["discarded"] += n
        self.counts["discarded"] = self.counts.get("discarded", 0) + n

    # ---- reading ----------------------------------------------------------------------------------------------------
    def _trim(self, now: float) -> None:
        old = now - self.window_s * 2
        for q in (self.finished, self.steps, self.consumed_events, self.calls):
            while q and q[0][0] < old:
                q.popleft()
        while len(self.load) > 1 and self.load[1][0] < old:  # the first kept entry says the load at the cut
            self.load.popleft()

    def _mean_load(self, start: float, end: float) -> float:
        """Time-averaged rollouts in the pipeline over ``[start, end]``."""
        area, n, since = 0.0, 0, start
        for t, m in self.load:
            if t > end:
                break
            if t > since:
                area += n * (t - since)
                since = t
            n = m
        return (area + n * (end - since)) / (end - start)

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """Every figure over the window ending ``now`` (see the module docstring); ``bound`` names the bottleneck."""
        now = self.clock() if now is None else now
        g0 = max(now - self.window_s, self._gen_first if self._gen_first is not None else now)
        t0 = max(now - self.window_s, self.trainer.first if self.trainer.first is not None else now)
        span_g = now - g0
        fin = [f for f in self.finished if f[0] >= g0]
        produced = [f for f in fin if f[1] != "cancelled"]
        accepted = sum(1 for f in fin if f[1] == "accepted")
        steps = [s for s in self.steps if s[0] >= t0]
        eaten = sum(n for t, n in self.consumed_events if t >= t0)
        # the generator's busy share: rollouts in the pipeline on average over the most it has run at once (the
        # concurrency its client or the gate allows, as seen in the last two windows): a generator held back to
        # half its slots is half idle, though never empty
        peak = max([n for _, n in self.load] + [self._inflight])
        busy_g = self._mean_load(g0, now) / peak if peak and now > g0 else None
        busy_t = self.trainer.on_fraction(t0, now)
        discarded = min(accepted, self._recent_discards(len(produced)))
        acceptance = (accepted - discarded) / len(produced) if produced else None
        prod = len(produced) / span_g if span_g > 0 else None
        latency = sum(f[2] for f in produced) / len(produced) if produced else None
        step_s = sum(s[1] for s in steps) / len(steps) if steps else None
        per_step = sum(s[2] for s in steps) / len(steps) if steps else None
        calls = [c for c in self.calls if c[0] + 1 > g0]  # bins overlapping the window
        backends: dict[str, dict[str, Any]] = {}
        for _, name, n, secs, toks in calls:
            b = backends.setdefault(name, {"calls": 0, "tokens": 0, "call_s": 0.0})
            b["calls"] += n
            b["tokens"] += toks
            b["call_s"] += secs
        live = self.gauges() if self.gauges is not None else {}
        for name, b in backends.items():
            b["tokens_per_s"] = b["tokens"] / span_g if span_g > 0 else None
            b.update((live.get("backends") or {}).get(name, {}))
        for name, b in (live.get("backends") or {}).items():
            backends.setdefault(name, {"calls": 0, "tokens": 0, "call_s": 0.0, "tokens_per_s": 0.0, **b})
        snap: dict[str, Any] = {
            "window_s": round(span_g, 3),
            "production_rate": prod,
            "effective_production_rate": prod * acceptance if prod is not None and acceptance is not None else None,
            "acceptance": acceptance,
            "consumption_rate": eaten / (now - t0) if now > t0 else None,
            "trainer_idle_ratio": 1.0 - busy_t if busy_t is not None else None,
            "generator_idle_ratio": 1.0 - busy_g if busy_g is not None else None,
            "trainer_step_s": step_s,
            "samples_per_step": per_step,
            "trainer_capacity": per_step / step_s if step_s and per_step else None,
            "generator_capacity": acceptance * peak / latency if latency and acceptance is not None else None,
            "rollout_latency_s": latency, "peak_concurrency": peak,
            "finished": len(fin), "steps": len(steps),
            "outcomes": dict(self.counts), "wasted_s": dict(self.wasted_s),
            "stages": {s: h.summary(g0) for s, h in self.stages.items()},
            "staleness": {k: h.summary(g0) for k, h in self.lag.items()},
            "partial": {**self.partial, "span": self.span.summary(g0)},
            "sandboxes": {**(live.get("sandboxes") or {}), "failures": dict(self.sandbox_failures),
                          "waiting_ratio": self.sandbox_wait.on_fraction(g0, now) or 0.0},
            "backends": backends,
            "queue_depth": live.get("queue_depth", {}),
            "totals": dict(self.totals),
        }
        snap["bound"] = bound(snap)
        return snap

    def _recent_discards(self, produced: int) -> int:
        """Trainer discards are reported as counts, not per sample: over the window they are taken in proportion."""
        total = sum(1 for f in self.finished if f[1] != "cancelled") or 1
        return round(self.totals["discarded"] * min(1.0, produced / total))
