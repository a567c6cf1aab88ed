"""Where a trainer adapter's rollouts come from: envhub's executor in-process, or the rollout service.

Both trainer adapters (``envhub-openrlhf``, ``envhub-verl``) do the same three things per dataset row, and do them
here so they behave alike:

1. **Read the instance** from the row into a :class:`~envhub.rollout.request.RolloutRequest` (the request type of
   every entry point): the same JSON shape the rollout service's ``POST /process`` takes::

       {"env_id": "countdown", "task_id": "countdown-1-0007"}            # a task of the env's task set
       {"env_id": "countdown", "task_id": "...", "split": "test"}        # ...looked up in another split
       {"env_id": "countdown", "task": {"task_id": "x", "numbers": [...], "target": 24, ...}}   # a full row

   A dict, or that dict as JSON text. A plain string that is not JSON is a ``task_id`` of the configured env.
   ``env_id`` may be left out when the adapter is configured with one (:class:`AdapterOptions`). A task id is
   looked up in ``split`` (else the adapter's ``split``, else the env's default split), by the same
   :class:`~envhub.rollout.request.TaskIndex` rule in-process and in the service.
2. **Run the episode**: in-process, envhub's executor drives the env and samples through an
   :class:`~envhub.backends.base.LLMBackend` the adapter builds over the trainer's own engine; or, when
   ``service_urls`` is configured, the rollout service runs it (``envhub.training.client.RolloutClient``).
3. **Cap lengths** the way trainers need: a prompt longer than ``max_prompt_length`` is not rolled out (a marked
   failure); the response never exceeds ``max_response_length`` (the executor's token budget stops it). The caps
   travel with the request, so the service enforces them too, before any token is spent;
   :func:`check_caps` only guards against a server that ignored them (an older envhub).

Whatever goes wrong (a bad label, an unknown env, a crashed env, the service down), the result is a well-formed
:class:`~envhub.rollout.trajectory.Trajectory` with ``finish_reason="error"`` and ``error`` saying why: a trainer
never loses a row of its batch, and never trains on tokens the model did not sample.

Configuration comes from the adapter's own config (the agent file's options, the agent-loop yaml's keys), then
environment variables, which win so one generated file can be reused: ``ENVHUB_ENV_ID``, ``ENVHUB_SPLIT``,
``ENVHUB_SERVICE_URLS`` (comma-separated), ``ENVHUB_MAX_TURNS``, ``ENVHUB_TIMEOUT_S``, ``ENVHUB_PARSER``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from envhub.backends.base import LLMBackend, SamplingParams
from envhub.failurelog import log_failure
from envhub.rollout.request import INSTANCE_SHAPE, Instance, RequestError, RolloutConfig, RolloutRequest, TaskIndex
from envhub.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass
class AdapterOptions:
    """How an adapter picks and runs environments (see the module docstring for the environment variables)."""

    env_id: str | None = None  # the env of rows whose instance names none
    split: str | None = None  # where task ids are looked up (default: the spec's default split, then "train")
    service_urls: list[str] = field(default_factory=list)  # non-empty: rollouts come from the rollout service
    max_turns: int | None = None  # None: the spec's max_turns
    timeout_s: float | None = None  # per rollout
    parser: str = "auto"  # tool-call parser

    ENV = {"env_id": "ENVHUB_ENV_ID", "split": "ENVHUB_SPLIT", "service_urls": "ENVHUB_SERVICE_URLS",
           "max_turns": "ENVHUB_MAX_TURNS", "timeout_s": "ENVHUB_TIMEOUT_S", "parser": "ENVHUB_PARSER"}

    @classmethod
    def resolve(cls, config: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> AdapterOptions:
        """Options from ``config`` (unknown keys are an error), overridden by ``ENVHUB_*`` environment variables."""
        config = {k: v for k, v in dict(config or {}).items() if v is not None}
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown envhub adapter option(s) {unknown}; known: {sorted(known)}")
        environ = os.environ if environ is None else environ
        for key, var in cls.ENV.items():
            if environ.get(var, "").strip():
                config[key] = environ[var].strip()
        urls = config.get("service_urls") or []
        if isinstance(urls, str):
            urls = [u.strip() for u in urls.split(",") if u.strip()]
        config["service_urls"] = [str(u) for u in urls]
        for key, kind in (("max_turns", int), ("timeout_s", float)):
            if config.get(key) is not None:
                try:
                    config[key] = kind(config[key])
                except (TypeError, ValueError):
                    raise ValueError(f"envhub adapter option {key} must be a number, got {config[key]!r}") from None
        return cls(**config)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class InstanceError(RequestError):
    """A dataset row's instance cannot be understood."""


def parse_instance(label: Any, options: AdapterOptions | None = None) -> Instance:
    """The :class:`Instance` of a row's label (see the module docstring for the accepted shapes)."""
    options = options or AdapterOptions()
    if hasattr(label, "item") and not isinstance(label, (str, bytes, dict)):  # numpy 0-d values from veRL batches
        label = label.item()
    if isinstance(label, bytes):
        label = label.decode("utf-8", errors="replace")
    if isinstance(label, str):
        text = label.strip()
        if text.startswith("{"):
            try:
                label = json.loads(text)
            except json.JSONDecodeError as e:
                raise InstanceError(f"label is not valid JSON ({e}); expected {INSTANCE_SHAPE}") from None
        elif text and options.env_id:
            label = {"task_id": text}
        else:
            raise InstanceError(f"label {text[:80]!r} is not an instance; expected {INSTANCE_SHAPE} "
                                "(a bare task id needs a configured env_id)")
    if not isinstance(label, dict):
        raise InstanceError(f"label must be a JSON object, got {type(label).__name__}; expected {INSTANCE_SHAPE}")
    try:
        return Instance.from_dict(label, env_id=options.env_id, split=options.split)
    except RequestError as e:
        raise InstanceError(f"{e} (label {str(label)[:120]})") from None


class EpisodeRunner:
    """Runs one instance and returns its :class:`Trajectory`: in-process, or on the rollout service.

    Args:
        options: the adapter's :class:`AdapterOptions`.
        tokenizer: the trainer's tokenizer (a transformers tokenizer with a chat template).
        index: shared :class:`~envhub.rollout.request.TaskIndex` (one per process is plenty).
    """

    def __init__(self, options: AdapterOptions, tokenizer: Any, *, index: TaskIndex | None = None):
        self.options = options
        self.tokenizer = tokenizer
        self.index = index or TaskIndex()
        self._clients: dict[int, tuple[Any, Any]] = {}  # id(event loop) -> (loop, RolloutClient)

    @property
    def uses_service(self) -> bool:
        return bool(self.options.service_urls)

    async def run(self, label: Any, backend: LLMBackend | None, sampling: SamplingParams, *, max_length: int,
                  max_prompt_length: int | None = None, max_response_length: int | None = None,
                  session_id: str | None = None, policy_version: int | str | None = None) -> Trajectory:
        """One rollout of the instance in ``label``. Never raises (except cancellation): failures are marked.

        ``max_length`` bounds prompt + response; ``max_response_length`` the response alone; ``max_prompt_length``
        the prompt (a longer prompt is a marked failure, not a left-truncated chat).
        """
        session_id = session_id or uuid.uuid4().hex
        try:
            request = self.request(label, sampling, max_length=max_length, max_prompt_length=max_prompt_length,
                                   max_response_length=max_response_length, policy_version=policy_version)
        except RequestError as e:
            return Trajectory.failed("?", "?", "error", f"bad instance: {e}")
        inst = request.instance
        try:
            if self.uses_service:
                wire = request.to_wire()
                traj = await self._client().process(wire["instance"], wire["sampling_params"])
                traj = traj if isinstance(traj, Trajectory) else Trajectory.from_dict(traj)
            else:
                from envhub.rollout.executor import rollout

                if backend is None:
                    raise ValueError("in-process rollouts need the trainer's engine (an LLMBackend); got none")
                spec, task = await asyncio.to_thread(self.index.resolve, inst)
                traj = await rollout(spec, task, backend, self.tokenizer, request.config, session_id=session_id,
                                     timeout_s=request.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # resolution or service failure: keep the row, mark it (and log it, once)
            error = f"{type(e).__name__}: {e}"
            log_failure(log, session_id, "service" if self.uses_service else "resolve", inst.env_id, inst.label,
                        error, exc_info=e)
            return Trajectory.failed(inst.env_id, inst.label, "error", error)
        return check_caps(traj, max_prompt_length, max_response_length)

    def request(self, label: Any, sampling: SamplingParams, *, max_length: int, max_prompt_length: int | None = None,
                max_response_length: int | None = None,
                policy_version: int | str | None = None) -> RolloutRequest:
        """The :class:`~envhub.rollout.request.RolloutRequest` of a row: its instance, the adapter's options and the
        trainer's sampling and length caps (which travel to the service with it)."""
        if max_prompt_length is not None and max_response_length is not None:
            max_length = min(max_length, max_prompt_length + max_response_length)
        config = RolloutConfig(max_turns=self.options.max_turns, max_length=max_length, sampling=sampling,
                               parser=self.options.parser, policy_version=policy_version,
                               max_prompt_length=max_prompt_length, max_response_length=max_response_length)
        return RolloutRequest(parse_instance(label, self.options), config, timeout_s=self.options.timeout_s)

    def _client(self):
        """The rollout-service client of the running event loop (its HTTP session belongs to that loop; trainers
        run one loop per worker, tests run several)."""
        loop = asyncio.get_running_loop()
        entry = self._clients.get(id(loop))
        if entry is None or entry[0] is not loop:
            try:
                from envhub.training.client import RolloutClient
            except ImportError as e:
                raise RuntimeError(f"service mode needs envhub.training.client.RolloutClient: {e}") from e
            entry = self._clients[id(loop)] = (loop, RolloutClient(self.options.service_urls))
        return entry[1]

    async def aclose(self) -> None:
        """Close the rollout-service client of the running loop (its connections); in-process mode holds none."""
        entry = self._clients.pop(id(asyncio.get_running_loop()), None)
        if entry is not None:
            await entry[1].close()


def check_caps(traj: Trajectory, max_prompt_length: int | None, max_response_length: int | None) -> Trajectory:
    """A trajectory over the trainer's caps is a marked failure (never cut: a cut would train on a response whose
    end the model did not choose and whose reward belongs to the uncut one).

    The caps travel with every request and the executor enforces them before spending tokens, so this only fires
    when a rollout service ignored them (an older envhub); it keeps a trainer's tensors within their shapes.
    """
    over = []
    # a failed rollout's prompt may be over the cap: that is why it failed (the executor refuses it before RUN)
    if max_prompt_length is not None and len(traj.prompt_ids) > max_prompt_length and traj.finish_reason != "error":
        over.append(f"prompt of {len(traj.prompt_ids)} tokens > max_prompt_length {max_prompt_length}")
    if max_response_length is not None and len(traj.response_ids) > max_response_length:
        over.append(f"response of {len(traj.response_ids)} tokens > max_response_length {max_response_length}")
    if not over:
        return traj
    why = "; ".join(over) + " (the rollout service ignored the request's caps: is it an older envhub?)"
    if traj.finish_reason == "error" and traj.error:
        why = f"{traj.error}; {why}"
    return replace(traj, response_ids=[], response_mask=[], response_logprobs=[], reward=0.0, passed=False,
                   finish_reason="error", truncated=True, error=why)
