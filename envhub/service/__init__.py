"""Rollout-as-a-service: the ProRL Agent HTTP API over envhub envs (the trainer's side, the client and the DAPO
collector, is :mod:`envhub.training`).

Server side (``envhub serve``)::

    from envhub.service import RolloutService, ServerThread
    service = RolloutService(tokenizer, backends=["http://10.0.0.5:8000"], init_workers=8, run_workers=32)
    with ServerThread(service, port=8006) as srv:      # or envhub.service.server.serve(service, port=8006)
        ...

Trainer side (:mod:`envhub.training.client`)::

    from envhub.training.client import RolloutClient
    async with RolloutClient(["http://rollout-1:8006", "http://rollout-2:8006"]) as client:
        traj = await client.process({"env_id": "countdown", "task_id": "countdown-0003"}, {"temperature": 1.0})

Modules: ``schemas`` (request/reply shapes), ``jobs`` (job, phase timer, replies), ``pipeline`` (INIT/RUN/EVAL pools),
``sandboxes`` (prewarmed pools, per-job sandbox factory), ``golden`` (golden players as a backend), ``service``
(admission, idempotent job ids, backends, status), ``app`` (FastAPI routes), ``server`` (uvicorn),
``ray_replicas`` (replicas as Ray actors). Nothing here is imported by ``import envhub``; nothing here imports
:mod:`envhub.training`.
"""
from __future__ import annotations

from typing import Any

__all__ = ["RolloutService", "ServerThread", "create_app"]

_LAZY = {
    "RolloutService": "envhub.service.service",
    "ServerThread": "envhub.service.server",
    "create_app": "envhub.service.app",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'envhub.service' has no attribute {name!r}")
