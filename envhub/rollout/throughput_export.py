"""The Prometheus side of :mod:`envhub.rollout.throughput`: a ``prometheus_client`` collector that turns a
:class:`~envhub.rollout.throughput.Throughput` into metric families at scrape time, and :func:`render` (the text a
``GET /metrics`` answers).

Why a custom collector rather than ``Counter``/``Histogram`` objects updated in the hooks: the figures live in one
place (the ``Throughput``, which ``/status`` and a future ``envhub top`` read as a dict), the hot path pays a dict
increment instead of a metric object's lock, and windowed rates and ratios are computed once per scrape. Each server
registers its collector in its own ``CollectorRegistry`` (never the global one: several servers share a test
process). Every metric is named ``envhub_*``; docs/metrics.md defines each one.
"""
from __future__ import annotations

from typing import Any, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from envhub.rollout.throughput import Hist, Throughput

RATES = {
    "production_rate": "Rollouts finished per second over the window (cancelled ones excluded).",
    "effective_production_rate": "Production rate times acceptance: samples the trainer can use, per second.",
    "consumption_rate": "Samples the trainer took per second over the window (its step reports).",
    "acceptance": "Share of finished rollouts the trainer can use (not failed, stale, withheld or discarded).",
    "trainer_idle_ratio": "Share of the window the trainer spent between a step's end and the next begin.",
    "generator_idle_ratio": "Share of the window with no rollout inside the pipeline.",
    "trainer_capacity": "Samples per step divided by step compute time: what the trainer could consume per second.",
    "generator_capacity": "Acceptance x peak concurrency / mean rollout latency: what the generator could produce per second.",
}


def _hist(name: str, doc: str, label: str, hists: dict[str, Hist]) -> HistogramMetricFamily:
    fam = HistogramMetricFamily(name, doc, labels=[label])
    for key, h in hists.items():
        fam.add_metric([key], h.cumulative(), h.sum)
    return fam


class ThroughputCollector:
    """``registry.register(ThroughputCollector(throughput))``; ``collect()`` yields every ``envhub_*`` family."""

    def __init__(self, throughput: Throughput, extra: Any = None):
        self.t = throughput
        self.extra = extra  # () -> iterable of more families (the gateway's own counters)

    def describe(self) -> list[Any]:
        return []  # collected lazily: nothing is computed at registration

    def collect(self) -> Iterator[Any]:
        t, s = self.t, self.t.snapshot()
        for key, doc in RATES.items():
            g = GaugeMetricFamily(f"envhub_{key}", doc)
            g.add_metric([], float("nan") if s[key] is None else float(s[key]))
            yield g
        c = CounterMetricFamily("envhub_rollouts_finished", "Rollouts that left the pipeline, by outcome "
                                "(accepted, error, timeout, cancelled, withheld, dropped; discarded: reported by "
                                "the trainer).", labels=["outcome"])
        for k, v in sorted(t.counts.items()):
            c.add_metric([k], v)
        yield c
        c = CounterMetricFamily("envhub_rollout_wasted_seconds", "In-stage seconds spent on rollouts the trainer "
                                "does not train on, by outcome.", labels=["outcome"])
        for k, secs in sorted(t.wasted_s.items()):
            c.add_metric([k], secs)
        yield c
        for key, doc in (("steps", "Trainer steps reported (begin then end)."),
                         ("consumed", "Samples the trainer reported taking."),
                         ("discarded", "Delivered samples the trainer reported discarding (zero-variance groups).")):
            c = CounterMetricFamily(f"envhub_trainer_{key}", doc)
            c.add_metric([], t.totals[key])
            yield c
        yield _hist("envhub_stage_seconds", "Time per stage: queue wait, INIT, RUN, EVAL, each model call, each tool "
                    "step.", "stage", t.stages)
        yield _hist("envhub_staleness_versions", "Versions behind the trainer when a rollout is handed over: per "
                    "sample (since dispatch) and per model token.", "unit", t.lag)
        yield _hist("envhub_partial_span_versions", "Version span (newest - oldest) of partial rollouts.", "kind",
                    {"partial": t.span})
        c = CounterMetricFamily("envhub_partial_rollouts", "Rollouts whose tokens come from more than one version "
                                "or whose generation was interrupted.")
        c.add_metric([], t.partial["rollouts"])
        yield c
        c = CounterMetricFamily("envhub_rollout_interruptions", "Generation calls interrupted by a weight update.")
        c.add_metric([], t.partial["interruptions"])
        yield c
        sb = s["sandboxes"]
        c = CounterMetricFamily("envhub_sandbox_init_failures", "Sandbox starts that failed, by cause.",
                                labels=["cause"])
        for k, v in sorted(sb["failures"].items()):
            c.add_metric([k], v)
        yield c
        for key, doc in (("live", "Sandboxes alive in the server's process."),
                         ("limit", "Live sandboxes allowed on this node (--max-sandboxes)."),
                         ("waiting", "INITs waiting for a sandbox slot under the limit."),
                         ("waiting_ratio", "Share of the window some INIT waited for a sandbox slot.")):
            if key in sb:
                g = GaugeMetricFamily(f"envhub_sandboxes_{key}", doc)
                g.add_metric([], float(sb[key]))
                yield g
        fams: dict[str, Any] = {
            "tokens": CounterMetricFamily("envhub_backend_tokens", "Tokens sampled, per backend.",
                                          labels=["backend"]),
            "tokens_per_s": GaugeMetricFamily("envhub_backend_tokens_per_second", "Tokens sampled per second over "
                                              "the window, per backend.", labels=["backend"]),
            "in_flight": GaugeMetricFamily("envhub_backend_in_flight", "Generate calls sent and not answered, per "
                                           "backend (the queue the server sees from here).", labels=["backend"]),
            "waiting": GaugeMetricFamily("envhub_backend_waiting", "Requests waiting in the backend's own queue, "
                                         "where the backend reports it.", labels=["backend"]),
        }
        for name, b in sorted(s["backends"].items()):
            fams["tokens"].add_metric([name], t.backend_tokens.get(name, 0))
            for key in ("tokens_per_s", "in_flight", "waiting"):
                if b.get(key) is not None:
                    fams[key].add_metric([name], float(b[key]))
        yield from fams.values()
        g = GaugeMetricFamily("envhub_queue_depth", "Jobs queued for a stage's workers.", labels=["stage"])
        for stage, n in sorted(s["queue_depth"].items()):
            g.add_metric([stage], float(n))
        yield g
        b = s["bound"]
        g = GaugeMetricFamily("envhub_bound", "1 for the bottleneck /status names (bound; side).",
                              labels=["bound", "side"])
        g.add_metric([b["bound"], b["side"]], 1.0)
        yield g
        if self.extra is not None:
            yield from self.extra()


def registry_for(throughput: Throughput, extra: Any = None) -> Any:
    """A fresh ``CollectorRegistry`` holding ``throughput``'s collector (one per server)."""
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(ThroughputCollector(throughput, extra))  # type: ignore[arg-type]
    return reg


def render(registry: Any) -> tuple[bytes, str]:
    """``(body, content type)`` of the Prometheus text exposition of ``registry``."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return generate_latest(registry), CONTENT_TYPE_LATEST
