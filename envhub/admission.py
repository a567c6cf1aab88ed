"""Admission: a verifier must earn trust before its tasks are used for training.

For every task, ``admit`` plays scripted policies straight against the env (no LLM) and grades each episode:

====================  =========================================================================================
check                 passes when
====================  =========================================================================================
``golden``            the plugin's golden policy passes the verifier
``noop``              the no-op policy (default: finish at once) fails
``deterministic``     the golden policy played again with the same seed gets the same reward and verdict
``malformed:<kind>``  a malformed action (empty, 1 MB of text, binary garbage, unknown tool, wrong argument types,
                      unparseable tool-call JSON) is answered without an exception and does not pass
``hack:<name>``       each hack probe the plugin declares fails
====================  =========================================================================================

A task failing any check is *quarantined* (named, with the reason). The verifier is *unfit* (``report.fit`` is
false, ``envhub validate`` exits non-zero) when a no-op, malformed action or hack passes anywhere, when replays
disagree, or when no task is admitted: those are flaws of the verifier, not of one task. A golden failure only
quarantines that task. Episodes run concurrently in worker threads; a crashing env or verifier is reported per
task, never fatal.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

from envhub.env import Action, MessagesSpace, ToolCall
from envhub.policy import Policy
from envhub.spec import EnvSpec
from envhub.task import select
from envhub.verifier import Score, safe_verify

SEED = 1234
EPISODE_TIMEOUT_S = 300.0
VERIFIER_CHECKS = ("noop", "deterministic", "malformed", "hack")  # failing these makes the verifier unfit

log = logging.getLogger(__name__)


@dataclass
class Episode:
    """One scripted episode: how it ended and how it was graded."""

    score: Score | None = None
    turns: int = 0
    error: str | None = None  # an exception escaped the env (or the policy): a bug admission reports
    artifacts: dict[str, Any] = field(default_factory=dict)


@dataclass
class Check:
    name: str
    ok: bool
    message: str = ""
    reward: float | None = None


@dataclass
class TaskReport:
    task_id: str
    checks: list[Check] = field(default_factory=list)

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

    @property
    def passed(self) -> int:
        """Number of admitted tasks."""
        return sum(t.admitted for t in self.tasks)

    @property
    def quarantined(self) -> dict[str, list[str]]:
        return {t.task_id: t.reasons for t in self.tasks if not t.admitted}

    @property
    def unfit_reasons(self) -> list[str]:
        reasons = sorted({
            f"{c.name} check failed on {sum(1 for t in self.tasks for d in t.checks if d.name == c.name and not d.ok)} task(s)"
            for t in self.tasks for c in t.checks if not c.ok and c.name.split(":")[0] in VERIFIER_CHECKS
        })
        if self.tasks and not self.passed:
            reasons.append("no task was admitted")
        if not self.tasks:
            reasons.append("the env has no tasks")
        return reasons

    @property
    def fit(self) -> bool:
        return not self.unfit_reasons

    def to_dict(self) -> dict[str, Any]:
        return {
            "env_id": self.env_id, "version": self.version, "distribution": self.distribution,
            "fit": self.fit, "unfit_reasons": self.unfit_reasons,
            "tasks_total": len(self.tasks), "tasks_admitted": self.passed, "quarantined": self.quarantined,
            "duration_s": round(self.duration_s, 3),
            "tasks": [{"task_id": t.task_id, "admitted": t.admitted, "checks": [asdict(c) for c in t.checks]}
                      for t in self.tasks],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def malformed_actions(tool_names: list[str]) -> dict[str, Action]:
    """The malformed inputs every env must answer calmly."""
    name = next((n for n in tool_names if n != "finish"), tool_names[0] if tool_names else "finish")
    return {
        "empty": Action(""),
        "huge": Action("x" * 1_000_000),
        "binary-garbage": Action(bytes(range(256)).decode("latin-1") * 64),
        "unknown-tool": Action("", [ToolCall("no_such_tool_xyz", {"a": 1}, id="call_bad")]),
        "wrong-argument-types": Action("", [ToolCall(name, {"__not_a_parameter__": [1, {"x": None}]}, id="call_bad")]),
        "unparseable-tool-call": Action('<tool_call>{"name": "finish", "arguments": {"answer": ',
                                        parse_error="unterminated JSON in <tool_call>"),
    }


def play(spec: EnvSpec, task: dict[str, Any], policy: Policy, *, seed: int = SEED,
         first_action: Action | None = None) -> Episode:
    """Play ``policy`` on ``task`` to the end of the episode (or the turn budget) and grade the artifacts."""
    ep = Episode()
    env = None
    try:
        env = spec.make()
        messages, _ = env.reset(seed=seed, options={"task": task})
        history = list(messages)
        artifacts = None
        for turn in range(env.max_turns):
            action = first_action if (turn == 0 and first_action is not None) else policy(task, list(history))
            action = Action.coerce(action)
            obs, _, terminated, truncated, info = env.step(action)
            if not MessagesSpace().contains(obs):
                raise TypeError(f"step() returned an observation that is not a list of chat messages: {str(obs)[:200]}")
            history += [action.to_message(), *obs]
            ep.turns = turn + 1
            if terminated or truncated:
                artifacts = info.get("artifacts") or {}
                break
        if artifacts is None:
            artifacts = env.timeout_artifacts()
        if hasattr(env, "release_sandbox"):
            env.release_sandbox()  # the RUN sandbox is freed before grading, as in the service
        ep.artifacts = artifacts
        ep.score = safe_verify(spec.verifier, task, artifacts)
    except Exception as e:
        ep.error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:  # the grade is already recorded; a failing close is the env's bug, reported
                log.warning("%s: env.close() raised after a scripted episode", spec.id, exc_info=True)
    return ep


def _judge(name: str, ep: Episode, must_pass: bool) -> Check:
    if ep.error:
        return Check(name, False, f"raised {ep.error.splitlines()[0]}")
    s = ep.score
    if s is not None and "error" in s.details and str(s.details["error"]).startswith("verifier crashed"):
        return Check(name, False, s.details["error"], s.reward)
    if must_pass and not s.passed:
        why = s.details.get("reason") or s.details.get("error") or json.dumps(s.details)[:200]
        return Check(name, False, f"golden solution failed (reward {s.reward}): {why}", s.reward)
    if not must_pass and s.passed:
        return Check(name, False, f"passed with reward {s.reward} but must fail", s.reward)
    return Check(name, True, "", s.reward)


async def admit_task(spec: EnvSpec, task: dict[str, Any], run) -> TaskReport:
    """All checks for one task; ``run(policy, **kw)`` plays one episode under the caller's concurrency limit."""
    env_tools = [t.name for t in getattr(spec.make(), "tools", [])]
    jobs: dict[str, Any] = {
        "golden": run(spec.golden),
        "golden-replay": run(spec.golden),
        "noop": run(spec.noop),
    }
    for kind, action in malformed_actions(env_tools).items():
        jobs[f"malformed:{kind}"] = run(spec.noop, first_action=action)
    for name, probe in spec.hack_probes.items():
        jobs[f"hack:{name}"] = run(probe)
    results = dict(zip(jobs, await asyncio.gather(*jobs.values())))
    golden, replay = results.pop("golden"), results.pop("golden-replay")
    checks = [_judge("golden", golden, must_pass=True)]
    if golden.error or replay.error:
        checks.append(Check("deterministic", False, f"raised {(golden.error or replay.error).splitlines()[0]}"))
    elif (golden.score.reward, golden.score.passed) != (replay.score.reward, replay.score.passed):
        checks.append(Check("deterministic", False, f"replay with seed {SEED} gave reward {replay.score.reward}, "
                            f"first run {golden.score.reward}"))
    else:
        checks.append(Check("deterministic", True, "", golden.score.reward))
    checks += [_judge(name, ep, must_pass=False) for name, ep in results.items()]
    return TaskReport(str(task.get("task_id", "")), checks)


async def admit_async(spec: EnvSpec, *, n: int | None = None, task_ids: list[str] | None = None,
                      split: str | None = None, concurrency: int = 4, progress=None) -> AdmissionReport:
    t0 = time.perf_counter()
    tasks = select(spec.load_tasks(split), n=n, ids=task_ids)
    sem = asyncio.Semaphore(max(1, concurrency))

    async def run(task: dict[str, Any], policy: Policy, **kw: Any) -> Episode:
        async with sem:
            try:
                return await asyncio.wait_for(asyncio.to_thread(play, spec, task, policy, **kw), EPISODE_TIMEOUT_S)
            except asyncio.TimeoutError:
                return Episode(error=f"TimeoutError: episode took longer than {EPISODE_TIMEOUT_S:.0f}s")

    async def one(task: dict[str, Any]) -> TaskReport:
        report = await admit_task(spec, task, functools.partial(run, task))
        if progress:
            progress(report)
        return report

    reports = await asyncio.gather(*(one(t) for t in tasks))
    return AdmissionReport(spec.id, spec.version, spec.distribution, list(reports), time.perf_counter() - t0)


def admit(spec: EnvSpec, **kw: Any) -> AdmissionReport:
    """Run admission for ``spec`` (see the module docstring). Keyword arguments: ``n``, ``task_ids``, ``split``,
    ``concurrency``, ``progress`` (called with each finished ``TaskReport``)."""
    return asyncio.run(admit_async(spec, **kw))
