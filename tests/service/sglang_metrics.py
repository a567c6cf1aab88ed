"""SGLang's scheduler gauges as its ``GET /metrics`` renders them, for the controller's tests.

Why not SGLang's own code: ``import sglang.srt.observability.metrics_collector`` (sglang 0.5.23, where
``SchedulerMetricsCollector`` lives) runs ``sglang/__init__.py``, whose ``sglang.srt.utils.common`` imports triton (a
1 GB wheel), and the collector's own imports go on through ``disaggregation.utils -> configs.model_config ->
layers.quantization -> layers.linear -> layers.dp_attention -> distributed.device_communicators.custom_all_reduce_v2
-> sglang.kernels.ops.communication.all_reduce``, which imports ``tvm_ffi`` (SGLang's GPU kernel FFI); on the way
pip also took torchvision, which replaced the CPU torch 2.13.0 with torch 2.14.1 (6 GB in all). Not a light tier.

So this renders the real definitions, copied from that file: each metric's name, help text, type and
``multiprocess_mode`` (``mostrecent`` for the gauges, the default ``all`` for ``sglang:num_retracted_reqs``: it gets
a ``pid`` label), the label set ``SchedulerMetricsCollector.init_new`` builds (``model_name``, ``engine_type``,
``tp_rank``, ``pp_rank``, ``moe_ep_rank``, ``priority=""`` under priority scheduling, ``dp_rank`` with data
parallelism), ``_log_gauge_queue_count``'s per-priority breakdown beside the total, and ``increment_retracted_reqs``'s
counter. Each data-parallel scheduler is its own process writing to ``PROMETHEUS_MULTIPROC_DIR``, and the text comes
from ``prometheus_client``'s ``MultiProcessCollector``, as SGLang's ``add_prometheus_middleware`` serves it.
``python tests/service/sglang_metrics.py > tests/service/sglang_metrics_dp2_priority.txt`` writes the fixture.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

# One scheduler process: SchedulerMetricsCollector.__init__'s definitions of the metrics the controller reads (and
# the retraction gauge it must not read), then log_stats' and increment_retracted_reqs' writes.
SCHEDULER = r'''
import json, sys
from prometheus_client import Counter, Gauge
labels, v = json.loads(sys.argv[1]), json.loads(sys.argv[2])
def gauge(name, doc, **kw):
    return Gauge(name=name, documentation=doc, labelnames=labels.keys(), **kw)
running = gauge("sglang:num_running_reqs", "The number of running requests.", multiprocess_mode="mostrecent")
queue = gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", multiprocess_mode="mostrecent")
token_usage = gauge("sglang:token_usage", "The token usage.", multiprocess_mode="mostrecent")
full_usage = gauge("sglang:full_token_usage", "The token usage for full attention layers.",
                   multiprocess_mode="mostrecent")
retracted = gauge("sglang:num_retracted_reqs", "The number of retracted requests.")
retracted_total = Counter(name="sglang:num_retracted_requests_total", documentation="Total number of retracted requests.",
                          labelnames=labels.keys())
def queue_count(g, total, by_priority):  # _log_gauge_queue_count
    g.labels(**labels).set(total)
    for p, n in by_priority.items():
        g.labels(**{**labels, "priority": str(p)}).set(n)
queue_count(running, v["running"], v["running_by_priority"])
queue_count(queue, v["queue"], v["queue_by_priority"])
token_usage.labels(**labels).set(v["token_usage"])
full_usage.labels(**labels).set(v["token_usage"])
retracted.labels(**labels).set(v["retracted_since_last_log"])
retracted_total.labels(**labels).inc(v["retracted_total"])
'''
RENDER = r'''
from prometheus_client import CollectorRegistry, generate_latest, multiprocess
registry = CollectorRegistry()
multiprocess.MultiProcessCollector(registry)
print(generate_latest(registry).decode(), end="")
'''
# Two data-parallel schedulers with priority scheduling on. What the controller must read from them:
EXPECTED = {"running": 4.0, "waiting": 7.0, "kv_usage": 0.7, "preemptions": 8.0}
SCHEDULERS = [
    dict(running=3, running_by_priority={0: 2, 1: 1}, queue=5, queue_by_priority={0: 4, 1: 1}, token_usage=0.7,
         retracted_since_last_log=2, retracted_total=7),
    dict(running=1, running_by_priority={0: 1}, queue=2, queue_by_priority={0: 2}, token_usage=0.4,
         retracted_since_last_log=0, retracted_total=1),
]


def render(python: str = sys.executable) -> str:
    """The ``/metrics`` text of the two schedulers above (three short subprocesses)."""
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": d}
        for dp, v in enumerate(SCHEDULERS):
            labels = {"model_name": "tiny", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
                      "moe_ep_rank": "0", "priority": "", "dp_rank": str(dp)}
            subprocess.run([python, "-c", SCHEDULER, json.dumps(labels), json.dumps(v)], env=env, check=True,
                           timeout=60)
        return subprocess.run([python, "-c", RENDER], env=env, check=True, capture_output=True, text=True,
                              timeout=60).stdout


if __name__ == "__main__":
    print("# SGLang 0.5.23 scheduler metrics (sglang/srt/observability/metrics_collector.py), rendered by")
    print("# tests/service/sglang_metrics.py: 2 dp ranks, priority scheduling on")
    print(render(), end="")
