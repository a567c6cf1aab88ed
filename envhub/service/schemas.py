"""The HTTP API's request and reply shapes, ProRL Agent compatible, and how a request becomes a rollout config.

ProRL Agent's server takes ``POST /process {"instance": {...}, "sampling_params": {...}, "job_id": "..."}`` and so does
this one. What differs is only what ``instance`` means, and ProRL's own keys are accepted as aliases:

===================  =====================================================================================
``instance`` key     meaning
===================  =====================================================================================
``env_id``           the env (an installed plugin id); ProRL's ``data_source`` is accepted instead
``task``             the task row inline (a dict; its ``task_id`` is used, else ``instance_id``)
``task_id``          or: the id of a task in ``split`` (default: the env's default split);
                     ProRL's ``instance_id`` is accepted instead
``split``            where ``task_id`` is looked up
``trajectory_id``    echoed in the reply (ProRL: the sample index within a group)
``seed``             the env's reset seed
===================  =====================================================================================

``sampling_params`` is :class:`~envhub.backends.base.SamplingParams` (``max_tokens``/``max_new_tokens``,
``temperature``, ``top_p``, ``top_k``, ``seed``, ``stop``, ``stop_token_ids``), plus the vLLM sampling knobs in
:data:`VLLM_EXTRA_KEYS` (passed through) and an explicit ``extra`` dict (passed through as is). As in ProRL,
agent-level keys ride along in it and are taken out: ``max_turns`` (or ProRL's ``max_iterations``),
``max_length``, ``timeout``, ``policy_version``, ``parser``, and ProRL's three length caps (what NeMo-RL's
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
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

AGENT_KEYS = ("max_turns", "max_iterations", "max_length", "timeout", "policy_version", "parser",
              "max_model_len", "max_input_tokens", "max_output_tokens")
SAMPLING_KEYS = frozenset({"max_tokens", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                           "stop_token_ids", "extra"})
#: vLLM/SGLang sampling knobs passed through to the LLM server (anything else is dropped: see the module docstring)
VLLM_EXTRA_KEYS = frozenset({"min_p", "min_tokens", "repetition_penalty", "presence_penalty", "frequency_penalty",
                             "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "logit_bias",
                             "bad_words", "include_stop_str_in_output"})


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


def env_id_of(instance: dict[str, Any]) -> str:
    env_id = instance.get("env_id", instance.get("data_source"))
    if not isinstance(env_id, str) or not env_id:
        raise ServiceError(422, "instance must name its env: {\"env_id\": \"countdown\", ...} (ProRL's "
                                "\"data_source\" is accepted too; unlike ProRL there is no default env)")
    return env_id


def inline_task(instance: dict[str, Any]) -> dict[str, Any] | None:
    """The inline task row, with a string ``task_id``; ``None`` when the instance names a task by id instead."""
    row = instance.get("task")
    if row is None:
        return None
    if not isinstance(row, dict):
        raise ServiceError(422, f"instance.task must be a task row (a JSON object), got {type(row).__name__}")
    row = dict(row)
    tid = row.get("task_id", instance.get("task_id", instance.get("instance_id")))
    row["task_id"] = str(tid) if tid is not None else "inline-" + hashlib.sha1(
        json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:12]
    return row


def task_ref(instance: dict[str, Any]) -> tuple[str, str | None]:
    """``(task_id, split)`` of a task named by id."""
    tid = instance.get("task_id", instance.get("instance_id"))
    if tid is None or isinstance(tid, (dict, list)):
        raise ServiceError(422, "instance must give the task: \"task\": {row} inline, or \"task_id\": \"...\" "
                                "(optionally with \"split\"); ProRL's \"instance_id\" is accepted too")
    split = instance.get("split")
    if split is not None and not isinstance(split, str):
        raise ServiceError(422, f"instance.split must be a string, got {type(split).__name__}")
    return str(tid), split


def split_params(sampling_params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """``(sampling, agent, ignored)``: what goes to the LLM server, agent-level keys, and dropped keys."""
    sampling, agent, ignored = {}, {}, []
    for key, value in sampling_params.items():
        if key in AGENT_KEYS:
            agent["max_turns" if key == "max_iterations" else key] = value
        elif key in SAMPLING_KEYS or key in VLLM_EXTRA_KEYS:
            sampling[key] = value
        else:
            ignored.append(key)
    if "extra" in sampling and not isinstance(sampling["extra"], dict):
        raise ServiceError(422, "sampling_params.extra must be an object of backend-specific sampling knobs")
    return sampling, agent, sorted(ignored)


def _number(d: dict[str, Any], key: str, *, integer: bool = False, low: float | None = None,
            high: float | None = None) -> None:
    if key not in d or d[key] is None:
        return
    v = d[key]
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if ok and integer:
        ok = float(v).is_integer()
    if ok and low is not None:
        ok = v >= low
    if ok and high is not None:
        ok = v <= high
    if not ok:
        kind = "an integer" if integer else "a number"
        bounds = f" >= {low:g}" if low is not None else ""
        bounds += f" and <= {high:g}" if high is not None else ""
        raise ServiceError(422, f"sampling_params.{key} must be {kind}{bounds}, got {v!r}")
    if integer:
        d[key] = int(v)


def rollout_config(sampling_params: dict[str, Any], *, default_timeout: float | None,
                   request_timeout: float | None) -> tuple[Any, float | None, list[str]]:
    """``(RolloutConfig, timeout_s, ignored_keys)`` from a request's ``sampling_params`` (checked: 422 on bad
    values, so a job never fails later on something the request could have been refused for)."""
    from envhub.backends.base import SamplingParams
    from envhub.rollout.executor import RolloutConfig

    sampling, agent, ignored = split_params(sampling_params)
    if "max_new_tokens" in sampling:
        sampling.setdefault("max_tokens", sampling.pop("max_new_tokens"))
    _number(sampling, "max_tokens", integer=True, low=1)
    _number(sampling, "temperature", low=0)
    _number(sampling, "top_p", low=0, high=1)
    _number(sampling, "top_k", integer=True, low=-1)
    _number(sampling, "seed", integer=True)
    for key in ("stop", "stop_token_ids"):
        v = sampling.get(key)
        if isinstance(v, (str, int)) and not isinstance(v, bool):
            sampling[key] = [v]
        elif v is not None and not isinstance(v, list):
            raise ServiceError(422, f"sampling_params.{key} must be a list, got {type(v).__name__}")
    if not all(isinstance(s, str) for s in sampling.get("stop") or []):
        raise ServiceError(422, "sampling_params.stop must be a list of strings")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in sampling.get("stop_token_ids") or []):
        raise ServiceError(422, "sampling_params.stop_token_ids must be a list of integers")
    _number(agent, "max_turns", integer=True, low=1)
    _number(agent, "max_length", integer=True, low=1)
    for key in ("max_model_len", "max_input_tokens", "max_output_tokens"):  # ProRL's caps (module docstring)
        _number(agent, key, integer=True, low=1)
    _number(agent, "timeout", low=0.001)
    if "parser" in agent and not isinstance(agent["parser"], str):
        raise ServiceError(422, "sampling_params.parser must be a parser name (a string)")
    lengths = [agent[k] for k in ("max_length", "max_model_len") if agent.get(k) is not None]
    if sampling.get("max_tokens") is None:  # ProRL: per call, max_output_tokens, else the rest of max_model_len
        cap = agent.get("max_output_tokens") or agent.get("max_model_len")
        if cap is not None:
            sampling["max_tokens"] = cap  # the executor lowers it to what is left of max_length each turn
    config = RolloutConfig(
        max_turns=agent.get("max_turns"), max_length=min(lengths) if lengths else 4096,
        max_prompt_length=agent.get("max_input_tokens"),
        sampling=SamplingParams.from_dict(sampling), parser=agent.get("parser") or "auto",
        policy_version=agent.get("policy_version"),
    )
    timeout = request_timeout or agent.get("timeout") or default_timeout
    return config, timeout, ignored
