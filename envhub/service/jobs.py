"""Jobs of the rollout service: one ``/process`` request = one :class:`Job`, timed by a :class:`PhaseTimer`.

A job walks through three stages, each with its own queue and worker pool (``envhub.service.pipeline``)::

    queued ─▶ INIT ─▶ queued ─▶ RUN ─▶ queued ─▶ EVAL ─▶ done
                 (sandbox + reset)   (agent loop)     (verifier)

Only time *inside* a stage counts towards the job's timeout (as in ProRL Agent's ``PausableTimer``): a job that waits
in a queue behind ten thousand others is not penalized for the server being busy. The timer reports every phase in
ProRL's ``timing`` shape (``init_time``, ``run_time``, ``eval_time``, ``others_time`` = time spent queued,
``counted_elapsed``, ``timeout_triggered``).

:func:`result_dict` turns a finished job into the ``/process`` reply: the :class:`~envhub.rollout.trajectory.Trajectory`
fields plus the ProRL Agent fields its clients read (``instance_id``, ``trajectory_id``, ``resolved``,
``critical_error``, ``timing``, ``filter``, ``tools``, and from :mod:`envhub.rollout.prorl` the per-message
``token_ids``/``input_ids``/``logprobs``, ``score``, ``end_properly``, ``finish``, ``success``).
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Callable

from envhub.service.errors import scrub
from envhub.rollout.prorl import encode_with_shared_contexts, prorl_fields

STAGES = ("init", "run", "eval")


class State(str, Enum):
    """Where a job is. ``QUEUED_*`` means waiting for a worker of that stage."""

    QUEUED_INIT = "queued_init"
    INIT = "init"
    QUEUED_RUN = "queued_run"
    RUN = "run"
    QUEUED_EVAL = "queued_eval"
    EVAL = "eval"
    FINISHING = "finishing"  # resources being released
    DONE = "done"


class PhaseTimer:
    """Counts the time a job spends inside stages; queue time is kept apart and never counts towards the timeout,
    and neither does time the policy's weights spent paused for an update (``paused_s``, the lifecycle's
    :meth:`~envhub.backends.lifecycle.WeightLifecycle.paused_s`): a weight update must not time a rollout out.

    Args:
        timeout: seconds of in-stage time allowed (``None``: no limit).
        paused_s: ``since -> seconds paused since then``; that time is moved from the stage to ``paused_time``.
    """

    def __init__(self, timeout: float | None, paused_s: Callable[[float], float] | None = None):
        self.timeout = timeout
        self.created = time.monotonic()
        self.phase: str | None = None  # the stage being timed now, or None (queued / between stages)
        self._since = self.created
        self._paused_s = paused_s
        self.times = {"init": 0.0, "run": 0.0, "eval": 0.0, "others": 0.0, "paused": 0.0}
        self.timeout_triggered = False

    def enter(self, stage: str) -> None:
        self._close()
        self.phase = stage

    def exit(self) -> None:
        self._close()
        self.phase = None

    def _split(self, now: float) -> tuple[float, float]:
        """(unpaused, paused) seconds since the last phase change."""
        paused = self._paused_s(self._since) if self._paused_s and self.phase else 0.0
        return max(0.0, now - self._since - paused), paused

    def _close(self) -> None:
        now = time.monotonic()
        counted, paused = self._split(now)
        self.times[self.phase or "others"] += counted
        self.times["paused"] += paused
        self._since = now

    def counted(self) -> float:
        """Seconds spent inside stages so far (the stage running now included), paused time excluded."""
        running = self._split(time.monotonic())[0] if self.phase else 0.0
        return self.times["init"] + self.times["run"] + self.times["eval"] + running

    def remaining(self) -> float | None:
        """In-stage seconds left before the timeout (``None``: no timeout)."""
        if self.timeout is None:
            return None
        return max(0.0, self.timeout - self.counted())

    def timing(self) -> dict[str, Any]:
        """ProRL Agent's ``timing`` dict (every phase, the one running now included)."""
        times = dict(self.times)
        counted, paused = self._split(time.monotonic())
        times[self.phase or "others"] += counted
        times["paused"] += paused
        return {
            "init_time": times["init"], "run_time": times["run"], "eval_time": times["eval"],
            "others_time": times["others"], "counted_elapsed": times["init"] + times["run"] + times["eval"],
            "timeout_triggered": self.timeout_triggered,
        }


@dataclass(eq=False)
class Job:
    """One rollout request inside the server. The pipeline owns it from submission until its future resolves."""

    id: str
    spec: Any  # EnvSpec
    task: dict[str, Any]
    instance: dict[str, Any]  # the request's instance, echoed ids come from it
    episode: Any  # envhub.rollout.executor.Episode
    timer: PhaseTimer
    future: asyncio.Future
    fingerprint: str = ""  # hash of the request: a reused job id with another request is refused
    state: State = State.QUEUED_INIT
    current: asyncio.Task | None = None  # the stage task running now (cancel() cancels it)
    discarded: bool = False  # cancelled or stopped: workers skip it, its stage is being torn down
    slot: bool = False  # holds one of the pipeline's concurrency slots (Pipeline.set_concurrency) until answered
    failed_stage: str | None = None  # "init" | "run" | "eval": where an error happened
    exception: BaseException | None = None  # what caused the error, when the pipeline caught it (for the log)
    sandboxes: Any = None  # envhub.service.sandboxes.JobSandboxes
    notes: dict[str, Any] = field(default_factory=dict)  # ignored request keys etc., reported in details
    body: bytes | None = None  # the encoded reply, once finished

    @property
    def stage(self) -> str | None:
        """The stage running now (``None`` when queued or finishing)."""
        return self.state.value if self.state in (State.INIT, State.RUN, State.EVAL) else None


def critical_error(job: Job) -> str | None:
    """ProRL's ``critical_error``: ``None`` for a rollout a trainer may use, else why it may not
    (``"init"``/``"run"``/``"eval"`` for an error in that stage, ``"timeout"``, ``"cancelled"``)."""
    reason = job.episode.traj.finish_reason
    if reason == "error":
        return job.failed_stage or "run"
    if reason in ("timeout", "cancelled"):
        return reason
    return None


def result_dict(job: Job) -> dict[str, Any]:
    """The ``/process`` reply for a finished job (see the module docstring)."""
    ep = job.episode
    traj = ep.trajectory()
    traj.details["job_id"] = job.id
    if job.notes:
        traj.details.update(job.notes)
    timing = job.timer.timing()
    traj.metrics["queue_s"] = timing["others_time"]
    if job.timer.times["paused"]:  # ProRL's timing keys stay as ProRL's; time paused for weight updates goes here
        traj.metrics["paused_s"] = job.timer.times["paused"]
    # a shallow dict, not traj.to_dict(): asdict deep-copies every token id list (over a millisecond per job), and
    # this dict is encoded at once and never mutated below the top level
    out = {f.name: getattr(traj, f.name) for f in fields(traj)}
    err = critical_error(job)
    if out.get("error"):
        out["error"] = scrub(out["error"])  # no host paths to clients (see envhub.service.errors)
    codec = getattr(ep, "codec", None)  # holds the env's tools as the prompt rendered them
    out.update(
        job_id=job.id,
        instance_id=job.instance.get("instance_id", traj.task_id),
        trajectory_id=job.instance.get("trajectory_id"),
        resolved=bool(traj.passed),
        success=traj.finish_reason == "done",
        critical_error=err,
        filter=err is not None,
        timing=timing,
        tools=list(getattr(codec, "tools", None) or []),
    )
    # ProRL's per-message tokens and outcome flags (envhub.rollout.prorl); ``messages`` becomes ProRL's shape
    out.update(prorl_fields(traj, getattr(ep, "turns", [])))
    return out


def encode_result(result: dict[str, Any]) -> bytes:
    """JSON bytes of a reply. ``allow_nan`` stays on: a ``-inf`` logprob is legal data (vLLM sends it). The
    per-message ``input_ids`` are sliced from one encoding of the context (``encode_with_shared_contexts``)."""
    return encode_with_shared_contexts(result, _dumps).encode()


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), default=str)


class ResultCache:
    """Recently finished results by job id, as encoded bytes, so a retried ``/process`` with the same job id gets
    the first answer instead of running the job twice. Bounded by count, total bytes (long SWE trajectories weigh
    megabytes) and age; the oldest go first."""

    def __init__(self, size: int = 10_000, ttl_s: float = 900.0, max_bytes: int = 512 << 20):
        self.size, self.ttl_s, self.max_bytes = size, ttl_s, max_bytes
        self._items: OrderedDict[str, tuple[float, str, bytes]] = OrderedDict()
        self.bytes = 0

    def put(self, job_id: str, fingerprint: str, body: bytes) -> None:
        if self.size <= 0:
            return
        old = self._items.pop(job_id, None)
        if old is not None:
            self.bytes -= len(old[2])
        self._items[job_id] = (time.monotonic(), fingerprint, body)
        self.bytes += len(body)
        self._trim()

    def get(self, job_id: str) -> tuple[str, bytes] | None:
        self._trim()
        item = self._items.get(job_id)
        return None if item is None else (item[1], item[2])

    def _trim(self) -> None:
        now = time.monotonic()
        while self._items:
            key, (t, _, body) = next(iter(self._items.items()))
            if len(self._items) > self.size or self.bytes > self.max_bytes or now - t > self.ttl_s:
                del self._items[key]
                self.bytes -= len(body)
            else:
                break

    def __len__(self) -> int:
        return len(self._items)
