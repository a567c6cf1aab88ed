"""A text-only backend for any OpenAI-compatible ``/v1/chat/completions`` endpoint: evaluation, never training.

Hosted chat APIs take messages and return text (and tool calls), not token ids. This backend sends the live
conversation (the executor's own message list, with the env's tools as OpenAI ``tools``) and turns the reply into
an :class:`~envhub.env.Action`; the action is then written in the target tokenizer's format exactly as the scripted
backend writes a policy's action (:func:`envhub.backends.scripted.play`), so the executor, the env and the verifier
run unchanged and rewards are real.

What it cannot give is the token record a trainer needs: the ids are a re-encoding of the reply in *our* tokenizer,
not what the remote model sampled, and there are no logprobs (they are 0.0). So every trajectory made with it is
marked untrainable (``details["untrainable"]``, see :func:`mark_untrainable`), and the trainer adapters refuse such
trajectories with a message saying why. ``envhub rollout --model chat+http://HOST:PORT[/v1] --api-model NAME``.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from envhub.backends.base import BackendError, Generation, LLMBackend, SamplingParams
from envhub.backends.scripted import encode, play
from envhub.env import Action, ToolCall

UNTRAINABLE = "untrainable"
REASON = ("made with a text-only chat backend: the token ids are a re-encoding of the reply, not the ids the model "
          "sampled, and there are no logprobs; use it to evaluate, train on a token-level backend (transformers, "
          "vLLM, SGLang)")
TIMEOUT_S = 300.0


def mark_untrainable(traj: Any, reason: str = REASON) -> Any:
    """Mark a trajectory as unfit for training (kept for evaluation); returns it."""
    traj.details[UNTRAINABLE] = reason
    return traj


def untrainable_reason(traj_or_details: Any) -> str | None:
    """Why a trajectory (or its ``details`` dict) must not be trained on, or None. What the adapters check."""
    details = traj_or_details if isinstance(traj_or_details, dict) else getattr(traj_or_details, "details", None)
    if isinstance(details, dict) and isinstance(details.get("details"), dict):  # a whole trajectory dict
        details = details["details"]
    return (details or {}).get(UNTRAINABLE) if isinstance(details, dict) else None


class UntrainableTrajectory(ValueError):
    """A trajectory marked untrainable reached a trainer."""


def require_trainable(traj: Any, trainer: str) -> None:
    """What the trainer adapters call on every trajectory before handing it to ``trainer``."""
    reason = untrainable_reason(traj)
    if reason:
        raise UntrainableTrajectory(f"{trainer} cannot train on envhub trajectory {traj.env_id}/{traj.task_id}: "
                                    f"it was {reason}")


@dataclass
class _Session:
    messages: list
    codec: Any


class ChatBackend(LLMBackend):
    """Plays a remote chat model through ``/v1/chat/completions`` (see the module docstring).

    Args:
        base_url: the server, with or without a trailing ``/v1``.
        model: the model name the server expects (default: the first ``GET /v1/models`` lists).
        api_key: sent as ``Authorization: Bearer`` (default: ``$OPENAI_API_KEY`` when set).
    """

    name = "chat"
    trainable = False

    def __init__(self, base_url: str, model: str | None = None, *, api_key: str | None = None,
                 timeout_s: float = TIMEOUT_S):
        self.base_url = base_url.rstrip("/").removesuffix("/v1")
        self.model = model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout_s = timeout_s
        self._sessions: dict[str, _Session] = {}
        self._client: Any = None

    def __repr__(self) -> str:
        return f"ChatBackend({self.base_url!r}, model={self.model!r})"

    def open_session(self, session_id: str, *, task: Any = None, messages: list | None = None, codec: Any = None) -> None:
        if codec is None:
            raise ValueError("ChatBackend.open_session needs the codec (it writes the reply in the tokenizer's format)")
        self._sessions[session_id] = _Session(messages if messages is not None else [], codec)

    def close_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, session_id: str = "") -> Generation:
        session = self._sessions.get(session_id)
        if session is None:
            raise RuntimeError(f"ChatBackend: unknown session {session_id!r} (the executor opens one per rollout)")
        if self.model is None:
            self.model = await self.served_model()
        reply = await self._request("POST", "/v1/chat/completions", self.body(session, params))
        action, finish = parse_reply(reply)
        codec = session.codec
        text = codec.render_action(action)
        ids = list(codec.encode(text)) if hasattr(codec, "encode") else encode(codec.tokenizer, text)
        gen = play(ids, codec, params)
        if finish == "length" and gen.finish_reason == "stop" and gen.token_ids[-1:] == list(codec.eos_token_ids[:1]):
            # the server cut the reply at max_tokens: no end-of-turn token was sampled
            gen = Generation(gen.token_ids[:-1], gen.logprobs[:-1], "length")
        return gen

    def body(self, session: _Session, params: SamplingParams) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "messages": [_wire(m) for m in session.messages],
                               "max_tokens": params.max_tokens, "temperature": params.temperature}
        if params.top_p != 1.0:
            out["top_p"] = params.top_p
        if params.seed is not None:
            out["seed"] = params.seed
        if params.stop:
            out["stop"] = list(params.stop)
        tools = getattr(session.codec, "tools", None)
        if tools:
            out["tools"] = tools
        out.update(params.extra)  # the server's own request fields (llama.cpp's grammar, cache_prompt), as openai.py
        return out

    async def served_model(self) -> str:
        reply = await self._request("GET", "/v1/models", None)
        try:
            return str(reply["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{self.base_url}/v1/models listed no model: {str(reply)[:300]}") from None

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        import httpx

        if self._client is None:
            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s, headers=headers)
        try:
            resp = await self._client.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise BackendError(f"{self.base_url}{path}: cannot reach the server: {type(e).__name__}: {e}") from None
        if resp.status_code != 200:
            raise BackendError(f"{self.base_url}{path}: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            return resp.json()
        except ValueError:
            raise BackendError(f"{self.base_url}{path}: not JSON: {resp.text[:300]}") from None

    async def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                await client.aclose()
            except RuntimeError:  # its event loop is already closed
                pass


def _wire(message: dict[str, Any]) -> dict[str, Any]:
    """A conversation message as the chat API takes it (tool-call arguments as a JSON string)."""
    out = {k: v for k, v in message.items() if k in ("role", "content", "name", "tool_call_id", "tool_calls")}
    if out.get("tool_calls"):
        calls = []
        for call in out["tool_calls"]:
            fn = dict(call.get("function", {}))
            if not isinstance(fn.get("arguments"), str):
                fn["arguments"] = json.dumps(fn.get("arguments") or {})
            calls.append({"id": call.get("id", ""), "type": "function", "function": fn})
        out["tool_calls"] = calls
    if out.get("content") is None:
        out["content"] = ""
    return out


def parse_reply(reply: Any) -> tuple[Action, str]:
    """A chat completion -> (the action, ``"stop"`` or ``"length"``)."""
    try:
        choice = reply["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise BackendError(f"not a chat completion: {str(reply)[:300]}") from None
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        fn = call.get("function") or {}
        args = fn.get("arguments") or "{}"
        try:
            parsed = json.loads(args) if isinstance(args, str) else dict(args)
        except ValueError:
            parsed = {"_raw": args}  # the env sees (and can reject) a malformed call, as with a local model
        calls.append(ToolCall(str(fn.get("name", "")), parsed if isinstance(parsed, dict) else {"_raw": parsed},
                              id=str(call.get("id") or f"call_{i}")))
    finish = "length" if choice.get("finish_reason") == "length" else "stop"
    return Action(text=message.get("content") or "", tool_calls=calls), finish
