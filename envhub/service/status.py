"""``ServiceStatus``: what :class:`~envhub.service.service.RolloutService` answers about itself -- ``/status`` (ProRL
Agent's keys, then envhub's), the throughput snapshot and its live gauges -- and what the trainer reports to it (step
boundaries, a gate report's consumed and discarded samples). One concern of the service, kept apart so that the
request path (:mod:`envhub.service.service`) reads on its own; the figures themselves are
:class:`~envhub.rollout.throughput.Throughput`'s."""
from __future__ import annotations

import time
from typing import Any

from envhub.service.errors import log
from envhub.service.schemas import ServiceError


class ServiceStatus:
    """Mixed into :class:`~envhub.service.service.RolloutService`, whose attributes it reads: ``pipeline``, ``pool``,
    ``gate``, ``lifecycle``, ``controller``, ``metrics``, ``counts``, ``timeout_s``, ``started_at``."""

    pipeline: Any
    pool: Any
    gate: Any
    controller: Any
    metrics: Any
    counts: dict[str, int]
    timeout_s: float | None
    started_at: float
    _inflight: dict[str, Any]

    def status(self) -> dict[str, Any]:
        p = self.pipeline.status()
        st = p["stages"]
        queued = sum(s["queued"] for s in st.values())
        active = sum(s["in_flight"] for s in st.values())
        pool = self.pool.status()
        return {
            "status": "running" if self.running else "stopped",
            # ProRL Agent's keys, so its dashboards and scripts keep working
            "init_queue": st["init"]["queued"], "run_queue": st["run"]["queued"], "eval_queue": st["eval"]["queued"],
            "active_init": st["init"]["in_flight"], "active_run": st["run"]["in_flight"],
            "active_eval": st["eval"]["in_flight"], "total": queued + active, "pending_jobs": len(self._inflight),
            "stages": st,
            "jobs": {**p["jobs"], **self.counts},
            "staleness": self.gate.status(),
            "backends": pool["backends"],
            "sessions": pool["sessions"],
            "sandboxes": p["sandboxes"],
            "timeout_s": self.timeout_s,
            "weights": self.lifecycle.status(),
            "concurrency": p["concurrency"],
            **({"controller": self.controller.status()} if self.controller is not None else {}),
            "uptime_s": round(time.time() - self.started_at, 3),
            **self.throughput(),
        }

    def throughput(self) -> dict[str, Any]:
        """``{"throughput": snapshot, "bound": verdict}`` (empty with metrics off): see
        :mod:`envhub.rollout.throughput`."""
        if self.metrics is None:
            return {}
        snap = self.metrics.snapshot()
        return {"bound": snap.pop("bound"), "throughput": snap}

    def _gauges(self) -> dict[str, Any]:
        """Live figures the throughput snapshot reads: queues, sandboxes, backends' load."""
        p = self.pipeline.status()
        backends: dict[str, dict[str, Any]] = {}
        for b in self.pool.status()["backends"]:
            backends[b["name"]] = {"in_flight": b["in_flight"]}
            load = getattr(self.pool.backends.get(b["name"]), "load", None)  # a backend that knows its own queue
            if callable(load):
                try:
                    backends[b["name"]]["waiting"] = int(load().get("waiting", 0))
                except Exception:  # a status read must not break /status
                    log.debug("backend %s: load() raised", b["name"], exc_info=True)
        sb = p["sandboxes"]
        return {"queue_depth": {s: v["queued"] for s, v in p["stages"].items()},
                "sandboxes": {"live": sb["live"], "limit": sb["limit"], "waiting": sb["waiting"]},
                "backends": backends}

    def trainer_step(self, phase: str, samples: int | None = None, at: float | None = None) -> dict[str, Any]:
        """The trainer's step boundary (``POST /trainer/step``): idle ratios and consumption come from these
        (``at``: when it happened, Unix seconds; see :meth:`Throughput.trainer_step`)."""
        if self.metrics is None:
            raise ServiceError(409, "metrics are off on this server (RolloutService(metrics=False))")
        try:
            return self.metrics.trainer_step(phase, samples, at)
        except ValueError as e:
            raise ServiceError(422, str(e)) from None

    def gate_reported(self, body: dict[str, Any] | None) -> None:
        """A trainer's gate report (``POST /staleness/report``) also feeds consumption and discards."""
        if self.metrics is None or not body:
            return
        if isinstance(body.get("consumed"), int) and body["consumed"] > 0:
            self.metrics.consumed(body["consumed"])
        if isinstance(body.get("discarded"), int) and body["discarded"] > 0:
            self.metrics.discarded(body["discarded"])
