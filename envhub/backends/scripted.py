"""The scripted ("golden") backend: a policy played through the real tokenizer.

A :data:`~envhub.policy.Policy` decides the next action from the conversation; this backend turns that action into
exactly the token ids a model of the target family would have sampled for it, so the executor, the token record and
the trainer hand-off are exercised end to end with a known-good player::

    backend = ScriptedBackend(spec.golden)
    backend.open_session("r1", task=row, messages=live_messages, codec=codec)   # the executor does this
    gen = await backend.generate(prompt_ids, SamplingParams(), session_id="r1")
    # gen.token_ids == tokenizer.encode(codec.render_action(action)) + [codec.eos_token_ids[0]]

How one turn is produced, and why each step is the way it is:

1. ``policy(task, messages)`` on the *live* message list the executor keeps (so reactive policies, e.g. a binary
   search that reads the env's last reply, see every reply so far).
2. ``codec.render_action(action)``: the text in the model's own tool-call format (Hermes ``<tool_call>`` JSON for
   ChatML models, Llama-3.1 JSON for Llama...). The codec, not this backend, knows the format.
3. The text is encoded (``codec.encode``, i.e. the tokenizer without added special tokens), then the end-of-turn id
   (``codec.eos_token_ids[0]``) is appended, as a model ends its turn by sampling it.
4. Sampling limits are honoured like a real engine would: a stop string cuts the ids right after the token that
   completes it (``finish_reason="stop"``, no EOS appended: the model never got to sample it); ``stop_token_ids``
   cut after that token; ``max_tokens`` cuts the ids (``finish_reason="length"``, no EOS).

Logprobs are 0.0 (log 1: a scripted player is certain). The prompt ids are not read: the conversation is.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envhub.backends.base import Generation, LLMBackend, SamplingParams
from envhub.env import Action


@dataclass
class _Session:
    task: Any
    messages: list
    codec: Any
    policy: Any


class ScriptedBackend(LLMBackend):
    """Plays ``policy`` through the real tokenizer (see the module docstring).

    Args:
        policy: ``policy(task, messages) -> Action | str``, e.g. an ``EnvSpec.golden``.
        codec: a default ``ChatCodec`` for sessions opened without one.
    """

    name = "scripted"

    def __init__(self, policy: Any, *, codec: Any = None):
        if not callable(policy):
            raise TypeError(f"ScriptedBackend needs a policy callable(task, messages), got {type(policy).__name__}")
        self.policy = policy
        self.codec = codec
        self._sessions: dict[str, _Session] = {}

    # ---- sessions ---------------------------------------------------------------------------------------------
    def open_session(self, session_id: str, *, task: Any = None, messages: list | None = None, codec: Any = None) -> None:
        self._open(session_id, self.policy, task, messages, codec)

    def _open(self, session_id: str, policy: Any, task: Any, messages: list | None, codec: Any) -> None:
        """Open a session that ``policy`` plays (a subclass may pick the policy per session)."""
        codec = codec if codec is not None else self.codec
        if codec is None:
            raise ValueError("ScriptedBackend.open_session needs a codec (the ChatCodec that renders actions)")
        # keep the caller's list object itself: the executor appends to it, and the policy must see those appends
        self._sessions[session_id] = _Session(task, messages if messages is not None else [], codec, policy)

    def close_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    @property
    def open_sessions(self) -> int:
        return len(self._sessions)

    # ---- generation -------------------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, session_id: str = "") -> Generation:
        session = self._sessions.get(session_id)
        if session is None:
            raise RuntimeError(
                f"ScriptedBackend: unknown session {session_id!r}; call open_session(session_id, task=..., "
                "messages=..., codec=...) before generate (the executor does this)"
            )
        action = Action.coerce(session.policy(session.task, session.messages))
        text = session.codec.render_action(action)
        codec = session.codec
        # the codec's own encoder when it has one (ChatCodec's fast path gives the tokenizer's ids: rollout.encoding)
        ids = list(codec.encode(text)) if hasattr(codec, "encode") else encode(codec.tokenizer, text)
        return play(ids, session.codec, params)


def play(ids: list[int], codec: Any, params: SamplingParams) -> Generation:
    """Turn the ids of a whole turn's text into what an engine would return under ``params`` (see module doc)."""
    eos = list(getattr(codec, "eos_token_ids", None) or [])
    if not eos:
        raise ValueError("the codec has no eos_token_ids: cannot end a scripted turn")
    out: list[int] = []
    finish = None
    stops = [s for s in (params.stop or []) if s]
    stop_ids = set(params.stop_token_ids or [])
    # Check stops token by token, as an engine does: the first token that completes a stop string (or is a stop
    # token) ends the turn. Decoding grows with the turn; turns are short and this runs once per turn.
    for tok in ids:
        if len(out) >= params.max_tokens:
            finish = "length"
            break
        out.append(tok)
        if tok in stop_ids:
            finish = "stop"
            break
        if stops and _completes_stop(codec.tokenizer, out, stops):
            finish = "stop"
            break
    if finish is None:
        if len(out) >= params.max_tokens:
            finish = "length"  # the text fit exactly, but there is no room left for the end-of-turn token
        else:
            out.append(eos[0])
            finish = "stop"
    return Generation(out, [0.0] * len(out), finish)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Ids of ``text`` without special tokens, for a transformers tokenizer or a raw ``tokenizers.Tokenizer``."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    return list(getattr(ids, "ids", ids))


def decode(tokenizer: Any, ids: list[int]) -> str:
    """Text of ``ids`` with special tokens kept (works for both tokenizer kinds)."""
    return tokenizer.decode(ids, skip_special_tokens=False)


def _completes_stop(tokenizer: Any, ids: list[int], stops: list[str]) -> bool:
    """True when the newest token completes one of ``stops``. Called after every token, so the first time a stop
    appears is the token that completed it. Only a tail window is decoded: a stop string of ``n`` characters spans
    at most ``4 n`` byte-level tokens (a character is at most 4 UTF-8 bytes)."""
    longest = max(len(s) for s in stops)
    text = decode(tokenizer, ids[-(4 * longest + 1):])
    return any(s in text for s in stops)
