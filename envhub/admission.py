"""Admission: a verifier must earn trust before its tasks are used for training.

For every task, ``admit`` plays scripted policies straight against the env (no LLM), records each episode's
artifacts, then grades them (``envhub.grading``: every call bounded in time, must-fail artifacts graded before the
golden's, then re-graded many times):

=========================  ====================================================================================
check                      passes when
=========================  ====================================================================================
``golden``                 the plugin's golden policy passes the verifier
``noop``                   the no-op policy (default: finish at once) fails
``deterministic``          the golden policy played again with the same seed gets the same reward and verdict
``malformed:<kind>``       a malformed action (empty, 1 MB of text, binary garbage, unknown tool, wrong argument
                           types, unparseable tool-call JSON) is answered without an exception and does not pass
``hack:<name>``            each hack probe the plugin declares fails
``probe:<name>``           each built-in probe, derived from the golden's own actions (``envhub.probes``: trailing
                           text, extra values, several answers, the preamble alone, empty and whitespace answers,
                           Unicode look-alikes, reward claims) fails, and no hostile input raises
``regrade``                re-grading the recorded artifacts hundreds of times, interleaved, always gives the first
                           verdict (time bombs, leaks, memory of solved tasks; budget in ``envhub.grading``)
``shaping-hack``           (envs whose golden earns step rewards before answering) the golden's steps farmed to the
                           turn budget fail the outcome (skipped when that rebuilds the golden's own artifacts);
                           ``shaping-hack:total``: its composed total (``envhub.rewards``: capped) is below the
                           golden's
``hack-probes-declared``   (env-level) the plugin declares hack probes: a warning, unfit under ``strict``
``judge-calibration``      (env-level, judged verifiers) agreement and Cohen's kappa on the env's labelled examples
                           reach its declared thresholds; ``judge-position-bias`` for a pairwise judge
                           (``envhub.judgeprobes``, which also adds the ``probe:judge-*`` attacks on every task)
=========================  ====================================================================================

A judged verifier (``verifier.judged``) is re-graded without its cache (``verifier.uncached()``): a cached verdict
would agree with itself. Its cost (calls, cache hits, tokens, seconds) is the report's ``judge_cost``.

Each check has a ``status``: ``pass``, ``fail``, ``skip`` (does not apply, with why) or ``warn``. A task failing
any check is *quarantined* (named, with the reason). The verifier is *unfit* (``report.fit`` is false, ``envhub
validate`` exits non-zero) when a no-op, malformed action, hack or probe passes anywhere, when the env or the
verifier raises (or hangs) on one of them, when replays or re-grades disagree, or when no task is admitted: those
are flaws of the verifier, not of one task. A golden failure, an exception in the golden policy or the env under it
included, only quarantines that task. Episodes run concurrently in worker threads; a crashing env or verifier is
reported per task, never fatal.
"""
from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from envhub.admission_report import VERIFIER_CHECKS, AdmissionReport, Check, TaskReport  # noqa: F401 (re-exported)
from envhub.env import Action, MessagesSpace, ToolCall
from envhub.grading import BoundedGrader, Budget, Hung, crashed, regrade
from envhub.judgeprobes import calibrate, judge_probes
from envhub.policy import Policy
from envhub.probes import ANSWER_EDITS, Probe, builtin_probes, farming_probe, shaping_verdict
from envhub.rewards import step_components
from envhub.spec import EnvSpec
from envhub.task import select
from envhub.verifier import Score, as_verifier

SEED = 1234
EPISODE_TIMEOUT_S = 300.0
PROBE_NAMES = [*ANSWER_EDITS, "reward-claim-json", "reward-claim-text", "reward-claim-tools"]
FOLD_REPLAY = True  # the replay's grading is the re-grading's first (see _grade_task); off: the old path, for benchmarks

log = logging.getLogger(__name__)


@dataclass
class Playthrough:
    """One scripted policy played through a task (golden, no-op, a probe): its actions, how it ended, how it was
    graded. Not the executor's :class:`envhub.rollout.executor.Episode` (a model's rollout, token by token)."""

    score: Score | None = None
    turns: int = 0
    error: str | None = None  # an exception escaped the env (or the policy): a bug admission reports
    artifacts: dict[str, Any] = field(default_factory=dict)
    actions: list[Action] = field(default_factory=list)
    steps: list[dict[str, float]] = field(default_factory=list)  # each step's process-reward components


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
         first_action: Action | None = None) -> Playthrough:
    """Play ``policy`` on ``task`` to the end of the episode (or the turn budget); record its actions and artifacts.
    Grading is separate (:func:`envhub.grading.BoundedGrader`), so admission controls its order and time."""
    ep = Playthrough()
    env = None
    try:
        env = spec.make()
        messages, _ = env.reset(seed=seed, options={"task": task})
        history = list(messages)
        artifacts = None
        for turn in range(env.max_turns):
            action = first_action if (turn == 0 and first_action is not None) else policy(task, list(history))
            action = Action.coerce(action)
            ep.actions.append(action)
            obs, reward, terminated, truncated, info = env.step(action)
            ep.steps.append(step_components(reward, info))
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
        ep.artifacts = artifacts or {}
    except Exception as e:
        ep.error = f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=4)}"
    finally:
        if env is not None:
            try:
                env.close()
            except Exception:  # the artifacts are recorded; a failing close is the env's bug, reported
                log.warning("%s: env.close() raised after a scripted episode", spec.id, exc_info=True)
    return ep


def _key(artifacts: dict[str, Any]) -> str:
    return json.dumps(artifacts, sort_keys=True, default=repr)


def _judge(name: str, ep: Playthrough, must_pass: bool, *, must_fail: bool = True) -> Check:
    if ep.error:
        return Check(name, False, f"raised {ep.error.splitlines()[0]}")
    s = ep.score
    assert s is not None
    if crashed(s):
        return Check(name, False, str(crashed(s)), s.reward)
    if must_pass and not s.passed:
        why = s.details.get("reason") or s.details.get("error") or json.dumps(s.details, default=repr)[:200]
        return Check(name, False, f"golden solution failed (reward {s.reward}): {why}", s.reward)
    if not must_pass and must_fail and s.passed:
        return Check(name, False, f"passed with reward {s.reward} but must fail", s.reward)
    return Check(name, True, "" if must_fail or must_pass else f"answered without an exception (passed={s.passed})",
                 s.reward)


def hack_probes_of(spec: EnvSpec) -> dict[str, Any]:
    """The env's hack probes and those its verifier carries (``verifier.hack_probes``: a grader shared by several
    envs brings the probes written against it, so every env that grades with it plays them); the env's own win a
    name clash."""
    return {**dict(getattr(spec.verifier, "hack_probes", None) or {}), **spec.hack_probes}


async def admit_task(spec: EnvSpec, task: dict[str, Any], run, grader: BoundedGrader, budget: Budget,
                     regrades: int, limit: asyncio.Semaphore, regrader: BoundedGrader | None = None) -> TaskReport:
    """All checks for one task; ``run(policy, **kw)`` plays one episode under the caller's concurrency limit, and
    the grading holds one slot of ``limit`` too (a sandboxed grader is as heavy as an episode). ``regrader`` (default
    ``grader``) makes the re-grades: a judged verifier's is uncached."""
    tools = list(getattr(spec.make(), "tools", []))
    golden = await run(spec.golden)  # first: the built-in probes are derived from its actions
    probes = builtin_probes(golden.actions, tools) if not golden.error else \
        [Probe(n, skip="the golden raised: no actions to derive it from") for n in PROBE_NAMES]
    if getattr(spec.verifier, "judged", False) and not golden.error:
        probes += judge_probes(golden.actions, tools, task, spec.verifier)
    jobs: dict[str, Any] = {"golden-replay": run(spec.golden), "noop": run(spec.noop)}
    for kind, action in malformed_actions([t.name for t in tools]).items():
        jobs[f"malformed:{kind}"] = run(spec.noop, first_action=action)
    for name, probe in hack_probes_of(spec).items():
        jobs[f"hack:{name}"] = run(probe)
    for p in probes:
        if not p.skip:
            jobs[f"probe:{p.name}"] = run(p.policy)
    farm = farming_probe(golden.actions, spec.max_turns) if not golden.error and any(golden.steps) else None
    if farm is not None and not farm.skip:  # only where the golden earned a step reward: there is one to farm
        jobs["shaping-hack"] = run(farm.policy)  # graded as must-fail with the others; its total: shaping_check
    episodes = {"golden": golden, **dict(zip(jobs, await asyncio.gather(*jobs.values())))}
    async with limit:
        report = await asyncio.to_thread(_grade_task, task, episodes, probes, grader, budget, regrades,
                                         regrader or grader)
    report.checks.append(shaping_check(spec, episodes))
    return report


def _deterministic(golden: Playthrough, replay: Playthrough) -> Check:
    """The ``deterministic`` check: the replay's own verdict against the golden's first."""
    if golden.error:
        return Check("deterministic", True, "not checked: the golden raised (its task is quarantined)", status="skip")
    if replay.error or replay.score is None or golden.score is None:
        return Check("deterministic", False, f"replay raised {(replay.error or '').splitlines()[0]}")
    if (golden.score.reward, golden.score.passed) != (replay.score.reward, replay.score.passed):
        return Check("deterministic", False, f"replay with seed {SEED} gave reward {replay.score.reward}, "
                     f"first run {golden.score.reward}")
    return Check("deterministic", True, "", golden.score.reward)


def shaping_check(spec: EnvSpec, episodes: dict[str, Playthrough]) -> Check:
    """``shaping-hack:total`` (:func:`envhub.probes.shaping_verdict`) for one task's episodes."""
    ok, message, status, total = shaping_verdict(episodes["golden"], episodes.get("shaping-hack"), spec.rewards, _key)
    return Check("shaping-hack:total", ok, message, total, status)


def _grade_task(task: dict[str, Any], episodes: dict[str, Playthrough], probes: list[Probe],
                grader: BoundedGrader, budget: Budget, regrades: int, regrader: BoundedGrader) -> TaskReport:
    """Grade every distinct artifact once (must-fail ones first, the golden's last), then re-grade (``regrade``).

    The replay gets a verdict of its own, never the golden's cached one. When its artifacts are the golden's own and
    the golden passed, that second grading is the re-grading's first call (the rotation starts with the golden): the
    same call on the same artifacts, made once instead of twice (for a sandboxed grader, one test run per task)."""
    golden, replay = episodes["golden"], episodes["golden-replay"]
    golden_key = _key(golden.artifacts) if not golden.error else None
    first: dict[str, Score] = {}
    order = sorted((n for n, ep in episodes.items() if not ep.error and n != "golden-replay"),
                   key=lambda n: n == "golden")
    for name in order:
        k = _key(episodes[name].artifacts)
        if k not in first:
            first[k] = grader.grade(task, episodes[name].artifacts)
        episodes[name].score = first[k]
    fold = (FOLD_REPLAY and golden_key is not None and not replay.error and _key(replay.artifacts) == golden_key
            and first[golden_key].passed and regrades > 0)
    if not replay.error and not fold:  # graded on its own: a second verdict for the same artifacts is the point
        replay.score = grader.grade(task, replay.artifacts)
    by_probe = {f"probe:{p.name}": p for p in probes}
    checks = [_judge("golden", golden, must_pass=True)]
    deterministic_at = len(checks)  # filled in after the re-grading, which may make the replay's grading
    for name, ep in episodes.items():
        if name in ("golden", "golden-replay"):
            continue
        probe = by_probe.get(name)
        if (probe or name == "shaping-hack") and not ep.error and golden_key is not None \
                and _key(ep.artifacts) == golden_key:
            checks.append(Check(name, True, "the env turned it into the golden's own artifacts", status="skip"))
            continue
        check = _judge(name, ep, must_pass=False, must_fail=probe.must_fail if probe else True)
        if probe and not check.ok:
            check.message += f" (sent {probe.sent[:120]!r})"
        checks.append(check)
    for p in probes:
        if p.skip:
            checks.append(Check(f"probe:{p.name}", True, p.skip, status="skip"))
    gold = [("golden", golden.artifacts)] if golden_key and first[golden_key].passed else []
    negatives: dict[str, tuple[str, dict[str, Any]]] = {}  # one per distinct artifact, named by its first episode
    for name, ep in episodes.items():
        k = _key(ep.artifacts)
        if name not in ("golden", "golden-replay") and not ep.error and ep.score is not None \
                and not ep.score.passed and k != golden_key:
            negatives.setdefault(k, (name, ep.artifacts))
    verdicts = {name: ep.score for name, ep in episodes.items() if ep.score is not None}
    seen: dict[str, Score] = {}
    ok, msg, made, neg = regrade(regrader, task, gold, list(negatives.values()), verdicts, regrades,
                                 budget.seconds, seen)
    if fold:  # the re-grading's first call on the golden's artifacts is the replay's verdict
        replay.score = seen["golden"] if "golden" in seen else grader.grade(task, replay.artifacts)
    checks.insert(deterministic_at, _deterministic(golden, replay))
    checks.append(Check("regrade", ok, msg))
    report = TaskReport(str(task.get("task_id", "")), checks)
    report.regrade_calls, report.regrade_negatives = made, neg
    return report


async def admit_async(spec: EnvSpec, *, n: int | None = None, task_ids: list[str] | None = None,
                      split: str | None = None, concurrency: int = 4, progress=None, strict: bool = False,
                      budget: Budget | None = None) -> AdmissionReport:
    t0 = time.perf_counter()
    budget = budget or Budget()
    tasks = select(spec.load_tasks(split), n=n, ids=task_ids)
    sem = asyncio.Semaphore(max(1, concurrency))
    hung = Hung()
    regrades = budget.per_task(len(tasks))

    async def run(task: dict[str, Any], policy: Policy, **kw: Any) -> Playthrough:
        async with sem:
            try:
                return await asyncio.wait_for(asyncio.to_thread(play, spec, task, policy, **kw), EPISODE_TIMEOUT_S)
            except asyncio.TimeoutError:
                return Playthrough(error=f"TimeoutError: episode took longer than {EPISODE_TIMEOUT_S:.0f}s")

    verifier = as_verifier(spec.verifier)
    fresh = verifier.uncached() if hasattr(verifier, "uncached") else None

    async def one(task: dict[str, Any]) -> TaskReport:
        grader = BoundedGrader(verifier, budget.grade_timeout_s, hung)
        regrader = BoundedGrader(fresh, budget.grade_timeout_s, hung) if fresh is not None else grader
        try:
            report = await admit_task(spec, task, functools.partial(run, task), grader, budget, regrades, sem,
                                      regrader)
        finally:
            grader.close()
            regrader.close()
        if progress:
            progress(report)
        return report

    reports = await asyncio.gather(*(one(t) for t in tasks))
    declared = hack_probes_of(spec)
    env_checks = [Check("hack-probes-declared", True, f"{len(declared)} hack probe(s)")
                  if declared else
                  Check("hack-probes-declared", not strict, "the plugin declares no hack probes: only the built-in "
                        "ones test its verifier; write HACK_PROBES for the shortcuts of this task family",
                        status="fail" if strict else "warn")]
    if getattr(verifier, "judged", False):
        grader = BoundedGrader(verifier, budget.grade_timeout_s, hung)
        try:
            found = await asyncio.to_thread(calibrate, verifier, grader.grade)
        finally:
            grader.close()
        env_checks += [Check(name, ok, msg, status=status) for name, ok, msg, status in found]
    cost = verifier.judge_stats() if hasattr(verifier, "judge_stats") else None
    return AdmissionReport(spec.id, spec.version, spec.distribution, list(reports), time.perf_counter() - t0,
                           checks=env_checks, strict=strict, budget=budget, judge_cost=cost)


def admit(spec: EnvSpec, **kw: Any) -> AdmissionReport:
    """Run admission for ``spec`` (see the module docstring). Keyword arguments: ``n``, ``task_ids``, ``split``,
    ``concurrency``, ``progress`` (called with each finished ``TaskReport``), ``strict`` (warnings make the verifier
    unfit), ``budget`` (an :class:`envhub.grading.Budget`)."""
    return asyncio.run(admit_async(spec, **kw))
