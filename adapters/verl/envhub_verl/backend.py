"""An envhub :class:`~envhub.backends.base.LLMBackend` over veRL's LLM server manager.

veRL hands every agent loop a ``server_manager`` (``verl.workers.rollout.llm_server.LLMServerClient``) whose
``await generate(request_id, prompt_ids=..., sampling_params=...) -> TokenOutput`` routes a request to one of the
vLLM/SGLang replicas. Its load balancer is *sticky* on ``request_id``: every request with the same id goes to the
same replica, so the replica's prefix cache holds the conversation. This backend therefore uses one request id per
trajectory, the executor's ``session_id``, for every turn.

Per turn it sends veRL's own sampling params (temperature, top-p/k, repetition penalty from the trainer config)
plus ``max_tokens`` (the executor's remaining budget, which veRL's server honours as given), ``logprobs=True``, and
envhub's stop strings / stop token ids / seed when set. ``TokenOutput`` has no finish reason for a length stop
(veRL maps vLLM's ``"stop"`` and ``"length"`` both to ``"completed"``), so a turn that filled ``max_tokens``
without ending on an end-of-turn token is reported as ``"length"``. An aborted request raises
:class:`~envhub.backends.base.BackendError`: the rollout becomes a marked failure.
"""
from __future__ import annotations

from typing import Any

from envhub.backends.base import BackendError, Generation, LLMBackend, SamplingParams


class VerlServerBackend(LLMBackend):
    """Samples through veRL's ``server_manager.generate`` (see the module docstring).

    Args:
        server_manager: the agent loop's ``self.server_manager``.
        sampling_params: veRL's per-sample sampling dict (what ``AgentLoopBase.run`` receives).
    """

    name = "verl"

    def __init__(self, server_manager: Any, sampling_params: dict[str, Any]):
        self.server_manager = server_manager
        self.base = dict(sampling_params)
        self._eos: dict[str, set[int]] = {}

    def open_session(self, session_id: str, *, task: Any = None, messages: list | None = None, codec: Any = None):
        # the codec knows which ids end an assistant turn: needed to tell a length stop from a natural one
        self._eos[session_id] = set(getattr(codec, "eos_token_ids", None) or [])

    def close_session(self, session_id: str) -> None:
        self._eos.pop(session_id, None)

    def request_params(self, params: SamplingParams) -> dict[str, Any]:
        sp = dict(self.base)
        sp["max_tokens"] = int(params.max_tokens)
        sp["logprobs"] = True
        if params.stop:
            sp["stop"] = list(params.stop)
        if params.stop_token_ids:
            sp["stop_token_ids"] = sorted(set(sp.get("stop_token_ids") or []) | set(params.stop_token_ids))
        if params.seed is not None:
            sp["seed"] = params.seed
        return sp

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, session_id: str = "") -> Generation:
        out = await self.server_manager.generate(request_id=session_id, prompt_ids=list(prompt_ids),
                                                 sampling_params=self.request_params(params))
        stop = getattr(out, "stop_reason", None)
        if stop in ("aborted", "abort"):
            raise BackendError(f"veRL's rollout server aborted the request of session {session_id!r}")
        ids = [int(t) for t in out.token_ids]
        logprobs = [float(x) for x in out.log_probs] if out.log_probs else [0.0] * len(ids)
        if len(logprobs) != len(ids):
            raise BackendError(f"veRL returned {len(ids)} token ids but {len(logprobs)} logprobs")
        ended = bool(ids) and ids[-1] in self._eos.get(session_id, set())
        length = stop == "length" or (len(ids) >= params.max_tokens and not ended)
        # the server's own weight version (veRL's `global_steps`), when it reports one: the tag comes from the engine
        steps = (getattr(out, "extra_fields", None) or {}).get("global_steps")
        versions = [int(steps)] * len(ids) if isinstance(steps, int) and not isinstance(steps, bool) else None
        return Generation(ids, logprobs, "length" if length else "stop", versions=versions)
