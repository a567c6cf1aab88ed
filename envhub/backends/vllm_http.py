"""vLLM's own RL routes, wired to envhub: per-token versions from the server, pause / resume driven on the server.

Two pieces, for a ``vllm serve`` started with ``VLLM_SERVER_DEV_MODE=1`` (which registers vLLM's RL router,
``vllm/entrypoints/rl/online/api_router.py``, and the dev router with ``/collective_rpc``)::

    backend = VLLMGenerateBackend("http://127.0.0.1:8000")        # token ids in, ids + logprobs + versions out
    lc = lifecycle_of(backend)
    lc.add_engine(VLLMServerControl("http://127.0.0.1:8000"))     # the server's version := lc.version
    gen = await generate_tagged(backend, prompt_ids, params)      # in a rollout
    ...
    lc.pause(mode="abort")                                        # POST /pause?mode=abort (hold: mode=keep)
    control.reload_weights("/ckpt/step-7")                        # POST /collective_rpc reload_weights
    lc.resume(version=7)                                          # POST /update_weight_version 7, POST /resume

* :class:`VLLMGenerateBackend` posts to ``/inference/v1/generate`` (vLLM's token-in / token-out route, registered
  with or without dev mode): ``token_ids`` in, ``choices[0].token_ids`` out, ``logprobs.content[i].logprob`` the
  sampled token's raw logprob (``sampling_params.logprobs = 0``; the same numbers ``/v1/completions`` gives), and
  ``weight_versions``: contiguous ``{version, start, end}`` spans over the output tokens, the server's own tag of
  the weights that sampled each token. They become ``Generation.versions``, one per token. Spans that do not cover
  the tokens exactly, a tag that is not an integer (vLLM's ``"default"``: nobody set a version) and a tag outside
  the versions the lifecycle declared during the call are :class:`VersionMismatch` (a ``BackendError``), never a
  silent drift. vLLM's ``finish_reason: "abort"`` (a ``/pause?mode=abort``) is passed on as ``"abort"``, so
  :func:`~envhub.backends.lifecycle.generate_tagged` re-sends prompt + partial output after the resume.
* :class:`VLLMServerControl` is the lifecycle's hook on one server (``WeightLifecycle.add_engine``): ``pause`` →
  ``POST /pause?mode=abort|keep``, ``resume(version)`` → ``POST /update_weight_version`` then ``POST /resume``.
  Every call is bounded (``timeout_s``); a server that does not answer is a :class:`LifecycleError`. A server
  without dev mode has no ``/is_paused`` route: ``add_engine`` refuses it at once (use the plain drained
  lifecycle there, which needs no server route). ``reload_weights(path)`` is the weight change that works on a CPU
  server: vLLM's worker ``reload_weights`` through ``/collective_rpc`` loads a checkpoint directory in place
  (vLLM's weight-transfer engines, NCCL and CUDA IPC, need CUDA). On GPUs a trainer uses
  ``/start_weight_update`` → ``/update_weights`` → ``/finish_weight_update`` instead; the pause / version / resume
  around it are the same.

httpx is imported lazily, as in :mod:`envhub.backends.openai`.
"""
from __future__ import annotations

from typing import Any

from envhub.backends.base import BackendError, Generation, SamplingParams
from envhub.backends.lifecycle import LifecycleError, lifecycle_of
from envhub.backends.openai import OpenAIBackend, _float, _short, vllm_sampling_fields

SERVER_MODES = {"abort": "abort", "hold": "keep"}  # envhub's pause mode -> vLLM's /pause?mode=


class VersionMismatch(BackendError):
    """The server's per-token version tags do not fit the reply or the versions envhub's lifecycle declared."""


class VLLMGenerateBackend(OpenAIBackend):
    """A client of vLLM's ``/inference/v1/generate`` (module docstring).

    Args:
        base_url: the server root.
        server_versions: read the server's ``weight_versions`` into ``Generation.versions`` (default). ``False``
            leaves ``versions`` to the lifecycle (a server nobody tells its version, e.g. without dev mode).
        kwargs: as :class:`~envhub.backends.openai.OpenAIBackend` (``api_key``, ``timeout``, ...).
    """

    name = "vllm-generate"

    def __init__(self, base_url: str, model: str | None = None, *, server_versions: bool = True, **kwargs: Any):
        super().__init__(base_url, model, **kwargs)
        self.server_versions = server_versions

    def __repr__(self) -> str:
        return f"VLLMGenerateBackend({self.base_url!r})"

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, session_id: str = "") -> Generation:
        prompt_ids = [int(t) for t in prompt_ids]
        lc = lifecycle_of(self)
        low = lc.version  # read before the request: no tag of this reply may be older than the version it entered
        reply = await self._post("/inference/v1/generate", self.generate_body(prompt_ids, params))
        return self.parse_generate(reply, prompt_ids, versions=(low, lc.version) if self.server_versions else None)

    def generate_body(self, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {"token_ids": prompt_ids, "sampling_params": vllm_sampling_fields(params),
                                "return_token_ids": True}
        if self.model is not None:
            body["model"] = self.model
        return body

    def parse_generate(self, reply: Any, prompt_ids: list[int], *,
                       versions: tuple[int, int] | None = None) -> Generation:
        """The reply as a :class:`Generation`. ``versions = (low, high)``: read the server's spans, each tag an
        integer in ``[low, high]`` (the lifecycle's version when the call entered, and when it returned)."""
        try:
            choice = reply["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{self.base_url}: reply has no choices: {_short(reply)}") from None
        ids = [int(t) for t in choice.get("token_ids") or []]
        echoed = reply.get("prompt_token_ids")
        if echoed is not None and list(echoed) != prompt_ids:
            raise BackendError(f"{self.base_url}: the server changed the prompt ids (sent {len(prompt_ids)}, "
                               f"echoed {len(echoed)}); refusing a trajectory whose prompt is not what was sent")
        content = (choice.get("logprobs") or {}).get("content")
        if content is None or len(content) != len(ids) or any(int(c["token_id"]) != t for c, t in zip(content, ids)):
            raise BackendError(f"{self.base_url}: expected one logprob entry per token id ({len(ids)}), got "
                               f"{None if content is None else len(content)}: {_short(choice)}")
        reason = choice.get("finish_reason")
        finish = "abort" if reason == "abort" else "length" if reason == "length" else "stop"
        tags = None if versions is None else spans_to_versions(choice.get("weight_versions"), len(ids), *versions,
                                                               where=self.base_url)
        return Generation(ids, [_float(c["logprob"]) for c in content], finish, versions=tags)


def spans_to_versions(spans: Any, n: int, low: int, high: int, *, where: str = "server") -> list[int]:
    """vLLM's ``weight_versions`` spans (``[{version, start, end}]``, contiguous over output-token indexes) as one
    integer version per token. Refused (:class:`VersionMismatch`): spans missing while tokens came back, a gap, an
    overlap, an empty span, spans that stop short of or run past the ``n`` tokens, a tag that is not an integer,
    a tag outside ``[low, high]`` (older than the version the call entered under, or newer than any version the
    lifecycle has declared: the server and envhub disagree on which weights these are)."""
    if n == 0 and not spans:
        return []
    if not isinstance(spans, list) or not spans:
        raise VersionMismatch(f"{where}: {n} tokens but no weight_versions spans (is this vLLM's "
                              "/inference/v1/generate, >= 0.32?)")
    out: list[int] = []
    for span in spans:
        try:
            version, start, end = span["version"], int(span["start"]), int(span["end"])
        except (KeyError, TypeError, ValueError):
            raise VersionMismatch(f"{where}: malformed weight_versions span {span!r}") from None
        if start != len(out) or end <= start:
            raise VersionMismatch(f"{where}: weight_versions spans are not contiguous from 0: {_short(spans)}")
        try:
            v = int(version)
        except (TypeError, ValueError):
            raise VersionMismatch(
                f"{where}: the server tags tokens with weight version {version!r}, not an integer: nobody told it "
                "envhub's version (WeightLifecycle.add_engine(VLLMServerControl(url)) does, at attach and on "
                "every resume)") from None
        if not low <= v <= high:
            raise VersionMismatch(f"{where}: the server tagged tokens {start}..{end - 1} with version {v}, but the "
                                  f"lifecycle's version was {low} when the call entered and {high} when it "
                                  "returned: the server's weights and envhub's tags disagree")
        out += [v] * (end - start)
    if len(out) != n:
        raise VersionMismatch(f"{where}: weight_versions cover {len(out)} tokens, the reply has {n}")
    return out


class VLLMServerControl:
    """The weight-update lifecycle's hook on one vLLM server's own routes (module docstring).

    Args:
        base_url: the server root (dev mode: ``VLLM_SERVER_DEV_MODE=1``).
        timeout_s: the longest one control call may take (pause, version, resume): past it, :class:`LifecycleError`.
        reload_timeout_s: the longest :meth:`reload_weights` may take (a checkpoint load).
        keep_kv: on resume, keep the KV computed under the old weights (vLLM's plain ``keep``; see :meth:`resume`).
    """

    def __init__(self, base_url: str, *, timeout_s: float = 30.0, reload_timeout_s: float = 600.0,
                 keep_kv: bool = False, api_key: str | None = None):
        url = base_url.rstrip("/")
        self.base_url = url[: -len("/v1")] if url.endswith("/v1") else url
        self.timeout_s = float(timeout_s)
        self.reload_timeout_s = float(reload_timeout_s)
        self.keep_kv = keep_kv
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def __repr__(self) -> str:
        return f"VLLMServerControl({self.base_url!r})"

    # ---- what WeightLifecycle calls ----------------------------------------------------------------------------
    def check(self) -> None:
        """The server has vLLM's RL routes (dev mode), else :class:`LifecycleError` saying so."""
        self.is_paused()

    def pause(self, mode: str, timeout_s: float | None = None) -> None:
        """``POST /pause?mode=abort`` (in-flight requests return their partial output, ``finish_reason: abort``)
        or ``?mode=keep`` for ``hold`` (requests are frozen in the scheduler, KV cache kept)."""
        if mode not in SERVER_MODES:
            raise LifecycleError(f"pause mode must be one of {tuple(SERVER_MODES)}, got {mode!r}")
        # clear_cache=true: vLLM 0.32 then preempts the frozen requests (their KV is recomputed on resume, under the
        # new weights) and empties the prefix cache; false is vLLM's old keep (stale KV), kept for keep_kv=True
        clear = "false" if self.keep_kv else "true"
        self._call("POST", f"/pause?mode={SERVER_MODES[mode]}&clear_cache={clear}", None, timeout_s)

    def set_version(self, version: int, timeout_s: float | None = None) -> None:
        """``POST /update_weight_version``: the tag the server puts on every token sampled from now on."""
        self._call("POST", "/update_weight_version", {"new_version": str(int(version))}, timeout_s)

    def resume(self, timeout_s: float | None = None) -> None:
        """``POST /reset_prefix_cache?reset_running_requests=true`` then ``POST /resume``. The reset preempts the
        requests frozen by a ``keep`` pause (vLLM recomputes their KV from prompt + output so far, under the new
        weights) and empties the prefix cache, whose blocks the old weights computed: without it every token after
        the update attends to stale keys and values. vLLM 0.32's ``/pause?mode=keep&clear_cache=true`` already
        does the same at pause time, but its ``clear_cache`` is marked deprecated and documented as ignored in
        keep mode; the explicit reset keeps the guarantee if that changes. ``keep_kv=True`` skips both (vLLM's
        old keep: no recompute, tokens after the update are not exactly any version's; measured in the tier)."""
        if not self.keep_kv:
            reply = self._call("POST", "/reset_prefix_cache?reset_running_requests=true", None, timeout_s)
            if not (reply or {}).get("success", False):
                raise LifecycleError(f"{self.base_url}/reset_prefix_cache: the server could not drop its KV cache "
                                     f"({reply}); resume again, or pass keep_kv=True to accept stale KV")
        self._call("POST", "/resume", None, timeout_s)

    # ---- for the trainer and the checks ------------------------------------------------------------------------
    def is_paused(self) -> bool:
        return bool(self._call("GET", "/is_paused", None, None)["is_paused"])

    def weight_version(self) -> str:
        return str(self._call("GET", "/weight_info", None, None)["weight_version"])

    def reload_weights(self, weights_path: str) -> None:
        """Load the checkpoint directory ``weights_path`` into the running server, in place (vLLM's worker
        ``reload_weights`` over ``/collective_rpc``): the weight change that works on a CPU server. Call it between
        ``pause`` and ``resume``."""
        self._call("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(weights_path)}},
                   self.reload_timeout_s)

    def _call(self, method: str, path: str, body: dict[str, Any] | None, timeout_s: float | None) -> Any:
        import httpx

        url = self.base_url + path
        timeout = self.timeout_s if timeout_s is None else max(0.1, float(timeout_s))
        try:
            resp = httpx.request(method, url, json=body, headers=self.headers, timeout=timeout)
        except httpx.TimeoutException:
            raise LifecycleError(f"{url}: the vLLM server did not answer within {timeout:g}s") from None
        except httpx.HTTPError as e:
            raise LifecycleError(f"{url}: cannot reach the vLLM server: {type(e).__name__}: {e}") from None
        if resp.status_code == 404:
            raise LifecycleError(f"{url}: no such route (404): vLLM registers its RL routes (/pause, /resume, "
                                 "/update_weight_version, /collective_rpc) only with VLLM_SERVER_DEV_MODE=1; start "
                                 "the server so, or leave it out of the lifecycle's engines (it is then drained)")
        if resp.status_code >= 400:
            raise LifecycleError(f"{url}: HTTP {resp.status_code}: {resp.text[:300]}")
        try:
            return resp.json() if resp.content else None
        except ValueError:
            return None
