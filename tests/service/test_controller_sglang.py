"""The controller's reading of SGLang's ``/metrics`` (issue #26): the names and labels come from SGLang 0.5.23's
``SchedulerMetricsCollector`` (``sglang/srt/observability/metrics_collector.py``), rendered as its server renders them
(``sglang_metrics.py`` says how, and why SGLang's own module cannot be imported on a CPU machine). Two data-parallel
schedulers with priority scheduling on: the queues add up over ``dp_rank`` without counting the per-priority
breakdown twice, KV usage is the fullest scheduler's, and preemptions are the retraction counter, not the gauge that
SGLang resets after each stats line. Break-it: the old table (no retraction counter), a misspelt queue name, and the
breakdown label not skipped each make the check fail."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from envhub.service import controller
from envhub.service.controller import parse_server_metrics

from sglang_metrics import EXPECTED, render  # tests/service is on sys.path (its conftest)

pytestmark = pytest.mark.timeout(60)
FIXTURE = Path(__file__).with_name("sglang_metrics_dp2_priority.txt")


def families(text: str) -> set:
    """What a scraper sees, whatever the sample order and the writers' pids."""
    return {(f.name, f.type, f.documentation,
             tuple(sorted((s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "pid")), s.value)
                          for s in f.samples)))
            for f in text_string_to_metric_families(text)}


def test_sglang_scheduler_metrics_read_as_logged():
    assert parse_server_metrics(FIXTURE.read_text()) == EXPECTED


def test_the_fixture_is_what_prometheus_client_renders_today():
    text = render()
    assert re.search(r'sglang:num_retracted_reqs\{[^}]*pid="\d+"', text)  # multiprocess_mode "all": one per pid
    assert families(text) == families(FIXTURE.read_text())
    assert parse_server_metrics(text) == EXPECTED


@pytest.mark.parametrize("breakage", ["old table", "misspelt queue", "breakdown counted"])
def test_break_it(monkeypatch, breakage):
    if breakage == "old table":  # before #26's check: no SGLang preemption signal
        monkeypatch.setitem(controller.SERVER_METRICS, "preemptions", ("vllm:num_preemptions",))
    elif breakage == "misspelt queue":
        monkeypatch.setitem(controller.SERVER_METRICS, "waiting", ("vllm:num_requests_waiting", "sglang:num_queue_req"))
    else:
        monkeypatch.setattr(controller, "BREAKDOWN_LABELS", ())
    got = parse_server_metrics(FIXTURE.read_text())
    assert got != EXPECTED
    if breakage == "breakdown counted":  # every request counted twice (total + its priority)
        assert (got["waiting"], got["running"]) == (14.0, 8.0)
