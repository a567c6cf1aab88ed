"""One rollout request: which task (:class:`Instance`), how to run it (:class:`RolloutConfig`, sampling included),
and how long it may take. Every entry point builds one and hands it to the executor's ``Episode``::

    request = RolloutRequest(Instance("countdown", task_id="countdown-1-0007", split="test"),
                             RolloutConfig(max_turns=4, sampling=SamplingParams(max_tokens=256)), timeout_s=60)
    spec, task = TaskIndex().resolve(request.instance)        # the one resolution rule (in-process and service)
    body = request.to_wire()                                    # POST /process's body: {"instance", "sampling_params"}
    assert RolloutRequest.from_wire(body["instance"], body["sampling_params"]).config == request.config

The CLI builds requests from its options, the rollout service from ``POST /process``, the trainer adapters from a
dataset row's label (``envhub.training.source``); the gateway and the harness take the config part. So an instance
resolves identically wherever it is run, and the length caps (``max_prompt_length``, ``max_response_length``)
travel with the request: the executor that runs it enforces them, before any token is spent.

The wire form is ProRL Agent's (``envhub.service.schemas`` documents its keys and ProRL's aliases). A bad request
raises :class:`RequestError` (the service answers 422, an adapter marks the row failed); a task that is not there
raises :class:`TaskNotFound` (404).
"""
from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import dataclass, field
from typing import Any

from envhub.backends.base import SamplingParams


class RequestError(ValueError):
    """A rollout request that cannot be run as given (the message names the key and what is expected)."""


class TaskNotFound(RequestError):
    """The instance names a task (or a split) its env does not have."""


@dataclass
class RolloutConfig:
    """How to run a rollout: budgets, sampling, the tool-call parser (everything but *which* task)."""

    max_turns: int | None = None  # None: the spec's max_turns
    max_length: int = 4096  # prompt + response token budget
    max_prompt_length: int | None = None  # a longer prompt is a marked failure (never a left-truncated chat)
    max_response_length: int | None = None  # response budget (model + env tokens), within max_length
    sampling: SamplingParams = field(default_factory=SamplingParams)
    parser: str = "auto"  # tool-call parser (envhub.codec.toolcall)
    policy_version: int | str | None = None
    seed: int | None = None  # passed to env.reset
    env_kwargs: dict[str, Any] = field(default_factory=dict)  # to spec.make(); local only (never sent on the wire)


# ---- which task ------------------------------------------------------------------------------------------------
INSTANCE_SHAPE = '{"env_id": "<env>", "task_id": "<id>"[, "split": "<split>"]} or {"env_id": "<env>", "task": {<row>}}'


@dataclass(frozen=True)
class Instance:
    """Names the env and the task: a ``task_id`` looked up in ``split`` (default: the env's ``default_split``, and
    only it), or a whole ``task`` row inline. ``harness`` runs an agent CLI (``envhub.harness``) instead of the
    executor; ``trajectory_id`` is echoed (ProRL). (The wire's ``instance.seed``, the env's reset seed, is read into
    :attr:`RolloutConfig.seed` by :meth:`RolloutRequest.from_wire`.)"""

    env_id: str
    task_id: str | None = None
    split: str | None = None
    task: dict[str, Any] | None = None
    harness: str | None = None
    trajectory_id: Any = None

    @classmethod
    def from_dict(cls, d: Any, *, env_id: str | None = None, split: str | None = None) -> Instance:
        """From the wire's ``instance`` object (ProRL's ``data_source`` / ``instance_id`` accepted as aliases);
        ``env_id`` and ``split`` are defaults for an instance that names none."""
        if not isinstance(d, dict):
            raise RequestError(f"instance must be a JSON object, got {type(d).__name__}; expected {INSTANCE_SHAPE}")
        env = d.get("env_id", d.get("data_source")) or env_id
        if not isinstance(env, str) or not env:
            raise RequestError("instance must name its env: {\"env_id\": \"countdown\", ...} (ProRL's "
                               "\"data_source\" is accepted too; there is no default env)")
        row = d.get("task")
        tid = d.get("task_id", d.get("instance_id"))
        if row is not None:
            if not isinstance(row, dict):
                raise RequestError(f"instance.task must be a task row (a JSON object), got {type(row).__name__}")
            row = dict(row)
            tid = row.get("task_id", tid)
            # an inline row without an id gets one from its content: retries and caches see the same task
            row["task_id"] = str(tid) if tid is not None else "inline-" + hashlib.sha1(
                json.dumps(row, sort_keys=True, default=str).encode()).hexdigest()[:12]
            tid = row["task_id"]
        elif tid is None or isinstance(tid, (dict, list, bool)):
            raise RequestError("instance must give the task: \"task\": {row} inline, or \"task_id\": \"...\" "
                               "(optionally with \"split\"); ProRL's \"instance_id\" is accepted too")
        sp = d.get("split", split)
        if sp is not None and not isinstance(sp, str):
            raise RequestError(f"instance.split must be a string, got {type(sp).__name__}")
        harness = d.get("harness")
        if harness is not None and not isinstance(harness, str):
            raise RequestError(f"instance.harness must be a preset name (a string), got {type(harness).__name__}")
        return cls(env, str(tid), sp or None, row, harness, d.get("trajectory_id"))

    @property
    def label(self) -> str:
        """The task's id, for marking a failure of this instance (``"?"`` when it has none)."""
        return str((self.task or {}).get("task_id", self.task_id) or "?")

    def to_dict(self) -> dict[str, Any]:
        """The wire form (keys left out when unset)."""
        out: dict[str, Any] = {"env_id": self.env_id}
        if self.task is not None:
            out["task"] = dict(self.task)
        elif self.task_id is not None:
            out["task_id"] = self.task_id
        for key in ("split", "harness", "trajectory_id"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


class TaskIndex:
    """``(EnvSpec, task row)`` of an :class:`Instance`: the one resolution rule of every entry point.

    A task named by id is looked up in ``instance.split``, else in the env's ``default_split`` (and nowhere else:
    a task of another split must say so, or the same label could mean two tasks). An inline row is used as is.
    Task sets are loaded once per (env, split) and indexed by id. Thread-safe (callers load in a worker thread:
    loading imports the plugin and reads files). ``specs`` pins envs that are not in the hub (a plugin loaded from
    a path).
    """

    def __init__(self, hub: Any = None, specs: dict[str, Any] | None = None):
        self._hub = hub
        self._specs: dict[str, Any] = dict(specs or {})
        self._index: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self._lock = threading.RLock()

    def spec(self, env_id: str) -> Any:
        """The env's spec; raises the hub's ``UnknownEnv`` (a ``KeyError``) or ``PluginError``."""
        with self._lock:
            spec = self._specs.get(env_id)
            if spec is None:
                if self._hub is None:
                    from envhub.plugins import default_hub

                    self._hub = default_hub()
                spec = self._specs[env_id] = self._hub.get(env_id)
            return spec

    def resolve(self, instance: Instance) -> tuple[Any, dict[str, Any]]:
        spec = self.spec(instance.env_id)
        if instance.task is not None:
            return spec, dict(instance.task)
        split = instance.split or spec.default_split
        rows = self.rows(spec, split)
        row = rows.get(str(instance.task_id))
        if row is None:
            where = "" if instance.split else " (the env's default split; name another with \"split\")"
            some = ", ".join(list(rows)[:3])
            raise TaskNotFound(f"env {spec.id!r} has no task {instance.task_id!r} in split {split!r}{where}: "
                               f"{len(rows)} tasks" + (f", e.g. {some}" if some else ""))
        return spec, dict(row)

    def rows(self, spec: Any, split: str) -> dict[str, dict[str, Any]]:
        with self._lock:
            key = (spec.id, split)
            if key not in self._index:
                try:
                    rows = spec.load_tasks(split)
                except Exception as e:  # a plugin's loader may raise anything; the message says it
                    raise TaskNotFound(f"env {spec.id!r} has no task split {split!r}: {type(e).__name__}: {e}") from e
                self._index[key] = {str(r["task_id"]): dict(r) for r in rows}
            return self._index[key]


# ---- how to run it, on the wire ----------------------------------------------------------------------------------
AGENT_KEYS = ("max_turns", "max_iterations", "max_length", "timeout", "policy_version", "parser",
              "max_model_len", "max_input_tokens", "max_output_tokens", "max_response_length")
SAMPLING_KEYS = frozenset({"max_tokens", "max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                           "stop_token_ids", "extra"})
#: vLLM/SGLang sampling knobs passed through to the LLM server (anything else is dropped: envhub.service.schemas)
VLLM_EXTRA_KEYS = frozenset({"min_p", "min_tokens", "repetition_penalty", "presence_penalty", "frequency_penalty",
                             "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "logit_bias",
                             "bad_words", "include_stop_str_in_output"})


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
        raise RequestError("sampling_params.extra must be an object of backend-specific sampling knobs")
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
        raise RequestError(f"sampling_params.{key} must be {kind}{bounds}, got {v!r}")
    if integer:
        d[key] = int(v)


def config_from_wire(sampling_params: dict[str, Any]) -> tuple[RolloutConfig, float | None, list[str]]:
    """``(RolloutConfig, timeout_s, ignored_keys)`` of a request's ``sampling_params``, checked: a bad value is a
    :class:`RequestError` now, never a job that fails later on something the request could have been refused for."""
    if not isinstance(sampling_params, dict):
        raise RequestError(f"sampling_params must be a JSON object, got {type(sampling_params).__name__}")
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
            raise RequestError(f"sampling_params.{key} must be a list, got {type(v).__name__}")
    if not all(isinstance(s, str) for s in sampling.get("stop") or []):
        raise RequestError("sampling_params.stop must be a list of strings")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in sampling.get("stop_token_ids") or []):
        raise RequestError("sampling_params.stop_token_ids must be a list of integers")
    _number(agent, "max_turns", integer=True, low=1)
    _number(agent, "max_length", integer=True, low=1)
    for key in ("max_model_len", "max_input_tokens", "max_output_tokens", "max_response_length"):
        _number(agent, key, integer=True, low=1)
    _number(agent, "timeout", low=0.001)
    if "parser" in agent and not isinstance(agent["parser"], str):
        raise RequestError("sampling_params.parser must be a parser name (a string)")
    if agent.get("policy_version") is not None and not isinstance(agent["policy_version"], (int, str)):
        raise RequestError("sampling_params.policy_version must be an integer or a string")
    lengths = [agent[k] for k in ("max_length", "max_model_len") if agent.get(k) is not None]
    if sampling.get("max_tokens") is None:  # ProRL: per call, max_output_tokens, else the rest of max_model_len
        cap = agent.get("max_output_tokens") or agent.get("max_model_len")
        if cap is not None:
            sampling["max_tokens"] = cap  # the executor lowers it to what is left of max_length each turn
    config = RolloutConfig(
        max_turns=agent.get("max_turns"), max_length=min(lengths) if lengths else 4096,
        max_prompt_length=agent.get("max_input_tokens"), max_response_length=agent.get("max_response_length"),
        sampling=SamplingParams.from_dict(sampling), parser=agent.get("parser") or "auto",
        policy_version=agent.get("policy_version"),
    )
    return config, agent.get("timeout"), ignored


def config_to_wire(config: RolloutConfig, timeout_s: float | None = None) -> dict[str, Any]:
    """The ``sampling_params`` that :func:`config_from_wire` reads back as ``config`` (and ``timeout_s``)."""
    if config.env_kwargs:
        raise RequestError("env_kwargs do not travel to the rollout service (the env's constructor arguments are "
                           "the server's to choose); run in-process, or configure the env on the server")
    s = config.sampling
    params: dict[str, Any] = {"max_tokens": s.max_tokens, "temperature": s.temperature, "top_p": s.top_p,
                              "top_k": s.top_k}
    if s.seed is not None:
        params["seed"] = s.seed
    for key in ("stop", "stop_token_ids"):
        if getattr(s, key):
            params[key] = list(getattr(s, key))
    if s.extra:
        params["extra"] = dict(s.extra)
    params["max_length"] = int(config.max_length)
    wire = {"max_turns": config.max_turns, "max_input_tokens": config.max_prompt_length,
            "max_response_length": config.max_response_length, "policy_version": config.policy_version,
            "timeout": timeout_s, "parser": None if config.parser == "auto" else config.parser}
    params.update({k: v for k, v in wire.items() if v is not None})
    return params


@dataclass
class RolloutRequest:
    """Instance + config + time limit: what one rollout needs, whoever asks for it."""

    instance: Instance
    config: RolloutConfig = field(default_factory=RolloutConfig)
    timeout_s: float | None = None  # seconds for the whole rollout; None: the runner's default

    @classmethod
    def from_wire(cls, instance: Any, sampling_params: dict[str, Any] | None = None, *,
                  timeout_s: float | None = None) -> tuple[RolloutRequest, list[str]]:
        """``(request, ignored sampling keys)`` of a ``POST /process`` body's ``instance`` and ``sampling_params``;
        ``timeout_s`` (the body's own ``timeout``) wins over ``sampling_params.timeout``."""
        inst = Instance.from_dict(instance)
        config, timeout, ignored = config_from_wire(dict(sampling_params or {}))
        seed = instance.get("seed")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise RequestError(f"instance.seed must be an integer (the env's reset seed), got {seed!r}")
        config.seed = seed
        return cls(inst, config, timeout_s or timeout), ignored

    def to_wire(self) -> dict[str, Any]:
        """``{"instance": ..., "sampling_params": ...}``, the body of ``POST /process`` (without ``job_id``)."""
        instance = self.instance.to_dict()
        if self.config.seed is not None:
            instance["seed"] = self.config.seed
        return {"instance": instance, "sampling_params": config_to_wire(self.config, self.timeout_s)}
