"""The concurrency controller's wiring: gather the signals, ask :class:`~envhub.service.controller.AIMD`, apply its
decision to the pipeline's cap, keep and publish the log. The decisions themselves are in
:mod:`envhub.service.controller`; ``docs/metrics.md`` ("The controller") says what each figure means.

Signals, per tick:

* **the LLM servers' queues and KV cache**: a backend with a ``load()`` method (an in-process backend that knows
  its own queue) gives ``{waiting, running?, kv_usage?, preemptions?}``; a backend with an ``address`` (vLLM,
  SGLang) is scraped at ``GET address/metrics`` (its Prometheus text, read by ``prometheus_client``'s parser:
  ``vllm:num_requests_waiting``, ``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``,
  ``vllm:num_preemptions``). Where a server does not say what it runs, the calls this service has in flight on it
  (the pool's count) minus its queue stand in. A scrape that fails or times out leaves that server out of the tick
  (counted in ``scrape_errors``); it never stops the loop;
* **the bounds**: the node's live-sandbox limit and the staleness gate's largest admission;
* **acceptance**, from the service's throughput figures (for the oversampling factor).

The loop runs on the service's event loop, one tick every ``interval_s``. Every decision that changes something,
and every change of reason while holding, goes into a bounded log (``/status`` ``controller.log``), the
``envhub.service.controller`` logger (INFO) and the ``envhub_controller_*`` metrics.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import replace
from typing import Any, Iterator

from envhub.service.controller import AIMD, Decision, Knobs, Signals, gate_ceiling, parse_server_metrics

log = logging.getLogger("envhub.service.controller")
LOG_SIZE = 256
SCRAPE_TIMEOUT_S = 2.0


class ConcurrencyController:
    """Runs :class:`AIMD` against a :class:`~envhub.service.service.RolloutService` (see the module docstring).

    ``service.start()`` starts it when the service was built with ``controller=``; :meth:`tick` runs one step by
    hand (tests)."""

    def __init__(self, service: Any, knobs: Knobs | None = None, *, log_size: int = LOG_SIZE):
        self.service = service
        self._auto_max = (knobs or Knobs()).max is None
        self.knobs = self._with_max(knobs or Knobs())
        self.aimd = AIMD(self.knobs, self._ceiling())
        self.log: deque[dict[str, Any]] = deque(maxlen=log_size)
        self.counts: dict[tuple[str, str], int] = {}
        self.ticks = 0
        self.scrape_errors = 0
        self.last: Signals | None = None
        self.peak_limit = self.aimd.limit
        self._preemptions: dict[str, float] = {}  # server -> its preemption counter at the last tick
        self._last_hold = ""
        self._task: asyncio.Task | None = None
        self._client: Any = None

    def _with_max(self, knobs: Knobs) -> Knobs:
        """Default ``max``: every worker of the three pools busy; more slots would only wait in their queues."""
        if not self._auto_max:
            return knobs
        return replace(knobs, max=max(knobs.min, sum(self.service.pipeline.sizes.values())))

    @property
    def limit(self) -> int:
        return self.aimd.limit

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Apply the limit and tick every ``interval_s`` on the running loop (idempotent). The pools may have been
        resized (``POST /start {run_workers}``): a default ``max`` follows them."""
        self.knobs = self.aimd.knobs = self._with_max(self.knobs)
        self.aimd.limit = min(self.aimd.limit, self.knobs.max or self.aimd.limit)
        self.service.pipeline.set_concurrency(self.aimd.limit)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="envhub-controller")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.knobs.interval_s)
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bad tick (a server answering garbage) must not end the control loop
                log.exception("controller: a tick failed; the limit stays %d", self.aimd.limit)

    # ---- one tick -----------------------------------------------------------------------------------------------
    async def tick(self) -> Decision:
        s = await self.signals()
        self.last = s
        self.ticks += 1
        d = self.aimd.decide(s)
        self.service.pipeline.set_concurrency(d.new)
        self.peak_limit = max(self.peak_limit, d.new)
        self._record(d)
        over = self.aimd.oversample(s.acceptance)
        if over is not None:
            self._record(over)
        return d

    def _ceiling(self) -> int | None:
        bounds = [b for b in (self.service.pipeline.sandboxes.max_live, gate_ceiling(self.service.gate.status()))
                  if b is not None]
        return min(bounds) if bounds else None

    async def signals(self) -> Signals:
        """This tick's :class:`Signals` (see the module docstring)."""
        svc = self.service
        pool = svc.pool.status()["backends"]
        reports = await asyncio.gather(*(self._server_figures(b["name"]) for b in pool))
        waiting = running = preempted = 0
        kv: float | None = None
        queue_known = False
        for b, rep in zip(pool, reports):
            if rep is None:
                continue
            if "waiting" in rep:
                queue_known = True
                w = int(rep["waiting"])
                waiting += w
                running += int(rep["running"]) if "running" in rep else max(0, b["in_flight"] - w)
            if rep.get("kv_usage") is not None:
                kv = max(kv or 0.0, float(rep["kv_usage"]))
            if rep.get("preemptions") is not None:
                before = self._preemptions.get(b["name"])
                self._preemptions[b["name"]] = float(rep["preemptions"])
                if before is not None and rep["preemptions"] > before:
                    preempted += int(rep["preemptions"] - before)
        acceptance = None
        if svc.metrics is not None:
            acceptance = svc.metrics.snapshot().get("acceptance")
        gate = svc.gate.status()
        return Signals(in_flight=svc.pipeline.in_flight, waiting=waiting if queue_known else None,
                       running=running if queue_known else None, kv_usage=kv, preempted=preempted,
                       sandbox_limit=svc.pipeline.sandboxes.max_live, gate_limit=gate_ceiling(gate),
                       acceptance=acceptance)

    async def _server_figures(self, name: str) -> dict[str, Any] | None:
        backend = self.service.pool.backends.get(name)
        load = getattr(backend, "load", None)
        if callable(load):
            try:
                return dict(load())
            except Exception:
                self.scrape_errors += 1
                log.debug("controller: %s.load() raised", name, exc_info=True)
                return None
        address = getattr(backend, "address", None)
        if not isinstance(address, str):
            return None
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S)
        try:
            r = await self._client.get(address.rstrip("/") + "/metrics", headers=getattr(backend, "headers", None))
            r.raise_for_status()
            return parse_server_metrics(r.text)
        except (httpx.HTTPError, ValueError) as e:
            self.scrape_errors += 1
            log.debug("controller: scraping %s/metrics failed: %s", address, e)
            return None

    def _record(self, d: Decision) -> None:
        d.t = time.time()
        key = (d.action, d.signal)
        self.counts[key] = self.counts.get(key, 0) + 1
        if d.action == "hold":  # a hold is logged when its reason's kind changes, not every tick
            kind = d.reason.split(":")[0].split(",")[0]
            if kind == self._last_hold:
                return
            self._last_hold = kind
        else:
            self._last_hold = ""
        self.log.append(d.as_dict())
        log.log(logging.DEBUG if d.action == "hold" else logging.INFO, "controller %s %d -> %d: %s", d.action,
                d.old, d.new, d.reason)

    # ---- reading ------------------------------------------------------------------------------------------------
    def status(self, last: int = 20) -> dict[str, Any]:
        """What ``/status`` shows as ``controller``: the limit, its bounds, the last signals and decisions."""
        s = self.last
        top, which = self.aimd.ceiling(s) if s is not None else (self.aimd.knobs.max, "max")
        return {"kind": "aimd", "limit": self.aimd.limit, "in_flight": self.service.pipeline.in_flight,
                "ceiling": top, "ceiling_by": which, "peak_limit": self.peak_limit,
                "phase": "slow_start" if self.aimd.slow_start else "avoidance",
                "oversampling": self.aimd.oversampling, "ticks": self.ticks, "scrape_errors": self.scrape_errors,
                "signals": None if s is None else {k: v for k, v in s.__dict__.items()},
                "knobs": dict(self.knobs.__dict__),
                "decisions": {f"{a}:{sig}": n for (a, sig), n in sorted(self.counts.items())},
                "log": list(self.log)[-last:]}

    def families(self) -> Iterator[Any]:
        """``envhub_controller_*`` metric families for ``GET /metrics``."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        s = self.last
        top = self.aimd.ceiling(s)[0] if s is not None else self.aimd.knobs.max
        for name, doc, v in (
                ("concurrency", "The controller's limit on rollouts in flight.", self.aimd.limit),
                ("in_flight", "Rollouts holding a slot under the limit.", self.service.pipeline.in_flight),
                ("ceiling", "The lowest bound on the limit: max, the sandbox limit, the staleness gate.", top),
                ("oversampling", "Samples to launch per sample the trainer needs (margin / acceptance).",
                 self.aimd.oversampling),
                ("backend_waiting", "Requests queued inside the LLM servers at the last tick.",
                 None if s is None else s.waiting),
                ("backend_kv_usage", "The fullest LLM server's KV-cache usage at the last tick, 0..1.",
                 None if s is None else s.kv_usage)):
            g = GaugeMetricFamily(f"envhub_controller_{name}", doc)
            g.add_metric([], float("nan") if v is None else float(v))
            yield g
        c = CounterMetricFamily("envhub_controller_decisions", "The controller's decisions, by action and the "
                                "signal that drove them.", labels=["action", "signal"])
        for (action, signal), n in sorted(self.counts.items()):
            c.add_metric([action, signal], n)
        yield c
        c = CounterMetricFamily("envhub_controller_scrape_errors", "Server figures the controller could not read.")
        c.add_metric([], self.scrape_errors)
        yield c
