"""The live view's figures: one flat row per replica from what it answers (a rollout service's ``GET /status``, a
gateway's ``GET /stats``), and the row of the whole (:func:`total`). Pure functions of dicts, no I/O: ``envhub top``
renders these rows (:mod:`envhub.cli.top_view`), a run directory's ``throughput.jsonl`` stores them
(:mod:`envhub.rollout.livepoll`), ``envhub show --plot`` draws them.

A replica's row keeps what a person watching a run looks at (docs/metrics.md defines each figure): rates, idle
ratios, the bound verdict with its figures, queue depth, sandboxes, per-backend tokens/s and queue, staleness,
outcomes, stage latency quantiles. Nothing here computes a figure the server did not; only :func:`total` combines.

How the whole is summed, and why (each one a sum where the figure adds up, never a plain mean of ratios):

* production, effective production, consumption, capacities, queue depth, live sandboxes and their limit,
  tokens/s and in-flight calls per backend: **sums** (each replica counts its own rollouts; a trainer reporting
  to several servers splits its samples between them, ``RolloutClient.trainer_step``);
* acceptance: effective production ÷ production of the whole (a production-weighted mean);
* generator idle: the unused share of **all** slots, ``1 − Σ busy_i ÷ Σ peak_i`` with ``busy_i = (1 − idle_i) ×
  peak_i`` (a replica of 64 slots weighs 16 times one of 4);
* trainer idle: the mean over replicas that have one (one trainer tells every replica its steps, so they agree);
* a backend's own queue (``waiting``): the largest any replica saw (replicas that share a vLLM server each report
  the same queue, a sum would count it once per replica);
* stage quantiles and staleness: the worst replica's (quantiles of different replicas cannot be merged from their
  summaries; the worst is what a person hunting a straggler wants);
* ``bound``: :func:`envhub.rollout.bottleneck.bound` over the summed figures, the same rule each replica applies.
"""
from __future__ import annotations

from typing import Any

from envhub.rollout.bottleneck import bound as bound_of

RATES = ("production_rate", "effective_production_rate", "consumption_rate", "trainer_capacity",
         "generator_capacity")
GATEWAY_COUNTERS = ("calls", "errors", "spliced", "new_chains", "drift_checks", "drift")


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else None


def row_of(sample: dict[str, Any], previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """One replica's row from a poll ``sample`` (``{url, t, kind: service|gateway|down, body | error}``).
    ``previous``: the same replica's previous sample (a gateway's call rate is the difference of its counters)."""
    row: dict[str, Any] = {"url": sample["url"], "t": sample["t"], "kind": sample["kind"]}
    if sample["kind"] == "down":
        row["error"] = sample.get("error") or "unreachable"
        return row
    body = sample.get("body") or {}
    if sample["kind"] == "gateway":
        row.update({k: body.get(k, 0) for k in (*GATEWAY_COUNTERS, "sessions", "capacity")})
        prev = (previous or {}).get("body") or {}
        dt = sample["t"] - previous["t"] if previous and previous.get("kind") == "gateway" else 0.0
        for k in ("calls", "errors"):  # counters restart with the gateway: a drop is a restart, not a negative rate
            d = body.get(k, 0) - prev.get(k, 0)
            row[f"{k}_per_s"] = d / dt if dt > 0 and d >= 0 else None
        return row
    return {**row, **service_row(body)}


def snapshot_row(snapshot: dict[str, Any], url: str, t: float) -> dict[str, Any]:
    """The row of an in-process :class:`~envhub.rollout.throughput.Throughput` (``snapshot()``, its ``bound``
    included), as if its server had answered ``/status`` (``envhub rollout --out`` records its own run this way)."""
    snap = dict(snapshot)
    body = {"status": "running", "stages": {}, "bound": snap.pop("bound", None), "throughput": snap}
    return row_of({"url": url, "t": t, "kind": "service", "body": body})


def service_row(status: dict[str, Any]) -> dict[str, Any]:
    """The figures of a service's ``/status`` (``throughput`` and ``bound``; a server with metrics off has neither:
    its row says so instead of showing zeros)."""
    tp, bd = status.get("throughput"), status.get("bound") or {}
    stages = status.get("stages") or {}
    row: dict[str, Any] = {"status": status.get("status"), "uptime_s": status.get("uptime_s"),
                           "in_flight": sum(s.get("in_flight", 0) for s in stages.values()),
                           "queue": {k: s.get("queued", 0) for k, s in stages.items()}}
    if tp is None:
        row["error"] = "metrics are off on this server (RolloutService(metrics=False))"
        return row
    row.update({k: tp.get(k) for k in (*RATES, "acceptance", "trainer_idle_ratio", "generator_idle_ratio",
                                       "rollout_latency_s", "peak_concurrency", "window_s", "finished", "steps",
                                       "trainer_step_s", "samples_per_step")})
    row["queue"] = dict(tp.get("queue_depth") or row["queue"])
    row["bound"] = {k: bd.get(k) for k in ("bound", "side", "ratio", "why")}
    sb = tp.get("sandboxes") or {}
    row["sandboxes"] = {"live": sb.get("live"), "limit": sb.get("limit"), "waiting": sb.get("waiting"),
                        "waiting_ratio": sb.get("waiting_ratio"), "failures": dict(sb.get("failures") or {})}
    row["backends"] = {name: {k: b.get(k) for k in ("tokens_per_s", "in_flight", "waiting", "calls", "call_s")}
                       for name, b in (tp.get("backends") or {}).items()}
    row["stages"] = {name: {k: s.get(k) for k in ("count", "mean", "p50", "p90", "p99")}
                     for name, s in (tp.get("stages") or {}).items()}
    row["staleness"] = {unit: {k: s.get(k) for k in ("count", "mean", "p50", "p90", "max")}
                        for unit, s in (tp.get("staleness") or {}).items()}
    outcomes = dict(tp.get("outcomes") or {})
    row["outcomes"] = outcomes
    out = sum(v for k, v in outcomes.items() if k not in ("cancelled", "discarded"))
    # cumulative shares since the server started (the windowed acceptance is ``acceptance``)
    row["discard_share"] = (outcomes.get("discarded", 0) / out) if out else None
    row["cancelled"] = outcomes.get("cancelled", 0)
    row["wasted_s"] = sum((tp.get("wasted_s") or {}).values())
    row["partial"] = (tp.get("partial") or {}).get("rollouts", 0)
    ctl = status.get("controller")
    if isinstance(ctl, dict):  # `envhub serve --controller aimd`: the limit it sets, what bounds it, its last decision
        log = ctl.get("log") or []
        row["controller"] = {**{k: ctl.get(k) for k in ("limit", "in_flight", "ceiling", "ceiling_by", "phase",
                                                         "oversampling")},
                             "last": {k: log[-1].get(k) for k in ("action", "old", "new", "reason")} if log else None}
    return row


def total(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The row of the whole (see the module docstring for how each figure combines): ``replicas`` polled, of which
    ``down`` did not answer, ``services`` rollout services with figures, ``gateways``."""
    svc = [r for r in rows if r["kind"] == "service" and "production_rate" in r]
    gws = [r for r in rows if r["kind"] == "gateway"]
    out: dict[str, Any] = {"url": "TOTAL", "kind": "total", "t": max((r["t"] for r in rows), default=None),
                           "replicas": len(rows), "down": sum(r["kind"] == "down" for r in rows),
                           "services": len(svc), "gateways": len(gws)}

    def add(key: str, rs: list[dict[str, Any]]) -> float | None:
        vals: list[Any] = [r[key] for r in rs if _num(r.get(key)) is not None]
        return sum(vals) if vals else None  # ints stay ints (counts print as counts)

    for key in (*RATES, "finished", "in_flight", "peak_concurrency", "wasted_s", "partial", "cancelled"):
        out[key] = add(key, svc)
    out["steps"] = max((r.get("steps") or 0 for r in svc), default=0)  # the same trainer's steps, seen by each
    prod, eff = out["production_rate"], out["effective_production_rate"]
    out["acceptance"] = eff / prod if prod and eff is not None else None
    ti = [v for v in (_num(r.get("trainer_idle_ratio")) for r in svc) if v is not None]
    out["trainer_idle_ratio"] = sum(ti) / len(ti) if ti else None
    slots = [(r["generator_idle_ratio"], r["peak_concurrency"]) for r in svc
             if _num(r.get("generator_idle_ratio")) is not None and _num(r.get("peak_concurrency"))]
    peak = sum(p for _, p in slots)
    out["generator_idle_ratio"] = 1.0 - sum((1.0 - g) * p for g, p in slots) / peak if peak else None
    lat = [(r["rollout_latency_s"], r.get("production_rate") or 0.0) for r in svc
           if _num(r.get("rollout_latency_s")) is not None]
    weight = sum(w for _, w in lat)
    out["rollout_latency_s"] = (sum(v * w for v, w in lat) / weight if weight else
                                (sum(v for v, _ in lat) / len(lat) if lat else None))
    queue: dict[str, int] = {}
    for r in svc:
        for k, n in (r.get("queue") or {}).items():
            queue[k] = queue.get(k, 0) + n
    out["queue"] = queue
    sbs = [r.get("sandboxes") or {} for r in svc]
    failures: dict[str, int] = {}
    for sb in sbs:
        for k, n in sb.get("failures", {}).items():
            failures[k] = failures.get(k, 0) + n
    out["sandboxes"] = {"live": add("live", sbs), "limit": add("limit", sbs), "waiting": add("waiting", sbs),
                        "waiting_ratio": max((sb.get("waiting_ratio") or 0.0 for sb in sbs), default=0.0),
                        "failures": failures}
    backends: dict[str, dict[str, Any]] = {}
    for r in svc:
        for name, b in (r.get("backends") or {}).items():
            t = backends.setdefault(name, {"tokens_per_s": None, "in_flight": None, "waiting": None, "calls": None,
                                           "call_s": None})
            for k in ("tokens_per_s", "in_flight", "calls", "call_s"):
                if _num(b.get(k)) is not None:
                    t[k] = (t[k] or 0) + b[k]
            if _num(b.get("waiting")) is not None:
                t["waiting"] = max(t["waiting"] or 0, b["waiting"])
    out["backends"] = backends
    out["stages"] = _worst([r.get("stages") or {} for r in svc], ("p50", "p90", "p99"))
    out["staleness"] = _worst([r.get("staleness") or {} for r in svc], ("p50", "p90", "max"))
    outcomes: dict[str, int] = {}
    for r in svc:
        for k, n in (r.get("outcomes") or {}).items():
            outcomes[k] = outcomes.get(k, 0) + n
    out["outcomes"] = outcomes
    done = sum(v for k, v in outcomes.items() if k not in ("cancelled", "discarded"))
    out["discard_share"] = outcomes.get("discarded", 0) / done if done else None
    limits = [r["controller"]["limit"] for r in svc if _num((r.get("controller") or {}).get("limit")) is not None]
    out["controller_limit"] = sum(limits) if limits else None  # rollouts the controllers allow in flight, in all
    for k in (*GATEWAY_COUNTERS, "sessions", "capacity", "calls_per_s", "errors_per_s"):
        if gws:
            out["gw_" + k] = add(k, gws)
    out["bound"] = _bound(out) if svc else {"bound": "unknown", "side": "unknown", "ratio": None,
                                            "why": "no rollout service reported throughput figures"}
    return out


def _worst(per: list[dict[str, dict[str, Any]]], keys: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for d in per:
        for name, q in d.items():
            t = out.setdefault(name, {"count": 0, "sum": 0.0})
            t["count"] += q.get("count") or 0
            t["sum"] += (q.get("count") or 0) * (_num(q.get("mean")) or 0.0)  # the whole's mean: sum / count
            for k in keys:
                if _num(q.get(k)) is not None:
                    t[k] = max(t.get(k, q[k]), q[k])
    for t in out.values():  # the mean is exact (count-weighted); quantiles are the worst replica's
        t["mean"] = t["sum"] / t["count"] if t["count"] else None
    return out


def _bound(t: dict[str, Any]) -> dict[str, Any]:
    """The verdict over the summed figures, by the rule every replica applies (``bottleneck.bound``)."""
    # RUN seconds of the whole (call-seconds are compared with them): the count-weighted mean, not the worst
    stages = {name: {"count": q["count"], "mean": q["mean"] or 0.0} for name, q in t["stages"].items()}
    snap = {k: t.get(k) for k in (*RATES, "acceptance", "trainer_idle_ratio", "generator_idle_ratio",
                                  "rollout_latency_s", "peak_concurrency")}
    snap.update(finished=int(t.get("finished") or 0), steps=int(t.get("steps") or 0),
                stages={**{s: {"count": 0} for s in ("init", "run")}, **stages}, sandboxes=t["sandboxes"],
                backends={n: {"call_s": b.get("call_s") or 0.0} for n, b in t["backends"].items()})
    b = bound_of(snap)
    return {k: b.get(k) for k in ("bound", "side", "ratio", "why")}
