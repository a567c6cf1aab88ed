"""The LLM backend contract: token ids in, token ids + logprobs out.

``await backend.generate(prompt_ids, params, session_id=...) -> Generation``. Token ids are the record: the executor
appends ``Generation.token_ids`` to the trajectory unchanged and never re-tokenizes text. ``session_id`` names the
rollout, so a backend (or a pool) can keep every turn of one rollout on one server for prefix-cache reuse.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SamplingParams:
    max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] = field(default_factory=list)  # stop strings: generation ends after the token that completes one
    stop_token_ids: list[int] = field(default_factory=list)  # besides the tokenizer's EOS
    extra: dict[str, Any] = field(default_factory=dict)  # backend-specific knobs, passed through

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        d = dict(d or {})
        known = {k: d.pop(k) for k in list(d) if k in cls.__dataclass_fields__ and k != "extra"}
        if "max_new_tokens" in d:
            known.setdefault("max_tokens", d.pop("max_new_tokens"))
        return cls(**known, extra={**d.pop("extra", {}), **d} if d else {})


@dataclass
class Generation:
    """What a backend sampled: ``token_ids`` exactly as sampled (EOS included when it was sampled), one logprob per
    token, and why it stopped: ``"stop"`` (EOS or a stop string/token), ``"length"`` (``max_tokens`` reached), or
    ``"abort"`` (stopped by a weight-update pause; only :func:`envhub.backends.lifecycle.generate_tagged` sees it,
    it re-sends the rest).

    ``versions``: the weight version that sampled each token, when the backend knows it (the server's own tag,
    or the version its lifecycle set); ``None`` lets :func:`~envhub.backends.lifecycle.generate_tagged` tag the
    call with the version it was admitted under. ``interruptions``: aborts survived inside this call."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"
    versions: list[int] | None = None
    interruptions: int = 0

    def __post_init__(self):
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")
        if self.versions is not None and len(self.versions) != len(self.token_ids):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.versions)} versions")


class BackendError(RuntimeError):
    """A backend failed (server down, bad reply). The pool moves the task to another backend."""


class LLMBackend(ABC):
    name: str = "backend"

    @abstractmethod
    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, session_id: str = "") -> Generation:
        """Sample a continuation of ``prompt_ids``.

        ``prompt_ids`` is the executor's own running context list (it is extended in place after each turn rather
        than rebuilt): read it during the call, copy it to keep it (``list(prompt_ids)``), never modify it."""

    def open_session(self, session_id: str, *, task: Any = None, messages: list | None = None, codec: Any = None) -> None:
        """Called by the executor before a rollout's first turn. ``messages`` is the live conversation list (the
        executor appends to it). Most backends ignore this; the scripted backend follows the conversation with it,
        and the pool pins the session to one backend."""

    def close_session(self, session_id: str) -> None:
        """Called by the executor when a rollout ends (whatever the outcome)."""

    async def close(self) -> None:
        """Release connections / engines."""
