"""``GateAdmission``: every ``/process`` job's pass through the staleness gate, and the leases it holds until its
result is final.

The gate (:class:`~envhub.rollout.staleness.StalenessGate`) counts admissions; this module ties them to jobs:

* **One lease per job**, acquired before the job enters the pipeline (it waits while the gate has no room, as AReaL's
  rollout controller does) and held until the job's result is final, when the gate's verdict (fresh, withheld,
  dropped, failed) goes into the reply; a job that never finishes gives its lease back.
* **Groups are admitted together.** Jobs naming a group (``instance.group_id`` and ``group_size``, as the DAPO
  collector sends) get their leases at once when the first member arrives -- else a gate with room for half a group
  admits half of it, and a group is only useful whole. Leases no member claims within ``GROUP_CLAIM_S`` (a member
  cancelled before it was sent) are given back.
* **Drop mode** cancels the job of a lease the trainer's report made stale, on the service's loop (the report may
  come from any thread).
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any, Callable

from envhub.rollout.staleness import Lease, StalenessGate

GROUP_CLAIM_S = 5.0  # a group's members are sent together: a lease none claimed by then is given back


class GroupAdmission:
    """The leases of one group (jobs sharing ``instance.group_id``), admitted at once when its first member
    arrives, handed to its members as they arrive."""

    def __init__(self, size: int):
        self.size = size
        self.members: set[str] = set()
        self.task: asyncio.Future | None = None
        self.leases: list[Lease] | None = None  # admitted and not yet claimed
        self.gone = 0  # members cancelled before they got a lease


class GateAdmission:
    """The jobs' leases on one gate (see the module docstring).

    Args:
        gate: the staleness gate.
        cancel_job: ``cancel_job(job_id, reason)`` stops a running job (drop mode's stale leases).
        abandoned: ``abandoned(job_id)`` is true once the job was cancelled while it waited: it takes no slot.
    """

    def __init__(self, gate: StalenessGate, cancel_job: Callable[[str, str], Any], abandoned: Callable[[str], bool]):
        self.gate, self.cancel_job, self.abandoned = gate, cancel_job, abandoned
        self.leases: dict[str, Lease] = {}  # job id -> its admission, until the job's result is final
        self.lease_jobs: dict[int, str] = {}  # lease id -> job id (drop mode cancels the job of a stale lease)
        self.groups: dict[str, GroupAdmission] = {}  # group id -> its admission, until every lease is claimed
        self.groups_closed: OrderedDict[str, None] = OrderedDict()  # groups whose leases are all handed out
        self.loop: asyncio.AbstractEventLoop | None = None

    async def admit(self, job_id: str, instance: dict[str, Any]) -> Lease | None:
        """Wait for the gate to admit this job; ``None`` when it was cancelled while it waited. Raises the gate's
        :class:`~envhub.rollout.staleness.NoCapacity` (waited too long) or ``GateError`` (a bad group)."""
        self.loop = asyncio.get_running_loop()
        gid, size = instance.get("group_id"), instance.get("group_size")
        if isinstance(gid, str) and isinstance(size, int) and not isinstance(size, bool) and size > 1:
            lease = await self._group_lease(job_id, gid, size)
        else:
            lease = await self._one(job_id)
        if lease is not None:
            self.leases[job_id] = lease
            self.lease_jobs[lease.id] = job_id
        return lease

    def release(self, job_id: str) -> None:
        """The job ended without a final result (refused, stopped while admitted): its lease goes back."""
        lease = self.leases.pop(job_id, None)
        if lease is not None:
            self.gate.cancel(lease)
            self.lease_jobs.pop(lease.id, None)

    def finish(self, job_id: str, ok: bool, versions: Any) -> dict[str, Any] | None:
        """The job's result is final: the gate's verdict on it (``None``: the job held no lease)."""
        lease = self.leases.pop(job_id, None)
        if lease is None:
            return None
        self.lease_jobs.pop(lease.id, None)
        return self.gate.finish(lease, ok=ok, versions=versions)

    # ---- inside --------------------------------------------------------------------------------------------------
    def _one(self, job_id: str) -> Any:
        return self.gate.acquire("job", on_stale=self._stale, abandon=lambda: self.abandoned(job_id))

    def _stale(self, lease: Lease) -> None:
        """Drop mode: the trainer's report made this job stale (called on whatever thread reported): cancel it."""
        job_id = self.lease_jobs.get(lease.id)
        if job_id is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(
                self.cancel_job, job_id, f"stale: dispatched at version {lease.dispatch_version}, the trainer "
                f"is at {self.gate.version} (max_staleness {self.gate.max_staleness}, mode drop)")

    async def _group_lease(self, job_id: str, gid: str, size: int) -> Lease | None:
        """One lease of the group's ``size``, admitted together when its first member arrives; leases no member
        claims within ``GROUP_CLAIM_S`` (a member cancelled before it was sent) are given back."""
        g = self.groups.get(gid)
        if g is None and gid in self.groups_closed:  # a member later than its group: admitted on its own
            return await self._one(job_id)
        if g is None:
            g = self.groups[gid] = GroupAdmission(size)
            g.task = asyncio.ensure_future(self.gate.acquire_group(  # given up once no member waits any more
                size, "job", on_stale=self._stale, abandon=lambda: all(self.abandoned(m) for m in g.members)))
            g.task.add_done_callback(lambda t: self._group_admitted(gid, g, t))
        g.members.add(job_id)
        assert g.task is not None
        while not g.task.done() and not self.abandoned(job_id):
            await asyncio.wait([g.task], timeout=0.2)
        if not g.task.done() or g.task.result() is None:
            g.members.discard(job_id)  # cancelled while it waited: its share goes back as soon as there is one
            g.gone += 1
            self._give_back_gone(gid, g)
            return None
        if g.leases is None:
            g.leases = list(g.task.result())
        if not g.leases:  # more members than the group said: admitted on its own
            return await self._one(job_id)
        lease = g.leases.pop()
        if not g.leases:
            self.groups.pop(gid, None)
            self.groups_closed[gid] = None
        return lease

    def _group_admitted(self, gid: str, g: GroupAdmission, task: asyncio.Future) -> None:
        if task.cancelled() or task.exception() is not None or task.result() is None:
            if self.groups.get(gid) is g:
                del self.groups[gid]
            return
        if g.leases is None:
            g.leases = list(task.result())
        self._give_back_gone(gid, g)  # members cancelled while the group waited take no slot
        if self.loop is not None and g.leases:
            self.loop.call_later(GROUP_CLAIM_S, self._unclaimed, gid, g)

    def _give_back_gone(self, gid: str, g: GroupAdmission) -> None:
        if g.leases is None:
            return  # not admitted yet: done when it is
        while g.gone and g.leases:
            g.gone -= 1
            self.gate.cancel(g.leases.pop())
        if not g.leases and self.groups.get(gid) is g:
            del self.groups[gid]
            self.groups_closed[gid] = None

    def _unclaimed(self, gid: str, g: GroupAdmission) -> None:
        self.groups_closed[gid] = None
        while len(self.groups_closed) > 10_000:
            self.groups_closed.popitem(last=False)
        if self.groups.get(gid) is g:
            del self.groups[gid]
        for lease in g.leases or []:
            self.gate.cancel(lease)
        g.leases = []
