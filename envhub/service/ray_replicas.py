"""Rollout-service replicas on a Ray cluster: one per node, each owning that node's sandboxes, found and balanced
by the client through Ray itself (``pip install envhub[ray]``).

::

    import ray
    from envhub.service.ray_replicas import RayRolloutClient, start_replicas

    ray.init(address="auto")                                   # the trainer's own cluster (OpenRLHF, veRL, NeMo Gym)
    start_replicas(tokenizer="Qwen/Qwen3-8B", backends=["http://10.0.0.7:8000"])   # one per alive node
    client = RayRolloutClient()
    traj = await client.process({"env_id": "swe-gym", "task_id": "..."}, {"temperature": 1.0})

Why Ray actors and not HTTP servers behind a load balancer (recorded in ``docs/decisions.md``): the trainers that
would use this already run a Ray cluster; an actor per node is placed with ``NodeAffinitySchedulingStrategy``, is
found by name (no address list to keep), and its death is an exception at the caller (``RayActorError``), which
is exactly the signal a retry needs. Each replica is a whole :class:`~envhub.service.service.RolloutService`
(INIT/RUN/EVAL pools, sandbox limit, result cache) in the actor's process.

What the client guarantees:

* **Balance by load.** Each job goes to the replica with the fewest jobs in flight from this client.
* **Replicas join while running.** The replica list is re-read from Ray every ``refresh_s`` and after any failure:
  a replica started later takes new work.
* **A dead replica or node loses nothing.** A call that fails because its replica died (the node went away, the
  process was killed) is sent again, with the same job id, to another live replica. Jobs are answered exactly once:
  the dead replica never answered them, and a replica that is alive deduplicates a retried id itself (it joins the
  job in flight or replays its stored answer, see :class:`~envhub.service.service.RolloutService`).

Ray is imported only inside these functions: ``import envhub.service`` never loads it.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

NAMESPACE = "envhub"
PREFIX = "envhub-replica-"


class _Replica:
    """The actor: a :class:`RolloutService` living in a Ray worker process on one node."""

    def __init__(self, tokenizer: str, backends: list[Any], plugins: list[str], service_kw: dict[str, Any]):
        import importlib

        import ray

        from envhub.testing.models import load_tokenizer, resolve_model
        from envhub.plugins import default_hub
        from envhub.service.service import RolloutService

        for module in plugins:  # extra envs (as `envhub serve --plugin MODULE`)
            mod = importlib.import_module(module)
            if hasattr(mod, "register_all"):
                mod.register_all()
            else:
                default_hub().load_module(mod, module)
        self.node_id = ray.get_runtime_context().get_node_id()
        self.service = RolloutService(load_tokenizer(resolve_model(tokenizer)), backends=list(backends), **service_kw)

    async def process(self, instance: dict, sampling_params: dict, job_id: str) -> bytes:
        from envhub.service.schemas import ProcessRequest

        await self.service.start()  # idempotent
        return await self.service.process(ProcessRequest(instance=instance, sampling_params=sampling_params,
                                                         job_id=job_id))

    async def cancel(self, job_id: str) -> bool:
        return bool(self.service.pipeline.cancel(job_id))

    async def status(self) -> dict:
        st = self.service.pipeline.status()
        st["node_id"] = self.node_id
        return st

    async def stop(self) -> int:
        return await self.service.stop()


def start_replicas(*, tokenizer: str = "tiny", backends: list[Any] | tuple = ("golden",), plugins: tuple = (),
                   nodes: list[str] | None = None, **service_kw: Any) -> list[str]:
    """Start one replica on every alive node (or on ``nodes``, Ray node ids) that has none yet; returns the names
    of all replicas. Each is pinned to its node (its sandboxes are that node's) and named ``envhub-replica-<node>``
    in the ``envhub`` namespace. ``service_kw`` go to :class:`RolloutService` (pool sizes, ``max_sandboxes``...)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    actor_cls = ray.remote(_Replica)
    targets = nodes or [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    names, actors = [], []
    for node_id in targets:
        name = PREFIX + node_id[:16]
        # detached: a replica outlives the handle made here (the client finds it by name); stop_replicas() ends it
        actor = actor_cls.options(name=name, namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
                                  num_cpus=0, max_restarts=0,
                          max_concurrency=100_000,  # an async actor: one coroutine per job in flight
                          scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(
            tokenizer, list(backends), list(plugins), service_kw)
        names.append(name)
        actors.append(actor)
    ray.get([a.__ray_ready__.remote() for a in actors])  # constructed (tokenizer loaded): discoverable and serving
    return sorted(set(names) | set(replica_names()))


def stop_replicas() -> int:
    """Stop every replica (their jobs are cancelled and their sandboxes stopped first). Returns how many."""
    import ray

    names = replica_names()
    for name in names:
        try:
            actor = ray.get_actor(name, namespace=NAMESPACE)
            ray.get(actor.stop.remote(), timeout=120)
            ray.kill(actor)
        except (ValueError, ray.exceptions.RayError):  # already gone with its node
            continue
    return len(names)


def replica_names() -> list[str]:
    """Names of the replicas Ray knows (alive or not yet reaped) in the ``envhub`` namespace."""
    import ray

    return sorted(a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
                  if a.get("namespace") == NAMESPACE and a["name"].startswith(PREFIX))


@dataclass(eq=False)
class _Handle:
    name: str
    actor: Any
    in_flight: int = 0
    sent: int = 0


class RayRolloutClient:
    """The trainer's side: ``process`` / ``cancel`` / ``status`` over every replica (see the module docstring).

    Args:
        refresh_s: how often the replica list is re-read from Ray.
        retries: how many dead replicas one job may meet before it fails.
    """

    def __init__(self, *, refresh_s: float = 2.0, retries: int = 3):
        self.refresh_s, self.retries = refresh_s, retries
        self._replicas: dict[str, _Handle] = {}
        self._dead: set[str] = set()
        self._refreshed = 0.0
        self.counts = {"sent": 0, "retried": 0, "dead_replicas": 0}

    def refresh(self) -> list[str]:
        """Re-read the replica list (new ones join; ones seen dead stay out). Returns the live names."""
        import ray

        for name in replica_names():
            if name not in self._replicas and name not in self._dead:
                self._replicas[name] = _Handle(name, ray.get_actor(name, namespace=NAMESPACE))
        self._refreshed = time.monotonic()
        return sorted(self._replicas)

    def _pick(self) -> _Handle:
        if not self._replicas or time.monotonic() - self._refreshed > self.refresh_s:
            self.refresh()
        if not self._replicas:
            raise RuntimeError("no envhub replica is alive in this Ray cluster (start_replicas() starts them)")
        return min(self._replicas.values(), key=lambda h: (h.in_flight, h.sent))

    def _bury(self, handle: _Handle) -> None:
        if self._replicas.pop(handle.name, None) is not None:
            self._dead.add(handle.name)
            self.counts["dead_replicas"] += 1

    async def process(self, instance: dict[str, Any], sampling_params: dict[str, Any] | None = None, *,
                      job_id: str | None = None) -> dict[str, Any]:
        """One rollout on the least-loaded replica; moved to another with the same job id if that one dies."""
        from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

        job_id = job_id or uuid.uuid4().hex
        failures = 0
        while True:
            handle = self._pick()
            handle.in_flight += 1
            handle.sent += 1
            self.counts["sent"] += 1
            try:
                body = await handle.actor.process.remote(instance, dict(sampling_params or {}), job_id)
                return json.loads(body)
            except (ActorDiedError, ActorUnavailableError, RayActorError) as e:
                self._bury(handle)
                failures += 1
                self.counts["retried"] += 1
                if failures > self.retries:
                    raise RuntimeError(f"job {job_id}: {failures} replicas died under it; last: {e}") from None
                self.refresh()
                await asyncio.sleep(0.05 * failures)
            finally:
                handle.in_flight -= 1

    async def status(self) -> list[dict[str, Any]]:
        """Each live replica's ``/status``-like dict (with its ``node_id``)."""
        self.refresh()
        out = []
        for h in list(self._replicas.values()):
            try:
                out.append({"replica": h.name, **await h.actor.status.remote()})
            except Exception:  # a replica that died since the refresh: not part of the answer, marked dead
                self._bury(h)
        return out

    async def cancel(self, job_id: str) -> bool:
        """Cancel ``job_id`` wherever it runs."""
        self.refresh()
        hits = await asyncio.gather(*(h.actor.cancel.remote(job_id) for h in self._replicas.values()),
                                    return_exceptions=True)
        return any(h is True for h in hits)
