"""The model API as the seam: an OpenAI/Anthropic-compatible gateway that records exact tokens.

Agents that cannot be rewritten as ``env.step()`` (Codex CLI, Claude Code, mini-swe-agent, apps on the OpenAI
Agents SDK...) all talk to a model over a provider API. Point them at ``envhub gateway`` with a session key and
every call is served by an envhub backend with the exact token record kept; afterwards the session's calls become
trainer-ready :class:`~envhub.rollout.trajectory.Trajectory` objects.

==========================  =========================================================================================
``core``                    :class:`Gateway`: sessions, the exact-token splice, calls to any ``LLMBackend``, rewards
``matching``                does a request extend an earlier call? (echo quirks normalised; never a silent merge)
``messages``                every dialect's conversation as renderable OpenAI chat messages
``dialects``                OpenAI chat / Responses, Anthropic Messages: requests, replies, SSE, error shapes
``builders``                ``per_request`` and ``prefix_merging`` trajectories; outcome or discounted rewards
``areal``                   ``/export_trajectories`` in AReaL's serialized-tensor format
``app`` / ``server``        the ASGI app (routes in :mod:`envhub.gateway.app`), uvicorn on loopback, a test thread
==========================  =========================================================================================

In Python::

    gw = Gateway(backend, tokenizer)
    with GatewayThread(gw) as srv:
        s = gw.start_session("task-1")
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=s.api_key)   # any client, any harness
        ...
        gw.end_session(s)
    trajs = build(s, "prefix_merging")   # -> list[Trajectory]

See ``docs/gateway.md``. Importing this package loads no torch, transformers or HTTP server.
"""
from __future__ import annotations

from envhub.gateway.builders import build, per_request, prefix_merging
from envhub.gateway.core import ChatRequest, ChatResult, Gateway
from envhub.gateway.messages import BadRequest

__all__ = ["BadRequest", "ChatRequest", "ChatResult", "Gateway", "GatewayThread", "build", "per_request",
           "prefix_merging"]


def __getattr__(name: str):
    if name == "GatewayThread":  # imports uvicorn: only when asked for
        from envhub.gateway.server import GatewayThread

        return GatewayThread
    raise AttributeError(name)
