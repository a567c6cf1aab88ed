"""The judge's model, asked one chat at a time through any envhub backend, on the judge's own event loop.

A backend (transformers, vLLM, a token-id server, ``chat+http://``) takes token ids and gives token ids; the judge
speaks chat. :class:`JudgeModel` renders the judge's messages with a :class:`~envhub.codec.chat.ChatCodec`, asks
the backend with deterministic settings (greedy, ``temperature=0``, a fixed seed) and decodes the reply. The text-only
chat backend reads the conversation itself (``open_session(messages=...)``) and re-encodes the reply in the codec's
tokenizer, so the same path serves a hosted judge by URL.

Why a private loop: a backend's clients (an ``httpx.AsyncClient``, the HF micro-batcher's runner task) belong to the
event loop that made them. Verifiers are called from many places (admission's worker threads, the executor's loop,
``asyncio.to_thread``); every judgment is therefore submitted to one loop thread that owns the backend, and callers
wait on a ``concurrent.futures.Future`` with a time limit.
"""
from __future__ import annotations

import asyncio
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Coroutine

from envhub.backends.base import LLMBackend, SamplingParams


@dataclass
class JudgeStats:
    """What judging cost: model calls, cache hits, tokens and seconds (reported per admission)."""

    calls: int = 0
    cache_hits: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **kw: float) -> None:
        with self._lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def to_dict(self) -> dict[str, Any]:
        with self._lock:
            return {"calls": self.calls, "cache_hits": self.cache_hits, "failures": self.failures,
                    "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                    "seconds": round(self.seconds, 3)}


class JudgeModel:
    """One backend plus the codec that renders for it; :meth:`ask` returns the judge's raw reply text.

    Args:
        backend: an :class:`~envhub.backends.base.LLMBackend`, or a ``make_backend`` string (a model name or
            directory, ``http://...``, ``chat+http://...``, ``vllm:...``).
        tokenizer: the tokenizer whose chat template renders the judge's prompt (default: the model directory's,
            when ``backend`` names a local model; required for a URL, where any chat tokenizer serves the
            text-only chat backend), or a model name/directory loaded on the first judgment (so an env can build
            its judge at import without importing transformers).
        name: what ``Score.details["judge_model"]`` and the cache key call this judge (default: the spec string or
            the backend's ``repr``).
        max_tokens: the longest reply (a verdict is one short line of reasoning and one line).
        seed: fixed, with ``temperature=0``: the same prompt gets the same reply from a deterministic engine.
        decoding: backend-specific request fields sent with every judgment (``SamplingParams.extra``), e.g. a
            llama.cpp ``grammar`` that constrains the reply to the verdict format
            (:func:`envhub.judging.grammar.verdict_decoding`). A decoding setting, not a parser: the reply is still
            read by the strict parser, and anything else is still a crash.
    """

    def __init__(self, backend: LLMBackend | str, *, tokenizer: Any = None, name: str | None = None,
                 max_tokens: int = 96, seed: int = 0, api_model: str | None = None,
                 decoding: dict[str, Any] | None = None):
        from envhub.backends import make_backend

        spec = backend if isinstance(backend, str) else None
        if spec is not None and tokenizer is None:
            if spec.startswith(("http://", "https://", "chat+", "sglang+")):
                raise ValueError(f"JudgeModel({spec!r}) needs tokenizer=: a URL names no tokenizer to render with")
            from envhub.testing.models import load_tokenizer

            tokenizer = load_tokenizer(spec.removeprefix("vllm:"))
        if tokenizer is None:
            raise ValueError("JudgeModel needs tokenizer= with a backend object")
        kw = {"api_model": api_model} if spec and spec.startswith("chat+") else {}
        self.backend: LLMBackend = make_backend(spec, **kw) if spec is not None else backend  # type: ignore[assignment]
        self.name = name or spec or repr(self.backend)
        self._tokenizer: Any = tokenizer
        self._codec: Any = None  # built on first use (the `codec` property)
        self.params = SamplingParams(max_tokens=max_tokens, temperature=0.0, top_p=1.0, top_k=-1, seed=seed,
                                     extra=dict(decoding or {}))
        self.stats = JudgeStats()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True, name="envhub-judge")
        self._thread.start()

    @property
    def codec(self) -> Any:
        """The :class:`~envhub.codec.chat.ChatCodec` of ``tokenizer`` (loaded on first use when given by name)."""
        if self._codec is None:
            from envhub.codec.chat import ChatCodec

            tok = self._tokenizer
            if isinstance(tok, (str, Path)):
                from envhub.testing.models import load_tokenizer

                tok = load_tokenizer(tok)
            self._codec = ChatCodec(tok)
        return self._codec

    def submit(self, coro: Coroutine[Any, Any, Any]) -> Future:
        """Run ``coro`` on the judge's loop (see the module docstring)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    async def _ask(self, messages: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> str:
        params = self.params if not extra else replace(self.params, extra={**self.params.extra, **extra})
        sid = "judge-" + uuid.uuid4().hex
        msgs = [dict(m) for m in messages]
        ids = self.codec.prompt_ids(msgs)  # type: ignore[arg-type]  # plain role/content dicts
        self.backend.open_session(sid, messages=msgs, codec=self.codec)
        t0 = time.perf_counter()
        try:
            gen = await self.backend.generate(ids, params, session_id=sid)
        finally:
            self.backend.close_session(sid)
        self.stats.add(calls=1, prompt_tokens=len(ids), completion_tokens=len(gen.token_ids),
                       seconds=time.perf_counter() - t0)
        message, _ = self.codec.assistant_message(gen.token_ids)
        return str(message.get("content") or "")

    def ask(self, messages: list[dict[str, Any]], timeout_s: float, extra: dict[str, Any] | None = None) -> str:
        """The judge's reply to ``messages``; raises ``TimeoutError`` past ``timeout_s`` (the request is cancelled).
        ``extra``: request fields for this call only, over the judge's ``decoding`` (e.g. another grammar)."""
        fut = self.submit(self._ask(messages, extra))
        try:
            return fut.result(timeout_s)
        except TimeoutError:
            fut.cancel()
            raise TimeoutError(f"the judge gave no reply within {timeout_s:g}s") from None

    def close(self) -> None:
        """Close the backend and stop the loop thread."""
        if self._loop.is_closed():
            return
        try:
            self.submit(self.backend.close()).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
