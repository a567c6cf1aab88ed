"""Provider dialects: each module turns its wire format into a :class:`~envhub.gateway.core.ChatRequest` and a
:class:`~envhub.gateway.core.ChatResult` back into the provider's reply, its SSE event sequence and its error shape.

=============  ==========================================  ====================================================
module         routes                                      used by (docs/gateway.md)
=============  ==========================================  ====================================================
``chat``       ``/v1/chat/completions``                    mini-swe-agent, Qwen Code, opencode, LangChain, SDKs
``responses``  ``/v1/responses``                           Codex CLI, OpenAI Agents SDK (default), opencode
``anthropic``  ``/v1/messages``, ``/v1/messages/count_tokens``  Claude Code, the anthropic SDK
``gemini``     ``/v1beta/models/M:generateContent`` (and      Gemini CLI, ``google-genai``
               ``:streamGenerateContent``, ``:countTokens``)
=============  ==========================================  ====================================================

Streaming is synthetic: one backend call, then the provider's exact event sequence in one burst (what AReaL, Polar
and verifiers do, and what every probed harness accepted).
"""
from __future__ import annotations

import json
from typing import Any

from envhub.backends.base import SamplingParams
from envhub.gateway.messages import BadRequest


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()


def number(body: dict[str, Any], name: str, default: float, *, lo: float, hi: float) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
        raise BadRequest(f"{name} must be a number in [{lo}, {hi}], got {v!r}", param=name)
    return float(v)


def sampling(body: dict[str, Any], max_tokens_names: tuple[str, ...], stop_name: str) -> tuple[SamplingParams, bool]:
    """Sampling parameters common to all dialects; ``(params, whether the request named a token budget)``."""
    max_tokens, given = 1, False
    for name in max_tokens_names:
        v = body.get(name)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise BadRequest(f"{name} must be a positive integer, got {v!r}", param=name)
            max_tokens, given = v, True
            break
    stop = body.get(stop_name)
    stop = [stop] if isinstance(stop, str) else stop
    if stop is not None and (not isinstance(stop, list) or not all(isinstance(s, str) for s in stop)):
        raise BadRequest(f"{stop_name} must be a string or a list of strings", param=stop_name)
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("seed must be an integer", param="seed")
    params = SamplingParams(max_tokens=max_tokens, temperature=number(body, "temperature", 1.0, lo=0.0, hi=2.0),
                            top_p=number(body, "top_p", 1.0, lo=0.0, hi=1.0), stop=list(stop or []), seed=seed)
    top_k = body.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int):
            raise BadRequest("top_k must be an integer", param="top_k")
        params.top_k = top_k
    return params, given


def refuse_choices(body: dict[str, Any]) -> None:
    """What the gateway cannot honour with one exact-token sample is refused, not silently ignored."""
    n = body.get("n", 1)
    if n not in (None, 1):
        raise BadRequest(f"n={n!r} is not supported: the gateway records one sampled completion per call; send n "
                         "separate requests", param="n")
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else choice
    if kind in ("required", "any", "tool", "function", "allowed_tools", "custom"):
        raise BadRequest(f"tool_choice={json.dumps(choice)} is not supported: the model samples freely and the "
                         "gateway parses what it wrote (use \"auto\" or \"none\")", param="tool_choice")
