"""``EnvhubAgentLoop``: veRL's agent-loop contract, fulfilled by envhub's multi-turn executor.

veRL 0.9's ``AgentLoopWorker`` reads the yaml named by ``actor_rollout_ref.rollout.agent.agent_loop_config_path``
(a list of ``{name, _target_, ...}``), and for every sample whose ``agent_name`` is ``name`` it instantiates
``_target_`` with Hydra (extra keys of the entry become constructor arguments) and awaits::

    output: AgentLoopOutput = await agent_loop.run(sampling_params, **dataset_fields)

This loop runs one envhub episode per call: the instance comes from the row's ``extra_info.envhub`` (or a top-level
``envhub`` column; the JSON shape of ``envhub.training.source``), turns are sampled through veRL's server manager
with one request id per trajectory (sticky routing to one replica; :class:`~envhub_verl.backend.VerlServerBackend`),
the env's replies are tokenized as deltas, and the verifier grades the episode. The output holds:

- ``prompt_ids`` (at most ``rollout.prompt_length``: a longer prompt is a marked failure, not a cut chat) and
  ``response_ids`` / ``response_mask`` (1 = model token) / ``response_logprobs`` (only when
  ``rollout.calculate_log_probs``), at most ``rollout.response_length`` tokens: the executor's budget stops there;
- ``reward_score``, always (veRL builds ``rm_scores`` only when *every* sample of a batch sets it, and then skips its
  own reward computation), plus ``reward_extra_info`` (``envhub_passed``, ``envhub_error``, ``envhub_num_turns``),
  which veRL logs next to the reward, and ``envhub_result`` (env, task, finish reason, error) in ``extra_fields``;
- ``num_turns`` (messages in the conversation, as veRL counts user, assistant and tool turns) and timing
  ``metrics`` (generation, env, grading).
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopOutput, register

from envhub.rollout.versions import verl_global_steps
from envhub.backends.base import SamplingParams
from envhub.backends.chat import require_trainable
from envhub.rollout.trajectory import Trajectory
from envhub.rollout.request import TaskIndex
from envhub.training.source import AdapterOptions, EpisodeRunner
from envhub_verl.backend import VerlServerBackend

_INDEX = TaskIndex()
_RUNNERS: dict[tuple, EpisodeRunner] = {}  # veRL builds one agent loop per sample: runners (and caches) persist


def _runner(options: AdapterOptions, tokenizer: Any) -> EpisodeRunner:
    key = (json.dumps(options.to_dict(), sort_keys=True), id(tokenizer))
    if key not in _RUNNERS:
        _RUNNERS[key] = EpisodeRunner(options, tokenizer, index=_INDEX)
    return _RUNNERS[key]


async def close_runners() -> None:
    """Close the rollout-service connections held for the running event loop (service mode)."""
    for runner in _RUNNERS.values():
        await runner.aclose()


def instance_label(kwargs: dict[str, Any]) -> Any:
    """The instance of a veRL sample: ``extra_info["envhub"]``, else a top-level ``envhub`` field."""
    extra = kwargs.get("extra_info") or {}
    if isinstance(extra, dict) and extra.get("envhub") is not None:
        return extra["envhub"]
    return kwargs.get("envhub")


@register("envhub")
class EnvhubAgentLoop(AgentLoopBase):
    """Runs envhub environments for veRL. Options (yaml keys next to ``name`` and ``_target_``) are
    :class:`~envhub.training.source.AdapterOptions`: ``env_id``, ``split``, ``service_urls``, ``max_turns``,
    ``timeout_s``, ``parser``; ``ENVHUB_*`` environment variables override them."""

    def __init__(self, *args, name: str | None = None, tools: Any = None, env_id: str | None = None,
                 split: str | None = None, service_urls: Any = None, max_turns: int | None = None,
                 timeout_s: float | None = None, parser: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        urls = list(service_urls) if service_urls is not None and not isinstance(service_urls, str) else service_urls
        self.options = AdapterOptions.resolve({"env_id": env_id, "split": split, "service_urls": urls,
                                               "max_turns": max_turns, "timeout_s": timeout_s, "parser": parser})
        self.prompt_length = int(self.rollout_config.prompt_length)
        self.response_length = int(self.rollout_config.response_length)

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        runner = _runner(self.options, self.tokenizer)
        sampling = SamplingParams(
            max_tokens=self.response_length,
            temperature=float(sampling_params.get("temperature", 1.0)),
            top_p=float(sampling_params.get("top_p", 1.0)),
            top_k=int(sampling_params.get("top_k", -1)),
        )
        backend = None if runner.uses_service else VerlServerBackend(self.server_manager, sampling_params)
        traj = await runner.run(instance_label(kwargs), backend, sampling,
                                max_length=self.prompt_length + self.response_length,
                                max_prompt_length=self.prompt_length, max_response_length=self.response_length)
        prompt_ids = list(traj.prompt_ids) or await self._fallback_prompt(kwargs.get("raw_prompt"))
        return to_agent_loop_output(traj, prompt_ids, with_logprobs=bool(sampling_params.get("logprobs")))

    async def _fallback_prompt(self, raw_prompt: Any) -> list[int]:
        """A failed episode with no prompt of its own (bad instance, unknown env) keeps the dataset's prompt,
        rendered as veRL would, so the row keeps its shape; nothing in it is trained on."""
        def render() -> list[int]:
            from envhub.codec.chat import ChatCodec

            try:
                return ChatCodec(self.tokenizer).prompt_ids(list(raw_prompt or []))[-self.prompt_length:]
            except Exception:
                return []

        return await asyncio.to_thread(render)


def to_agent_loop_output(traj: Trajectory, prompt_ids: list[int], *, with_logprobs: bool) -> AgentLoopOutput:
    """veRL's ``AgentLoopOutput`` from an envhub trajectory (see the module docstring)."""
    require_trainable(traj, "veRL")
    metrics = traj.metrics or {}
    info = {"envhub_passed": float(bool(traj.passed)), "envhub_error": float(not traj.ok),
            "envhub_num_turns": float(traj.num_turns)}
    logprobs = None
    if with_logprobs:
        logprobs = [float(x) for x in (traj.response_logprobs or [0.0] * len(traj.response_ids))]
    return AgentLoopOutput(
        prompt_ids=list(prompt_ids),
        response_ids=list(traj.response_ids),
        response_mask=traj.loss_mask,  # all zeros for a failed rollout: nothing of it is trained
        response_logprobs=logprobs,
        reward_score=float(traj.reward),
        num_turns=len(traj.messages) or 2 * traj.num_turns,
        metrics={"generate_sequences": float(metrics.get("gen_s", 0.0)), "tool_calls": float(metrics.get("env_s", 0.0)),
                 "compute_score": float(metrics.get("eval_s", 0.0))},
        extra_fields={
            "turn_scores": [float(r) for r in traj.step_rewards],
            "tool_rewards": [],
            "reward_extra_info": info,
            "envhub_result": {"env_id": traj.env_id, "task_id": traj.task_id, "finish_reason": traj.finish_reason,
                       "error": traj.error or ""},
            # veRL's fully-async staleness keys, from the version that sampled each token (envhub.rollout.versions)
            **verl_global_steps(traj),
        },
    )
