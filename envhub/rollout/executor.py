"""The multi-turn executor: one env, one task, one LLM backend -> one :class:`Trajectory`, token in / token out.

The loop, per turn::

    prompt ids + record ──generate──▶ sampled ids (mask 1, their logprobs, appended unchanged)
         ▲                                   │ decode + parse tool calls
         │                                   ▼
    delta ids (mask 0) ◀──template── env.astep(Action) ──▶ done? ─▶ artifacts ─▶ verifier (EVAL)

Only the env's new messages are ever tokenized (delta tokenization): the model's ids are the record and are never
re-tokenized. The episode runs in three stages (``init``, ``run``, ``evaluate``) so the rollout service can run each
in its own worker pool; :func:`rollout` runs all three. Whatever happens, :meth:`Episode.trajectory` is well formed:
an exception becomes ``finish_reason="error"`` with the error text, never a lost rollout.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from dataclasses import replace
from typing import Any

from envhub.backends.base import LLMBackend
from envhub.backends.lifecycle import generate_tagged, lifecycle_of
from envhub.codec.messages import with_system_note
from envhub.env import Message, Task, TextEnv
from envhub.failurelog import log_failure
from envhub.rollout.request import RolloutConfig, RolloutRequest, TaskIndex
from envhub.rollout.trajectory import Trajectory
from envhub.rewards import compose, step_components
from envhub.spec import EnvSpec
from envhub.verifier import Score, averify

log = logging.getLogger(__name__)


class PromptTooLong(ValueError):
    """The rendered prompt is longer than ``RolloutConfig.max_prompt_length``."""


class Episode:
    """One rollout, stage by stage: ``await init()``, ``await run()``, ``await evaluate()``, then ``trajectory()``.

    Each stage records its wall time in ``metrics`` (``init_s``, ``run_s``, ``eval_s``; inside RUN also ``gen_s``
    and ``env_s``). A stage that raises marks the episode failed and later stages do nothing; ``close()`` always
    frees the env and its sandbox.
    """

    def __init__(self, spec: EnvSpec, task: Task, backend: LLMBackend, tokenizer: Any,
                 config: RolloutConfig | None = None, *, session_id: str | None = None, env: TextEnv | None = None,
                 codec: Any = None):
        self.spec, self.task, self.backend, self.tokenizer = spec, dict(task), backend, tokenizer
        self.config = config or RolloutConfig()
        self.session_id = session_id or uuid.uuid4().hex
        self.env = env
        self.codec = codec
        self.messages: list[Message] = []
        # one (index in messages, start, end) per model call: where its message sits and which response_ids it
        # sampled (the ProRL reply's per-message token fields are cut along these, envhub.rollout.prorl)
        self.turns: list[tuple[int, int, int]] = []
        self.artifacts: dict[str, Any] | None = None
        self.score: Score | None = None  # the verifier's, after EVAL (``score.crashed``: the grader gave no verdict)
        self.step_parts: list[dict[str, float]] = []  # each env step's process-reward components (envhub.rewards)
        self.traj = Trajectory(env_id=spec.id, task_id=str(task.get("task_id", "")),
                               policy_version=self.config.policy_version)
        self.traj.metrics.update(init_s=0.0, run_s=0.0, eval_s=0.0, gen_s=0.0, env_s=0.0)
        self._session_open = False
        self._sampled_eos = False
        # a stage's exception: logged here (one record, envhub.failurelog) unless the runner logs failures itself
        # (the rollout service does, once per job, with its job id)
        self.exception: BaseException | None = None
        self.log_failures = True
        self.meter: Any = None  # ``meter.tool_call(seconds)`` per env step (the service's throughput figures)

    # ---- stages ------------------------------------------------------------------------------------------------
    async def init(self) -> None:
        """INIT: make the env, reset it on the task (this starts its sandbox, if any), render the prompt."""
        async with self._stage("init_s"):
            cfg = self.config
            if self.env is None:
                kwargs = dict(cfg.env_kwargs)
                if cfg.max_turns is not None:
                    kwargs["max_turns"] = cfg.max_turns
                self.env = self.spec.make(**kwargs)
            messages, _ = await self.env.areset(seed=cfg.seed, options={"task": self.task})
            self.messages = list(messages)
            if self.codec is None:
                from envhub.codec.chat import ChatCodec

                tools = [t.to_openai() for t in getattr(self.env, "tools", [])] or None
                self.codec = ChatCodec.shared(self.tokenizer, tools=tools, parser=cfg.parser)
            note = self.codec.tool_prompt()
            if note:  # the template hides the tools from the model: say them in the system message
                self.messages[:] = with_system_note(self.messages, note)
            if self.codec.tools:  # as JSON text: the fidelity check re-renders the prompt with exactly these tools
                self.traj.details["tools"] = json.dumps(self.codec.tools)
            self.traj.prompt_ids = list(self.codec.prompt_ids(self.messages))
            n = len(self.traj.prompt_ids)
            if cfg.max_prompt_length is not None and n > cfg.max_prompt_length:
                raise PromptTooLong(f"prompt of {n} tokens exceeds the prompt length {cfg.max_prompt_length} "
                                    "(max_prompt_length): raise it or shorten the env's prompt")
            self.backend.open_session(self.session_id, task=self.task, messages=self.messages, codec=self.codec)
            self._session_open = True

    async def run(self) -> None:
        """RUN: the multi-turn loop, until the env ends the episode, the turn budget, or the token budget."""
        if self.failed or self.env is None:
            return
        async with self._stage("run_s"):
            try:
                await self._loop()
            finally:
                await self._release_sandbox()

    async def evaluate(self) -> None:
        """EVAL: grade the artifacts with the spec's verifier (the RUN sandbox is already gone)."""
        if self.failed or self.artifacts is None:
            return
        async with self._stage("eval_s"):
            self.score = score = await averify(self.spec.verifier, self.task, self.artifacts)
            # the outcome and the env's step rewards, composed with caps (envhub.rewards: the outcome dominates);
            # step_rewards become each step's capped share, details["reward"] keeps raw and capped
            composed = compose(score.reward, self.step_parts, getattr(self.spec, "rewards", None),
                               response_length=sum(self.traj.response_mask))
            self.traj.reward = composed.total
            self.traj.step_rewards[:] = composed.step_rewards
            self.traj.details["reward"] = composed.to_dict()
            self.traj.passed = score.passed
            self.traj.details["score"] = score.details
        if score.crashed:
            # the grader gave no verdict: reward 0 would read as a wrong answer and be trained on; a failed
            # rollout trains nothing (loss_mask) and the service's `filter` keeps it out. The flag, never the
            # text: a verifier may quote agent-written strings in its details.
            error = str(score.details.get("error") or "the verifier crashed")
            if self.log_failures:
                log_failure(log, self.session_id, "eval", self.traj.env_id, self.traj.task_id, error)
            self.fail("error", f"EVAL: {error}")

    # ---- the loop ------------------------------------------------------------------------------------------------
    async def _loop(self) -> None:
        t, env, codec, cfg, backend = self.traj, self.env, self.codec, self.config, self.backend
        max_turns = cfg.max_turns or getattr(env, "max_turns", self.spec.max_turns)
        max_length = cfg.max_length
        if cfg.max_response_length is not None:
            max_length = min(max_length, len(t.prompt_ids) + cfg.max_response_length)
        # Per-turn work is a few microseconds, so the loop keeps what it touches in locals, and it keeps the
        # context the model sees (prompt + response so far) as one list it extends, instead of concatenating
        # prompt_ids + response_ids every turn (O(length) per turn). Backends read it during generate() only.
        context = t.prompt_ids + t.response_ids
        response_ids, mask, logprobs, metrics = t.response_ids, t.response_mask, t.response_logprobs, t.metrics
        versions = t.response_versions
        sampling, session_id, clock = cfg.sampling, self.session_id, time.perf_counter
        while True:
            budget = max_length - len(context)
            if budget <= 0:
                return self._cut("length", model_cut=t.num_turns == 0)  # only a prompt filling the budget cuts the model
            params = sampling if sampling.max_tokens <= budget else replace(sampling, max_tokens=budget)
            t0 = clock()
            gen = await generate_tagged(backend, context, params, session_id=session_id)
            t1 = clock()
            metrics["gen_s"] += t1 - t0
            ids = gen.token_ids
            response_ids += ids
            context += ids
            mask += [1] * len(ids)
            logprobs += map(float, gen.logprobs)
            versions += gen.versions or ()
            if gen.interruptions:
                metrics["interruptions"] = metrics.get("interruptions", 0) + gen.interruptions
            t.num_turns += 1
            # True only for the template's own end-of-turn token: after another EOS the delta must still close the turn
            self._sampled_eos = codec.ends_turn(ids)
            message, action = codec.assistant_message(ids, turn=t.num_turns, stop=params.stop or None)
            self.turns.append((len(self.messages), len(response_ids) - len(ids), len(response_ids)))
            self.messages.append(message)
            if gen.finish_reason == "length":
                return self._cut("length", model_cut=True)

            t0 = clock()
            obs, reward, terminated, truncated, info = await env.astep(action)
            dt = clock() - t0
            metrics["env_s"] += dt
            if self.meter is not None:
                self.meter.tool_call(dt)
            t.step_rewards.append(float(reward))
            self.step_parts.append(step_components(reward, info))
            if terminated or truncated:
                self.artifacts = info.get("artifacts") or {}
                t.finish_reason = "done" if terminated else "max_turns"
                t.truncated = False  # the model's last turn ended on its own (see _cut)
                self.messages.extend(obs)
                return None
            delta = codec.delta_ids(self.messages, obs, sampled_eos=self._sampled_eos)
            self.messages.extend(obs)
            if len(context) + len(delta) >= max_length:
                return self._cut("length")  # the env's reply does not fit: stop before it, as a length cut
            response_ids += delta
            context += delta
            mask += [0] * len(delta)
            logprobs += [0.0] * len(delta)
            versions += [-1] * len(delta)
            if t.num_turns >= max_turns:
                return self._cut("max_turns")

    def _cut(self, reason: str, model_cut: bool = False) -> None:
        """End the episode at a budget. ``truncated`` has OpenRLHF's meaning (``openrlhf/utils/agent.py``:
        ``is_truncated = ...finish_reason == "length"`` of the *last generation*): true only when the model's own last
        turn was cut by the token budget, not when the budget ran out at an env reply or at the turn limit after the
        model ended its turn, which OpenRLHF's stop-properly penalty must not punish. ``finish_reason`` says which
        budget ran out either way."""
        self.traj.finish_reason = reason
        self.traj.truncated = model_cut
        self.artifacts = self.env.timeout_artifacts() if self.env is not None else {}

    # ---- bookkeeping ---------------------------------------------------------------------------------------------
    @property
    def failed(self) -> bool:
        return self.traj.finish_reason in ("error", "timeout", "cancelled")

    def fail(self, reason: str, error: str) -> None:
        """Mark the episode failed (``error``, ``timeout`` or ``cancelled``); the first reason wins."""
        if not self.failed:
            self.traj.finish_reason = reason
            self.traj.error = error
            self.traj.reward, self.traj.passed = 0.0, False

    def _stage(self, metric: str):
        return _Stage(self, metric)

    async def _release_sandbox(self) -> None:
        release = getattr(self.env, "release_sandbox", None)
        if release is not None:
            await asyncio.to_thread(release)

    async def close(self) -> None:
        """Free everything: the backend session, the env and its sandbox. Safe to call more than once."""
        if self._session_open:
            self._session_open = False
            self.backend.close_session(self.session_id)
        env, self.env = self.env, None
        if env is not None:
            try:
                if getattr(env, "blocking", True):
                    await asyncio.to_thread(env.close)
                else:
                    env.close()
            except Exception as e:
                self.traj.details.setdefault("close_error", f"{type(e).__name__}: {e}")

    def trajectory(self) -> Trajectory:
        """The trajectory so far (complete after ``evaluate``). Always well formed."""
        self.traj.messages = list(self.messages)
        return self.traj


class _Stage:
    """Times a stage into ``metrics`` and turns an exception into a marked failure."""

    def __init__(self, episode: Episode, metric: str):
        self.episode, self.metric = episode, metric

    async def __aenter__(self):
        self.t0 = time.perf_counter()

    async def __aexit__(self, exc_type, exc, tb):
        self.episode.traj.metrics[self.metric] += time.perf_counter() - self.t0
        if exc is None or isinstance(exc, asyncio.CancelledError):
            return False
        stage = self.metric.removesuffix("_s")
        ep, traj = self.episode, self.episode.traj
        # the traceback goes to the log, not the trajectory: trajectories travel to clients and trainers, and a
        # traceback carries host paths and source lines
        if not ep.failed:
            ep.exception = exc
            if ep.log_failures:
                log_failure(log, ep.session_id, stage, traj.env_id, traj.task_id, f"{type(exc).__name__}: {exc}",
                            exc_info=(exc_type, exc, tb))
        ep.fail("error", f"{stage.upper()}: {type(exc).__name__}: {exc}")
        return True  # swallowed: the failure is in the trajectory


async def rollout(spec: EnvSpec, task: Task, backend: LLMBackend, tokenizer: Any,
                  config: RolloutConfig | None = None, *, session_id: str | None = None,
                  timeout_s: float | None = None) -> Trajectory:
    """Run one episode through INIT, RUN and EVAL and return its trajectory. Never raises, except that a
    cancellation of the calling task propagates (after cleanup); a timeout gives ``finish_reason="timeout"``."""
    ep = Episode(spec, task, backend, tokenizer, config, session_id=session_id)

    async def stages() -> None:
        await ep.init()
        await ep.run()
        await ep.evaluate()

    try:
        await wait_excluding_pauses(stages(), timeout_s, backend)
    except asyncio.TimeoutError:
        ep.fail("timeout", f"rollout took longer than {timeout_s}s")
    except asyncio.CancelledError:
        ep.fail("cancelled", "rollout cancelled")
        raise
    finally:
        await ep.close()
    return ep.trajectory()



async def wait_excluding_pauses(coro: Any, timeout_s: float | None, backend: LLMBackend) -> Any:
    """``asyncio.wait_for(coro, timeout_s)`` where time the backend's weights spent paused does not count (a weight
    update must not time an episode out: ProRL's ``PausableTimer``, extended to paused time)."""
    if timeout_s is None:
        return await coro
    lc, t0 = lifecycle_of(backend), time.monotonic()
    task = asyncio.ensure_future(coro)
    try:
        while True:
            left = t0 + timeout_s + lc.paused_s(t0) - time.monotonic()
            done, _ = await asyncio.wait({task}, timeout=max(0.05 if lc.paused else 0.0, left))
            if done:
                return task.result()
            if t0 + timeout_s + lc.paused_s(t0) <= time.monotonic() and not lc.paused:
                raise asyncio.TimeoutError
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def run_request(request: RolloutRequest, backend: LLMBackend, tokenizer: Any, *, index: TaskIndex | None = None,
                      session_id: str | None = None) -> Trajectory:
    """:func:`rollout` of a :class:`~envhub.rollout.request.RolloutRequest`: its instance resolved by ``index``
    (the one rule every entry point uses; in a worker thread, as loading a task set imports and reads files), its
    config and time limit applied. Never raises except on cancellation: an instance that does not resolve is a
    marked failure too."""
    inst = request.instance
    try:
        spec, task = await asyncio.to_thread((index or TaskIndex()).resolve, inst)
    except Exception as e:  # unknown env, unknown task, a plugin that fails to load: marked, not raised
        return Trajectory.failed(inst.env_id, inst.label, "error", f"{type(e).__name__}: {e}")
    return await rollout(spec, task, backend, tokenizer, request.config, session_id=session_id,
                         timeout_s=request.timeout_s)

async def rollout_many(spec: EnvSpec, tasks: list[Task], backend: LLMBackend, tokenizer: Any,
                       config: RolloutConfig | None = None, *, samples: int = 1, concurrency: int = 8,
                       timeout_s: float | None = None, on_done=None) -> list[Trajectory]:
    """Roll out every task ``samples`` times, ``concurrency`` at once on this event loop. Results keep the order
    task-major, sample-minor; ``details["sample"]`` is the sample index."""
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(task: Task, k: int) -> Trajectory:
        async with sem:
            cfg = config or RolloutConfig()
            if cfg.sampling.seed is not None:  # distinct, reproducible seeds per sample
                cfg = replace(cfg, sampling=replace(cfg.sampling, seed=cfg.sampling.seed + k))
            traj = await rollout(spec, task, backend, tokenizer, cfg, timeout_s=timeout_s)
            traj.details["sample"] = k
            if on_done:
                on_done(traj)
            return traj

    return list(await asyncio.gather(*(one(t, k) for t in tasks for k in range(samples))))
