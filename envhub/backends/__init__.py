"""LLM backends: token ids in, token ids + logprobs out (contract in :mod:`envhub.backends.base`).

=============  ====================================================================================
``scripted``   a policy played through the real tokenizer: the golden backend (:mod:`.scripted`)
``hf``         transformers on CPU, sampled token by token with a KV cache, micro-batched (:mod:`.hf`)
``openai``     an OpenAI-compatible server returning token ids: vLLM ``/v1/completions``, SGLang ``/generate``
``vllm``       vLLM's in-process ``AsyncLLM`` fed ``TokensPrompt``s (:mod:`.vllm`)
``pool``       many backends behind one: least loaded, sticky per rollout, elastic, failover (:mod:`.pool`)
=============  ====================================================================================

:func:`make_backend` turns the CLI's ``--model`` string into one. Importing this package loads no torch,
transformers, httpx or vllm: each backend imports its heavy dependency when it is built.
"""
from __future__ import annotations

from typing import Any

from envhub.backends.base import BackendError, Generation, LLMBackend, SamplingParams

__all__ = ["BackendError", "Generation", "LLMBackend", "SamplingParams", "make_backend"]


def make_backend(spec: str, *, policy: Any = None, codec: Any = None, **kwargs: Any) -> LLMBackend:
    """Build a backend from a string.

    * ``"golden"``: :class:`~envhub.backends.scripted.ScriptedBackend` playing ``policy`` (the env's golden policy,
      which the caller passes; ``codec`` is an optional default ``ChatCodec``).
    * ``"http://host:port"`` (or ``https://``): :class:`~envhub.backends.openai.OpenAIBackend` on vLLM's
      ``/v1/completions``; ``"sglang+http://host:port"`` uses SGLang's ``/generate``. Several addresses separated
      by commas make a :class:`~envhub.backends.pool.BackendPool` of them.
    * ``"vllm-rl+http://host:port"``: a vLLM server with its RL routes (``VLLM_SERVER_DEV_MODE=1``,
      ``--enable-scale-out``): :class:`~envhub.backends.vllm_http.VLLMGenerateBackend` (the server's own per-token
      versions) with a :class:`~envhub.backends.vllm_http.VLLMServerControl` attached to its lifecycle, so a
      ``pause`` / ``resume`` (the service's or the gateway's ``POST /pause``) pauses and resumes the server itself.
    * ``"chat+http://host:port"``: :class:`~envhub.backends.chat.ChatBackend`, any OpenAI-compatible chat endpoint,
      text only (evaluation, not training; ``api_model=`` names the model to ask for).
    * ``"vllm:MODEL"``: :class:`~envhub.backends.vllm.VLLMBackend` (in-process engine; needs vllm installed).
    * anything else (``"tiny"``, ``"tiny-llama3"``, ``"smollm2"``, a local model directory):
      :class:`~envhub.backends.hf.HFBackend`, the name resolved by :func:`envhub.testing.models.resolve_model`.

    ``kwargs`` go to the backend's constructor. This is the one factory: the CLI (``--model``), the gateway, the
    rollout service (``--backend``, ``POST /add_llm_server``) all build backends here.
    """
    spec = spec.strip()
    if not spec:
        raise ValueError("empty backend spec: use 'golden', a model name/path, or http://host:port")
    if spec == "golden":
        if policy is None:
            raise ValueError("make_backend('golden') needs policy=<the env's golden policy>")
        from envhub.backends.scripted import ScriptedBackend

        return ScriptedBackend(policy, codec=codec, **kwargs)
    if spec.startswith(("chat+http://", "chat+https://")):
        from envhub.backends.chat import ChatBackend

        return ChatBackend(spec[len("chat+"):], kwargs.pop("api_model", None), **kwargs)
    if "," in spec and all(_is_url(s.strip()) for s in spec.split(",")):
        from envhub.backends.pool import BackendPool

        return BackendPool([make_backend(s.strip(), **kwargs) for s in spec.split(",") if s.strip()])
    if _is_url(spec):
        from envhub.backends.openai import OpenAIBackend

        if spec.startswith("sglang+"):
            return OpenAIBackend(spec[len("sglang+"):], api="sglang", **kwargs)
        if spec.startswith("vllm-rl+"):
            from envhub.backends.lifecycle import lifecycle_of
            from envhub.backends.vllm_http import VLLMGenerateBackend, VLLMServerControl

            url = spec[len("vllm-rl+"):]
            backend = VLLMGenerateBackend(url, **kwargs)
            lifecycle_of(backend).add_engine(VLLMServerControl(url))  # checks the routes, sets the version
            return backend
        return OpenAIBackend(spec, **kwargs)
    if spec.startswith("vllm:"):
        from envhub.backends.vllm import VLLMBackend

        return VLLMBackend(_model_dir(spec[len("vllm:"):]), **kwargs)
    from envhub.backends.hf import HFBackend

    return HFBackend(_model_dir(spec), **kwargs)


def _is_url(s: str) -> bool:
    return s.startswith(("http://", "https://", "sglang+http://", "sglang+https://", "vllm-rl+http://",
                         "vllm-rl+https://"))


def _model_dir(name: str) -> str:
    from envhub.testing.models import resolve_model

    return str(resolve_model(name))
