"""``Trajectory``: one rollout, trainer-neutral and JSON-serializable.

The token record is exact: ``prompt_ids`` is the rendered prompt; ``response_ids`` is everything after it, model
tokens (``response_mask == 1``, exactly the ids the backend sampled, with their logprobs) interleaved with env tokens
(``response_mask == 0``, the chat template's rendering of the env's replies, logprob 0.0). Nothing is re-tokenized.

``response_versions`` (one per ``response_ids`` entry, AReaL's convention): the weight version that sampled each
model token, ``-1`` on env tokens; reduce it to a trainer's form with :mod:`envhub.rollout.versions`. Empty when
nothing recorded versions (a trajectory from before they existed, or built by hand).

A failed rollout is still a well-formed trajectory: ``finish_reason == "error"`` and ``error`` says why.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

FINISH_REASONS = ("done", "length", "max_turns", "timeout", "cancelled", "error")


@dataclass
class Trajectory:
    env_id: str
    task_id: str
    prompt_ids: list[int] = field(default_factory=list)
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    response_logprobs: list[float] = field(default_factory=list)
    response_versions: list[int] = field(default_factory=list)
    reward: float = 0.0
    step_rewards: list[float] = field(default_factory=list)
    passed: bool = False
    num_turns: int = 0
    finish_reason: str = "done"
    truncated: bool = False
    error: str | None = None
    policy_version: int | str | None = None
    messages: list[dict[str, Any]] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)  # init_s, run_s, eval_s, gen_s, env_s
    details: dict[str, Any] = field(default_factory=dict)  # the verifier's Score.details, job ids, sample index

    def __post_init__(self):
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")

    @property
    def action_ranges(self) -> list[tuple[int, int]]:
        """Half-open ``[start, end)`` spans of model tokens within ``response_ids`` (derived from the mask)."""
        ranges, start = [], None
        for i, m in enumerate(self.response_mask):
            if m and start is None:
                start = i
            elif not m and start is not None:
                ranges.append((start, i))
                start = None
        if start is not None:
            ranges.append((start, len(self.response_mask)))
        return ranges

    @property
    def ok(self) -> bool:
        return self.finish_reason not in ("error", "cancelled", "timeout")

    @property
    def loss_mask(self) -> list[int]:
        """What a trainer may learn from: ``response_mask`` for a rollout that ended on its own, all zeros for a
        failed one (``error``, ``timeout``, ``cancelled``). A failed rollout keeps its exact token record (for
        inspection and the fidelity check) but carries no trainable token: its earlier turns were sampled in an
        episode whose outcome is unknown, and reward 0 on them would teach the policy that the env's crash was its
        fault. ``envhub.training.to_tensors`` and both trainer adapters train on this, never on ``response_mask``."""
        return list(self.response_mask) if self.ok else [0] * len(self.response_mask)

    @property
    def trainable_ranges(self) -> list[tuple[int, int]]:
        """:attr:`action_ranges` of a rollout that ended on its own; ``[]`` for a failed one (see :attr:`loss_mask`)."""
        return self.action_ranges if self.ok else []

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        names = {f.name for f in fields(cls)}
        traj = cls(**{k: v for k, v in d.items() if k in names})
        if "trailing_messages" in d:  # a rollout service reply (ProRL's trimmed, token-carrying messages)
            from envhub.rollout.prorl import text_log

            traj.messages = text_log(d.get("messages") or [], d["trailing_messages"])
        return traj

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False)

    # Rows for `datasets`: nested, free-form parts travel as JSON text so Arrow keeps them exactly.
    _JSON_COLUMNS = ("messages", "metrics", "details")

    def to_row(self) -> dict[str, Any]:
        row = self.to_dict()
        for k in self._JSON_COLUMNS:
            row[k] = json.dumps(row[k], ensure_ascii=False, sort_keys=True)
        row["policy_version"] = None if self.policy_version is None else str(self.policy_version)
        row["error"] = self.error or ""
        return row

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Trajectory:
        d = dict(row)
        for k in cls._JSON_COLUMNS:
            if isinstance(d.get(k), str):
                d[k] = json.loads(d[k])
        d["error"] = d.get("error") or None
        return cls.from_dict(d)

    @classmethod
    def failed(cls, env_id: str, task_id: str, reason: str, error: str, **kw: Any) -> Trajectory:
        """A marked failure (error, timeout, cancelled) that still has every field."""
        return cls(env_id=env_id, task_id=task_id, finish_reason=reason, error=error, **kw)
