"""Admission's grading: every ``verify`` call bounded in time, and the re-grading check for state and randomness.

**Bounded calls.** Each task gets one daemon worker thread that runs ``verify``; admission waits for each verdict
at most ``grade_timeout_s``. A verifier that hangs yields a failed score marked ``crashed`` ("verifier hung"), its
worker is abandoned (a daemon thread cannot hold the process open) and every later grading of the run is refused at once, so
a hanging verifier costs one timeout, not one per call.

**Re-grading (the ``regrade`` check).** Grading is a pure function of ``(task, artifacts)`` or it is not trustworthy.
After the first verdict of every distinct artifact of a task (the must-fail ones first, the golden's last), the
recorded artifacts are graded again in a fixed rotation: golden, two must-fail ones, golden, ... Every verdict must
equal the first one for those artifacts. The budget, per task: ``max(regrades, ceil(min_total / tasks))`` calls,
stopped early once ``seconds`` of re-grading are spent (a sandboxed grader taking seconds gets a few).

With the defaults (``regrades=100``, ``min_total=2000``), an env's run makes at least ~2,000 re-grading calls when
its verifier is fast, two thirds on must-fail artifacts (~1,330). Hence:

- a *time bomb* (passes everything after call N, counted in the process) is caught for any N below the run's total
  number of calls (the first round plus ~2,000);
- a *leak* (a must-fail input passes with probability p per call) is missed with probability ``(1 - p) ** k`` for
  ``k`` must-fail gradings: p = 0.5% is caught with probability 1 - 0.995**1330 = 99.9%, p = 0.2% with 93%, p = 0.1%
  with 74%. Raise ``min_total`` for more (``envhub validate --regrades``). The report states ``k`` and these
  probabilities for the run actually made;
- a verifier that remembers a solved task and passes anything after it (or fails the golden after N calls) is
  caught on the next must-fail (or golden) call after the change.
"""
from __future__ import annotations

import math
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

from envhub.verifier import Score, Verifier, safe_verify


@dataclass
class Budget:
    """How hard admission grades (see the module docstring)."""

    regrades: int = 100  # re-grading calls per task, at least
    min_total: int = 2000  # re-grading calls per env run, at least (spread over its tasks)
    seconds: float = 10.0  # re-grading time per task, at most
    grade_timeout_s: float = 300.0  # one verify() call, at most

    def per_task(self, n_tasks: int) -> int:
        return max(self.regrades, math.ceil(self.min_total / max(1, n_tasks)))


def detection(k: int, leak: float) -> float:
    """Probability that ``k`` must-fail gradings catch a verifier passing them with probability ``leak`` each."""
    return 1.0 - (1.0 - leak) ** k


class Hung:
    """Shared by the graders of one admission run: once one verifier call hung, no later call is made."""

    def __init__(self) -> None:
        self.message: str | None = None


class BoundedGrader:
    """``verify`` in a daemon worker thread; each call waits at most ``timeout_s``."""

    def __init__(self, verifier: Verifier, timeout_s: float, hung: Hung):
        self.verifier, self.timeout_s, self.hung = verifier, timeout_s, hung
        self.calls = 0
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        threading.Thread(target=self._work, daemon=True, name="admission-grader").start()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            task, artifacts, box, done = job
            box.append(safe_verify(self.verifier, task, artifacts))
            done.set()

    def grade(self, task: dict[str, Any], artifacts: dict[str, Any]) -> Score:
        if self.hung.message:
            return Score.crash(f"verifier hung: not graded, an earlier call hung ({self.hung.message})")
        self.calls += 1
        box: list[Score] = []
        done = threading.Event()
        self._jobs.put((task, artifacts, box, done))
        if not done.wait(self.timeout_s):
            self.hung.message = (f"verify() gave no verdict within {self.timeout_s:g}s on task "
                                 f"{task.get('task_id', '')!r}, artifacts {_short(artifacts)}")
            return Score.crash(f"verifier hung: {self.hung.message}")
        return box[0]

    def close(self) -> None:
        self._jobs.put(None)


def crashed(score: Score) -> str | None:
    """The crash or hang message of a score marked ``crashed``, else None (read from the flag, never the text)."""
    if not score.crashed:
        return None
    err = score.details.get("error") if isinstance(score.details, dict) else None
    return str(err or "verifier crashed (no message)")


def regrade(grader: BoundedGrader, task: dict[str, Any], golden: list[tuple[str, dict[str, Any]]],
            negatives: list[tuple[str, dict[str, Any]]], first: dict[str, Score], calls: int,
            seconds: float, seen: dict[str, Score] | None = None) -> tuple[bool, str, int, int]:
    """Re-grade in rotation (golden, negative, negative, ...); ``(ok, message, calls made, must-fail calls)``.

    ``first`` maps each name in ``golden`` / ``negatives`` (an episode: ``noop``, ``probe:...``) to its first verdict.
    ``seen``, when given, receives each name's first *re-grade* verdict (admission's replay check reads the golden's:
    a second grading of the very same artifacts, so it is not made twice)."""
    rotation: list[tuple[str, dict[str, Any]]] = []
    g = n = 0
    while len(rotation) < 3 * max(len(golden), len(negatives), 1) and (golden or negatives):
        if golden:
            rotation.append(golden[g % len(golden)])
            g += 1
        for _ in range(2):
            if negatives:
                rotation.append(negatives[n % len(negatives)])
                n += 1
    if not rotation:
        return True, "nothing to re-grade", 0, 0
    negative_keys = {k for k, _ in negatives}
    made = neg = 0
    t0 = time.perf_counter()
    for i in range(calls):
        key, artifacts = rotation[i % len(rotation)]
        score = grader.grade(task, artifacts)
        if seen is not None:
            seen.setdefault(key, score)
        made += 1
        neg += key in negative_keys
        before = first[key]
        if crashed(score):
            return False, f"re-grade #{made} ({key}): {crashed(score)}", made, neg
        if (score.passed, score.reward) != (before.passed, before.reward):
            return False, (f"re-grade #{made} ({key}'s artifacts; {grader.calls} verify calls in this task) gave "
                           f"passed={score.passed} reward {score.reward}; its first grade was passed={before.passed} "
                           f"reward {before.reward}: the verdict depends on state or chance"), made, neg
        if time.perf_counter() - t0 > seconds:
            break
    return True, f"{made} re-grades agreed ({neg} of must-fail artifacts)", made, neg


def _short(artifacts: dict[str, Any]) -> str:
    text = repr(artifacts)
    return text if len(text) <= 120 else text[:117] + "..."
