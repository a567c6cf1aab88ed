"""Verifiers: ``verify(task, artifacts) -> Score``.

A verifier grades what an episode produced (its *artifacts*: a final answer, a git diff...), never the live env, so
grading can run after the episode's sandbox is freed, in a fresh sandbox, with test files reset: the agent cannot edit
what grades it. A verifier must be deterministic for admission to accept it (``envhub.admission``).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

from envhub import astguard
from envhub.types import Task

astguard.install()  # verifiers run in worker threads: CPython < 3.13 needs ast.parse serialised (see astguard)


@dataclass
class Score:
    """A grade. ``reward`` is what the trainer sees; ``passed`` is the binary verdict (pass@k, admission);
    ``details`` explains it (per-test results, the parsed answer, why it failed).

    ``crashed`` is True when there is no verdict: envhub made this score because the verifier raised, returned
    something other than a ``Score``, or hung past its time limit (:func:`safe_verify`, :func:`averify`,
    ``envhub.grading``); ``details["error"]`` then says what happened. A reward of 0 with ``crashed`` is a broken
    grader, not a wrong answer: the rollout service marks the episode failed, admission calls the verifier unfit.
    Consumers read this flag, never the text of ``details``, which a verifier may fill with agent-written strings.
    """

    reward: float
    passed: bool
    details: dict[str, Any] = field(default_factory=dict)
    crashed: bool = False

    @classmethod
    def crash(cls, error: str) -> Score:
        """The score that stands in for a verdict the verifier did not give (reward 0, ``crashed``)."""
        return cls(0.0, False, {"error": error}, crashed=True)

    def to_dict(self) -> dict[str, Any]:
        return {"reward": self.reward, "passed": self.passed, "details": self.details, "crashed": self.crashed}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Score:
        return cls(float(d["reward"]), bool(d["passed"]), dict(d.get("details") or {}), bool(d.get("crashed", False)))


@runtime_checkable
class Verifier(Protocol):
    """Grades one episode's artifacts against its task row.

    A verifier may also carry ``hack_probes`` (``{name: policy}``): the hacks that any env grading with it must
    withstand (a test runner shared by several envs brings the probes written against that runner). Admission plays
    them beside the env's own, on every task.
    """

    def verify(self, task: Task, artifacts: dict[str, Any]) -> Score: ...


class FunctionVerifier:
    """A verifier made from a function ``fn(task, artifacts) -> Score | float | bool``.

    A ``bool`` means pass/fail with reward 1/0; a ``float`` is the reward, passed when it reaches ``pass_threshold``.
    ``blocking=False`` says ``fn`` is quick pure Python (an answer comparison): the executor then grades inline
    instead of in a worker thread, whose hop would cost more than the grading (see :func:`averify`).
    """

    def __init__(self, fn: Callable[[Task, dict[str, Any]], Score | float | bool], pass_threshold: float = 1.0,
                 *, blocking: bool = True):
        self.fn = fn
        self.pass_threshold = pass_threshold
        self.blocking = blocking
        self.__name__ = getattr(fn, "__name__", type(self).__name__)

    def verify(self, task: Task, artifacts: dict[str, Any]) -> Score:
        out = self.fn(task, artifacts)
        if isinstance(out, Score):
            return out
        if isinstance(out, bool):
            return Score(float(out), out)
        reward = float(out)
        return Score(reward, reward >= self.pass_threshold)


class WeightedVerifier:
    """Reward composition: ``sum(w_i * reward_i)``; passed when every part with a positive weight passed."""

    def __init__(self, parts: list[tuple[Verifier, float]]):
        if not parts:
            raise ValueError("WeightedVerifier needs at least one (verifier, weight) part")
        self.parts = parts

    def verify(self, task: Task, artifacts: dict[str, Any]) -> Score:
        scores = [(v.verify(task, artifacts), w) for v, w in self.parts]
        return Score(
            reward=sum(s.reward * w for s, w in scores),
            passed=all(s.passed for s, w in scores if w > 0),
            details={"parts": [dict(s.to_dict(), weight=w) for s, w in scores]},
            crashed=any(s.crashed for s, _ in scores),  # a part without a verdict leaves the sum without one
        )


def as_verifier(v: Verifier | Callable[[Task, dict[str, Any]], Any]) -> Verifier:
    """Accept a verifier object or a plain function."""
    return v if isinstance(v, Verifier) else FunctionVerifier(v)


def safe_verify(verifier: Verifier, task: Task, artifacts: dict[str, Any]) -> Score:
    """Run a verifier; a crash becomes a failed Score marked ``crashed`` instead of an exception."""
    try:
        return _checked(verifier.verify(task, artifacts or {}), "verify")
    except Exception as e:
        return Score.crash(f"verifier crashed: {type(e).__name__}: {e}")


async def averify(verifier: Verifier, task: Task, artifacts: dict[str, Any]) -> Score:
    """Async form of :func:`safe_verify`: uses ``verifier.averify`` when defined, runs inline when the verifier says
    ``blocking = False`` (like ``TextEnv.blocking``), else in a worker thread so a slow grader never blocks the loop."""
    if hasattr(verifier, "averify"):
        try:
            return _checked(await verifier.averify(task, artifacts or {}), "averify")
        except Exception as e:
            return Score.crash(f"verifier crashed: {type(e).__name__}: {e}")
    if getattr(verifier, "blocking", True) is False:
        return safe_verify(verifier, task, artifacts)
    return await asyncio.to_thread(safe_verify, verifier, task, artifacts)


def _checked(score: Any, method: str) -> Score:
    if not isinstance(score, Score):
        raise TypeError(f"{method}() returned {type(score).__name__}, expected Score")
    return score
