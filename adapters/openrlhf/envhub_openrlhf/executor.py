"""``EnvhubAgentExecutor``: OpenRLHF's agent-executor contract, fulfilled by envhub's multi-turn executor.

OpenRLHF 0.11 loads the Python file given by ``--train.agent_func_path`` and instantiates its module-level
``AgentExecutor`` class with no arguments (it must subclass ``openrlhf.utils.agent.AgentExecutorBase``). For every
prompt of the dataset, its vLLM actor then awaits::

    await executor.execute(prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images)

This class answers that call by running one envhub episode: the row's ``label`` names the env and the task (see
``envhub.training.source``), envhub renders the prompt with the tokenizer's chat template, samples every turn
through ``llm_engine`` (:class:`~envhub_openrlhf.backend.OpenRLHFEngineBackend`), tokenizes only the env's replies,
and grades the episode with the env's verifier. The dataset's ``prompt`` text is not used for generation: the env
owns its prompt (it is echoed back, as OpenRLHF logs it).

What comes back is exactly what OpenRLHF's ``SamplesGenerator._process_response_into_experience`` reads:

- ``observation_tokens``: ``prompt_ids + response_ids`` of the trajectory, verbatim (never re-tokenized);
- ``action_ranges``: ``[start, end)`` spans of model tokens in ``observation_tokens``;
- ``rollout_log_probs``: one per observation token (0.0 on prompt and env tokens), or ``None`` when the trainer's
  ``sampling_params.logprobs`` is ``None``, as OpenRLHF's own executors do;
- ``reward`` and ``scores``: the verifier's reward as a Python ``float`` (what ``MultiTurnAgentExecutor`` returns);
- ``truncated``: the last generation hit its token limit (``finish_reason == "length"``; OpenRLHF's stop-properly
  penalty reads it); ``extra_logs``: numbers only (OpenRLHF turns each into a tensor).

A failed episode (bad label, env crash, prompt too long) keeps its row: reward 0, no action range (so no token of
it is trained on), ``extra_logs["envhub_error"] == 1``. The episode runs on the actor's event loop without blocking
it: env steps and grading run in worker threads, sampling is awaited.
"""
from __future__ import annotations

import uuid
from typing import Any, ClassVar

from openrlhf.utils.agent import AgentExecutorBase

from envhub.rollout.versions import version_span
from envhub.backends.base import SamplingParams
from envhub.backends.chat import require_trainable
from envhub.rollout.trajectory import Trajectory
from envhub.rollout.request import TaskIndex
from envhub.training.source import AdapterOptions, EpisodeRunner
from envhub_openrlhf.backend import OpenRLHFEngineBackend

EXTRA_LOG_KEYS = ("envhub_passed", "envhub_error", "envhub_num_turns", "envhub_gen_s", "envhub_env_s",
                  "envhub_eval_s")


class EnvhubAgentExecutor(AgentExecutorBase):
    """Runs envhub environments for OpenRLHF. Configure it by subclassing in the agent file::

        class AgentExecutor(EnvhubAgentExecutor):
            options = {"env_id": "countdown", "split": "train"}

    ``options`` are :class:`~envhub.training.source.AdapterOptions` (``env_id``, ``split``, ``service_urls``,
    ``max_turns``, ``timeout_s``, ``parser``); ``ENVHUB_*`` environment variables override them. With
    ``service_urls`` set, episodes run on the rollout service instead of in-process.
    """

    options: ClassVar[dict[str, Any]] = {}

    def __init__(self):
        self.adapter_options = AdapterOptions.resolve(self.options)
        self._index = TaskIndex()
        self._runners: dict[int, EpisodeRunner] = {}

    def runner(self, hf_tokenizer: Any) -> EpisodeRunner:
        """One runner per tokenizer object (OpenRLHF passes the same one every call)."""
        key = id(hf_tokenizer)
        if key not in self._runners:
            self._runners[key] = EpisodeRunner(self.adapter_options, hf_tokenizer, index=self._index)
        return self._runners[key]

    async def aclose(self) -> None:
        """Close connections to the rollout service (service mode) held for the running event loop."""
        for runner in self._runners.values():
            await runner.aclose()

    async def execute(self, prompt, label, sampling_params, max_length: int, hf_tokenizer, llm_engine, images=None):
        runner = self.runner(hf_tokenizer)
        sampling = envhub_sampling(sampling_params, max_length)
        backend = None if runner.uses_service else OpenRLHFEngineBackend(llm_engine, sampling_params)
        traj = await runner.run(label, backend, sampling, max_length=max_length, max_prompt_length=max_length - 1,
                                session_id=uuid.uuid4().hex)
        return to_openrlhf_output(traj, prompt=prompt, label=label, images=images, hf_tokenizer=hf_tokenizer,
                                  with_logprobs=getattr(sampling_params, "logprobs", None) is not None)


def envhub_sampling(sampling_params: Any, max_length: int) -> SamplingParams:
    """envhub's view of the trainer's ``vllm.SamplingParams``: the per-turn ``max_tokens`` (OpenRLHF's ``None``
    means "whatever the budget leaves"), temperature, top-p/k and seed. The engine itself gets the trainer's own
    object (see the backend), so nothing is lost in translation."""
    max_tokens = getattr(sampling_params, "max_tokens", None) or max_length
    stop = getattr(sampling_params, "stop", None) or []
    return SamplingParams(
        max_tokens=int(max_tokens),
        temperature=float(getattr(sampling_params, "temperature", 1.0)),
        top_p=float(getattr(sampling_params, "top_p", 1.0)),
        top_k=int(getattr(sampling_params, "top_k", -1) or -1),
        seed=getattr(sampling_params, "seed", None),
        stop=[stop] if isinstance(stop, str) else list(stop),
        stop_token_ids=list(getattr(sampling_params, "stop_token_ids", None) or []),
    )


def to_openrlhf_output(traj: Trajectory, *, prompt: Any, label: Any, images: Any = None, hf_tokenizer: Any = None,
                       with_logprobs: bool = True) -> dict[str, Any]:
    """The dict OpenRLHF's ``execute`` contract expects, from an envhub trajectory (see the module docstring)."""
    require_trainable(traj, "OpenRLHF")
    prompt_ids = list(traj.prompt_ids)
    if not prompt_ids and hf_tokenizer is not None and isinstance(prompt, str):
        # The episode failed before envhub rendered its prompt: keep the row with OpenRLHF's own tokenization of
        # the dataset prompt (what its executors do), so the sample still has a sequence; nothing in it is trained.
        prompt_ids = list(hf_tokenizer(text=prompt, add_special_tokens=False)["input_ids"])
    p = len(prompt_ids)
    logprobs = None
    if with_logprobs:
        logprobs = [0.0] * p + [float(x) for x in (traj.response_logprobs or [0.0] * len(traj.response_ids))]
    reward = float(traj.reward)
    metrics = traj.metrics or {}
    extra_logs = {
        "envhub_passed": float(bool(traj.passed)),
        "envhub_error": float(not traj.ok),
        "envhub_num_turns": float(traj.num_turns),
        "envhub_gen_s": float(metrics.get("gen_s", 0.0)),
        "envhub_env_s": float(metrics.get("env_s", 0.0)),
        "envhub_eval_s": float(metrics.get("eval_s", 0.0)),
    }
    span = version_span(traj)  # the weight versions that sampled this sample (OpenRLHF logs extra_logs per step)
    if span is not None:
        extra_logs["envhub_version_min"], extra_logs["envhub_version_max"] = float(span[0]), float(span[1])
    return {
        "prompt": prompt,
        "label": label,
        "images": images,
        "mm_train_inputs": None,
        "reward": reward,
        "scores": reward,
        "observation_tokens": prompt_ids + list(traj.response_ids),
        "action_ranges": [(p + s, p + e) for s, e in traj.trainable_ranges],  # none for a failed rollout
        "rollout_log_probs": logprobs,
        "truncated": bool(traj.truncated),  # OpenRLHF's meaning: the model's last turn was cut by the budget
        "extra_logs": extra_logs,
    }
