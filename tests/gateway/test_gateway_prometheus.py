"""The gateway's ``GET /metrics`` is Prometheus text written by prometheus_client (issue #26): read back with
prometheus_client's own parser it says what the JSON counters (``GET /stats``) say, the gate's figures included,
and each gateway has its own registry."""
from __future__ import annotations

import httpx
import pytest
from gw_helpers import TOOLS, agent_policy
from prometheus_client.parser import text_string_to_metric_families

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread

pytestmark = pytest.mark.timeout(120)
ADMIN = "admin-key"


def scrape(url: str) -> dict[str, float]:
    r = httpx.get(url + "/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain"), r.text
    return {s.name: s.value for f in text_string_to_metric_families(r.text) for s in f.samples}


def test_gateway_metrics_match_its_counters(tiny_tokenizer):
    gw_a = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    gw_b = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    with GatewayThread(gw_a, token=ADMIN) as a, GatewayThread(gw_b, token=ADMIN) as b:
        auth = {"Authorization": f"Bearer {ADMIN}"}
        key = httpx.post(a.url + "/sessions", json={"task_id": "t"}, headers=auth, timeout=30).json()["api_key"]
        for _ in range(2):
            r = httpx.post(a.url + "/chat/completions", json={"model": "m", "tools": TOOLS, "messages": [
                {"role": "user", "content": "List files."}]}, headers={"Authorization": f"Bearer {key}"}, timeout=30)
            assert r.status_code == 200, r.text
        httpx.post(a.url + "/staleness/report", json={"version": 3}, headers=auth, timeout=30).raise_for_status()
        stats, got = httpx.get(a.url + "/stats", timeout=30).json(), scrape(a.url)
        assert stats["calls"] == 2
        for key in ("calls", "spliced", "new_chains", "errors", "drift_checks", "drift"):
            assert got[f"envhub_gateway_{key}_total"] == stats[key], key
        assert got["envhub_gateway_sessions"] == stats["sessions"] == 1
        assert got["envhub_gateway_capacity"] == stats["capacity"]
        assert got["envhub_gate_version"] == 3
        other = scrape(b.url)  # its own registry: nothing of a's
        assert other["envhub_gateway_calls_total"] == 0 and other["envhub_gate_version"] == 0
