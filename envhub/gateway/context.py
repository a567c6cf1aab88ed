"""How long a prompt the backend can take: the gateway's limit is the smaller of ``--max-model-len`` and this.

A prompt over the backend's real context must be answered with the provider's own context-length error *before* the
backend is called: a backend failure comes back as a 502, which agents retry (Codex CLI five times, then it exits),
whereas ``context_length_exceeded`` (OpenAI) or ``prompt is too long`` (Anthropic) makes them compact their history.
"""
from __future__ import annotations

import json
import urllib.request
from typing import Any


def backend_context(backend: Any) -> int | None:
    """The context length an in-process backend knows (no I/O): a transformers model's ``max_position_embeddings``
    (``HFBackend.max_context``), an in-process vLLM engine's ``max_model_len``, the smallest of a pool's members;
    ``None`` when the backend has no such limit (a scripted policy) or does not say."""
    for name in ("max_context", "max_model_len"):
        n = getattr(backend, name, None)
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    members = getattr(backend, "backends", None)
    if isinstance(members, dict) and members:
        known = [backend_context(b) for b in members.values()]
        return min((k for k in known if k), default=None)
    return None


def server_context(base_url: str, timeout: float = 10.0) -> int | None:
    """The ``max_model_len`` an OpenAI-compatible token server lists for its model (vLLM and SGLang list it in
    ``GET /v1/models``); ``None`` when it does not say or cannot be asked."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/v1/models", timeout=timeout) as r:
            data = json.loads(r.read())["data"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    lens = [m.get("max_model_len") for m in data if isinstance(m, dict)]
    lens = [n for n in lens if isinstance(n, int) and not isinstance(n, bool) and n > 0]
    return min(lens) if lens else None


def effective_limit(flag: int, backend: Any) -> int:
    """``min(flag, the backend's own context)``, asking a token server (``OpenAIBackend``, each member of a pool)
    over HTTP once."""
    known = backend_context(backend)
    members = getattr(backend, "backends", None)
    servers = list(members.values()) if isinstance(members, dict) else [backend]
    for b in servers:
        url = getattr(b, "base_url", None)
        if isinstance(url, str) and url.startswith(("http://", "https://")):
            n = server_context(url)
            if n:
                known = min(known, n) if known else n
    return min(int(flag), known) if known else int(flag)
