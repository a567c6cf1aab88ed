"""What admission reports (:func:`envhub.admission.admit`): one :class:`Check` per check and task, a
:class:`TaskReport` per task, and the :class:`AdmissionReport` that says whether the verifier is fit, which tasks are
quarantined and why, and what re-grading covered. Plain data; ``envhub validate --json`` prints :meth:`to_dict`."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from envhub.grading import Budget, detection

# failing these makes the verifier unfit
VERIFIER_CHECKS = ("noop", "deterministic", "malformed", "hack", "probe", "regrade", "hack-probes-declared",
                   "judge-calibration", "judge-position-bias", "shaping-hack")

@dataclass
class Check:
    name: str
    ok: bool
    message: str = ""
    reward: float | None = None
    status: str = ""  # pass | fail | skip | warn

    def __post_init__(self) -> None:
        self.status = self.status or ("pass" if self.ok else "fail")


@dataclass
class TaskReport:
    task_id: str
    checks: list[Check] = field(default_factory=list)
    regrade_calls: int = 0
    regrade_negatives: int = 0

    @property
    def admitted(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def reasons(self) -> list[str]:
        return [f"{c.name}: {c.message}" for c in self.checks if not c.ok]


@dataclass
class AdmissionReport:
    env_id: str
    version: str
    distribution: str
    tasks: list[TaskReport]
    duration_s: float = 0.0
    checks: list[Check] = field(default_factory=list)  # env-level checks
    strict: bool = False
    budget: Budget | None = None
    judge_cost: dict[str, Any] | None = None  # a judged verifier's calls, cache hits, tokens, seconds

    @property
    def passed(self) -> int:
        """Number of admitted tasks."""
        return sum(t.admitted for t in self.tasks)

    @property
    def quarantined(self) -> dict[str, list[str]]:
        return {t.task_id: t.reasons for t in self.tasks if not t.admitted}

    @property
    def unfit_reasons(self) -> list[str]:
        failed: dict[str, list[tuple[str, str]]] = {}
        for t in self.tasks:
            for c in t.checks:
                if not c.ok and c.name.split(":")[0] in VERIFIER_CHECKS:
                    failed.setdefault(c.name, []).append((t.task_id, c.message))
        reasons = [f"{name} check failed on {len(hits)} task(s) (e.g. {hits[0][0]}: {hits[0][1][:200]})"
                   for name, hits in sorted(failed.items())]
        reasons += [f"{c.name}: {c.message}" for c in self.checks if not c.ok]
        if self.tasks and not self.passed:
            reasons.append("no task was admitted")
        if not self.tasks:
            reasons.append("the env has no tasks")
        return reasons

    @property
    def warnings(self) -> list[str]:
        return [f"{c.name}: {c.message}" for c in self.checks if c.status == "warn"]

    @property
    def fit(self) -> bool:
        return not self.unfit_reasons

    def regrade_summary(self) -> dict[str, Any]:
        calls = sum(t.regrade_calls for t in self.tasks)
        k = sum(t.regrade_negatives for t in self.tasks)
        return {"calls": calls, "must_fail_calls": k, "budget": asdict(self.budget) if self.budget else None,
                "leak_detection": {f"{p:.1%}": round(detection(k, p), 4) for p in (0.005, 0.002, 0.001)}}

    def to_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id, "version": self.version, "distribution": self.distribution,
            "fit": self.fit, "unfit_reasons": self.unfit_reasons, "warnings": self.warnings, "strict": self.strict,
            "tasks_total": len(self.tasks), "tasks_admitted": self.passed, "quarantined": self.quarantined,
            "duration_s": round(self.duration_s, 3), "checks": [asdict(c) for c in self.checks],
            "regrade": self.regrade_summary(), **({"judge_cost": self.judge_cost} if self.judge_cost else {}),
            "tasks": [{"task_id": t.task_id, "admitted": t.admitted, "checks": [asdict(c) for c in t.checks]}
                      for t in self.tasks],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)
