"""The gateway's figures for ``GET /metrics``: ``prometheus_client`` families read from the app at scrape time."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envhub.gateway.app import GatewayApp

GATEWAY_COUNTERS = {
    "calls": "Model calls served.", "spliced": "Calls that continued a chain (their prompt extends an earlier call's).",
    "new_chains": "Calls that began a new chain.", "errors": "Calls that failed.",
    "drift_checks": "Spliced calls also rendered canonically to compare.",
    "drift": "Drift checks whose canonical rendering differed from the spliced tokens.",
}


class _GatewayCollector:
    """The gateway's figures as ``prometheus_client`` families, read at scrape time (nothing on the call path)."""

    def __init__(self, app: GatewayApp):
        self.app = app

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        stats = self.app._stats()
        for key, doc in GATEWAY_COUNTERS.items():
            c = CounterMetricFamily(f"envhub_gateway_{key}", doc)
            c.add_metric([], stats.get(key, 0))
            yield c
        for key, doc in (("sessions", "Sessions open."), ("capacity", "Sessions granted and not yet started.")):
            g = GaugeMetricFamily(f"envhub_gateway_{key}", doc)
            g.add_metric([], stats[key])
            yield g
        gate = self.app.gw.gate.status()
        for key, value in sorted(gate.items()):  # the staleness gate's version, running, accepted, counts...
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                g = GaugeMetricFamily(f"envhub_gate_{key}", f"The staleness gate's {key} (GET /staleness).")
                g.add_metric([], float(value))
                yield g
