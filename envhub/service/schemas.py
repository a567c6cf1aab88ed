"""The HTTP API's request and reply shapes, ProRL Agent compatible, and how a request becomes a rollout config.

ProRL Agent's server takes ``POST /process {"instance": {...}, "sampling_params": {...}, "job_id": "..."}`` and so does
this one. What differs is only what ``instance`` means, and ProRL's own keys are accepted as aliases:

===================  =====================================================================================
``instance`` key     meaning
===================  =====================================================================================
``env_id``           the env (an installed plugin id); ProRL's ``data_source`` is accepted instead
``task``             the task row inline (a dict; its ``task_id`` is used, else ``instance_id``)
``task_id``          or: the id of a task in ``split`` (default: the env's default split, and only it);
                     ProRL's ``instance_id`` is accepted instead
``split``            where ``task_id`` is looked up
``trajectory_id``    echoed in the reply (ProRL: the sample index within a group)
``seed``             the env's reset seed
``harness``          an agent CLI preset (``envhub.harness``) runs the task instead of envhub's executor
===================  =====================================================================================

Both are read into one :class:`~envhub.rollout.request.RolloutRequest` (the request type every entry point uses:
the adapters send exactly this form, and an instance resolves here as it does in-process).

``sampling_params`` is :class:`~envhub.backends.base.SamplingParams` (``max_tokens``/``max_new_tokens``,
``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``stop_token_ids``), plus the vLLM sampling knobs in
``envhub.rollout.request.VLLM_EXTRA_KEYS`` (passed through) and an explicit ``extra`` dict (passed through as is). As in ProRL,
agent-level keys ride along in it and are taken out: ``max_turns`` (or ProRL's ``max_iterations``),
``max_length``, ``timeout``, ``policy_version``, ``parser``, ``max_response_length`` (envhub's: the response
budget, model and env tokens, that trainers' response tensors allow), and ProRL's three length caps (what NeMo-RL's
``ProRLEnvironment`` sends, from its ``max_prompt_length``/``max_response_length``/``vllm_cfg.max_model_len``):

========================  =================================================================================
``max_model_len``         the token budget of the whole sequence, prompt + response (= ``max_length``; the
                          smaller wins when both are given). Each model call may sample what is left of it,
                          as ProRL's token-level client sets ``max_tokens = max_model_len - len(input_ids)``
``max_output_tokens``     each model call's ``max_tokens`` (OpenHands' ``LLMConfig.max_output_tokens``, sent
                          as ``max_completion_tokens``), still within what is left of ``max_model_len``; an
                          explicit ``max_tokens`` wins
``max_input_tokens``      the longest prompt accepted: a longer one ends the job as a marked failure
                          (``finish_reason="error"``, ``critical_error="init"``), never a left-truncated chat
========================  =================================================================================

Without ``max_tokens``/``max_output_tokens`` but with ``max_model_len``, a call may sample up to the rest of
``max_model_len`` (ProRL), not envhub's default 512.

Every other key (a LiteLLM/OpenHands option such as ``model``, ``api_key``, ``native_tool_calling``,
``strict_loop_detector``, or a typo) is **not** sent to the LLM server: sending ``model`` to vLLM would change the
served model name, and an unknown key is rejected or silently misread. Such keys are listed in the reply's
``details.ignored_params``.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

class ServiceError(Exception):
    """A request the service refuses, with the HTTP status to answer and a message saying what to do."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message


class ProcessRequest(BaseModel):
    """``POST /process``: run one rollout and answer with its trajectory when it is done."""

    model_config = ConfigDict(extra="forbid")
    instance: dict[str, Any] = Field(description="Names the env (env_id | data_source) and the task (task | task_id "
                                                 "[+ split] | instance_id). See envhub.service.schemas.")
    sampling_params: dict[str, Any] = Field(default_factory=dict, description="SamplingParams, plus agent keys "
                                            "(max_turns, max_length, timeout, policy_version, parser).")
    job_id: str | None = Field(default=None, min_length=1, max_length=256,
                               description="Your id for this job (for /cancel and safe retries); default: a uuid.")
    timeout: float | None = Field(default=None, gt=0, description="Seconds inside stages; default: the server's.")


class CancelRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job_id: str = Field(min_length=1, max_length=256)


class LLMServerRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    address: str = Field(min_length=1, max_length=2048, description="http(s)://host:port[/v1] of a vLLM or SGLang "
                         "server (token ids in and out); 'golden' adds the envs' golden players.")
    api: str = Field(default="completions", description="'completions' (vLLM) or 'sglang'.")


class PauseRequest(BaseModel):
    """``POST /pause``: stop sampling for a weight update. ``hold``: in-flight generations wait and continue under
    the new weights; ``abort``: they are cut and re-sent as prompt + partial output after ``/resume``."""

    mode: str = Field(default="hold", pattern="^(hold|abort)$")
    timeout_s: float = Field(default=60.0, gt=0, le=3600)


class ResumeRequest(BaseModel):
    """``POST /resume``: sampling continues; ``version`` (must not go backwards) tags every later token."""

    version: int | None = Field(default=None, ge=0)


class StartRequest(BaseModel):
    """``POST /start`` takes no body (ProRL); these optional fields resize the pools when given."""

    model_config = ConfigDict(extra="forbid")
    init_workers: int | None = Field(default=None, ge=1)
    run_workers: int | None = Field(default=None, ge=1)
    eval_workers: int | None = Field(default=None, ge=1)


class ProcessResponse(BaseModel):
    """The reply of ``/process``: a Trajectory (envhub) plus the fields ProRL Agent clients read."""

    model_config = ConfigDict(extra="allow")
    job_id: str
    env_id: str
    task_id: str
    instance_id: Any = None
    trajectory_id: Any = None
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    response_versions: list[int] = Field(default_factory=list, description="the weight version that sampled each "
                                         "response token, -1 on env tokens (AReaL's convention)")
    reward: float
    passed: bool
    resolved: bool = Field(description="ProRL: = passed")
    finish_reason: str = Field(description="done | length | max_turns | timeout | cancelled | error")
    critical_error: str | None = Field(description="ProRL: None, or init | run | eval | timeout | cancelled")
    filter: bool = Field(description="ProRL: true when a trainer should not use this sample")
    error: str | None = None
    num_turns: int
    messages: list[dict[str, Any]] = Field(description="ProRL's shape: trimmed to the last assistant message; each "
                                          "message has token_ids (+ input_ids, logprobs on the assistant's)")
    trailing_messages: list[dict[str, Any]] = Field(description="the messages after the last assistant message "
                                                    "(no tokens); envhub's client re-appends them")
    score: float = Field(description="ProRL: the reward (NeMo-RL's total_reward)")
    end_properly: bool = Field(description="ProRL: the episode ended on its own (NeMo-RL: truncated = not this)")
    finish: bool = Field(description="ProRL: the agent finished (here: the env terminated the episode)")
    success: bool = Field(description="ProRL: the run ended without failure (finish_reason == 'done')")
    tools: list[dict[str, Any]]
    metrics: dict[str, float]
    timing: dict[str, Any] = Field(description="ProRL: init_time, run_time, eval_time, others_time, "
                                               "counted_elapsed, timeout_triggered")
    details: dict[str, Any]


def fingerprint(req: ProcessRequest) -> str:
    """A hash of what a job does: a job id reused for a *different* request is refused, not silently merged."""
    payload = json.dumps([req.instance, req.sampling_params, req.timeout], sort_keys=True, default=str)
    return hashlib.sha1(payload.encode()).hexdigest()
