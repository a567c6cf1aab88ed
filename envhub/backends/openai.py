"""The ``openai`` backend: any OpenAI-compatible server that takes and returns token ids (vLLM, SGLang).

::

    backend = OpenAIBackend("http://127.0.0.1:8000")                    # vLLM: /v1/completions
    backend = OpenAIBackend("http://127.0.0.1:30000", api="sglang")     # SGLang: /generate
    gen = await backend.generate(prompt_ids, SamplingParams(), session_id="r1")

Token ids travel both ways, so nothing is ever re-tokenized:

* **vLLM** ``POST /v1/completions`` with ``prompt`` = the list of ids, ``return_token_ids: true`` and
  ``logprobs: 0`` (the sampled token's logprob only). The reply's ``choices[0].token_ids`` are the sampled ids
  exactly (EOS included when sampled, although ``text`` omits it; a stop string cuts ``text`` but not
  ``token_ids``), ``choices[0].logprobs.token_logprobs`` one logprob per id, and ``prompt_token_ids`` echoes the
  prompt (checked: a server that altered the prompt is an error, not a silent drift). These are vLLM's default
  "raw" logprobs: ``log_softmax`` of the raw logits, before temperature / top-k / top-p.
* **SGLang** ``POST /generate`` with ``input_ids`` and ``return_logprob: true``; ids and logprobs come from
  ``meta_info.output_token_logprobs`` (``[logprob, id, text]`` triples), the reason from
  ``meta_info.finish_reason.type``.

One ``httpx.AsyncClient`` per event loop keeps connections alive across turns (the pool keeps a rollout on one server,
so its requests reuse one warm connection). Failures become :class:`~envhub.backends.base.BackendError` carrying the
server's own message, which tells the pool to move the rollout to another server. httpx is imported lazily.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from envhub.backends.base import BackendError, Generation, LLMBackend, SamplingParams

APIS = ("completions", "sglang")
KEEPALIVE_EXPIRY_S = 2.0  # below the servers' own keep-alive timeout (uvicorn's default: 5 s); see _client


class OpenAIBackend(LLMBackend):
    """A token-in/token-out client for a vLLM or SGLang server (see the module docstring).

    Args:
        base_url: the server root, e.g. ``http://127.0.0.1:8000`` (a trailing ``/v1`` is accepted).
        model: the served model name; ``None`` asks the server (``GET /v1/models``, first entry) once.
        api: ``"completions"`` (vLLM's ``/v1/completions``) or ``"sglang"`` (SGLang's ``/generate``).
        api_key: sent as ``Authorization: Bearer ...`` when given.
        timeout: seconds for one request (a long generation on a busy server takes a while).
        max_connections: the connection pool size of the HTTP client.
    """

    name = "openai"

    def __init__(self, base_url: str, model: str | None = None, *, api: str = "completions",
                 api_key: str | None = None, timeout: float = 600.0, max_connections: int = 256):
        if api not in APIS:
            raise ValueError(f"api must be one of {APIS}, got {api!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must start with http:// or https://, got {base_url!r}")
        url = base_url.rstrip("/")
        self.base_url = url[: -len("/v1")] if url.endswith("/v1") else url
        self.address = self.base_url  # the pool names the backend after its address
        self.model = model
        self.api = api
        self.timeout = timeout
        self.max_connections = max_connections
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._clients: dict[int, Any] = {}  # id(event loop) -> httpx.AsyncClient (a client is bound to its loop)

    def __repr__(self) -> str:
        return f"OpenAIBackend({self.base_url!r}, api={self.api!r})"

    # ---- the contract -----------------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, session_id: str = "") -> Generation:
        prompt_ids = [int(t) for t in prompt_ids]
        if self.api == "sglang":
            body = self.sglang_body(prompt_ids, params)
            return self.parse_sglang(await self._post("/generate", body))
        if self.model is None:
            self.model = await self.served_model()
        body = self.completions_body(prompt_ids, params)
        return self.parse_completions(await self._post("/v1/completions", body), prompt_ids)

    async def served_model(self) -> str:
        """The first model the server lists (``GET /v1/models``)."""
        reply = await self._request("GET", "/v1/models", None)
        try:
            return str(reply["data"][0]["id"])
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{self.base_url}/v1/models listed no model: {str(reply)[:300]}") from None

    async def close(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            try:
                await client.aclose()
            except RuntimeError:  # its event loop is already closed: nothing left to release
                pass

    # ---- request bodies ---------------------------------------------------------------------------------------
    def completions_body(self, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        return {"model": self.model, "prompt": prompt_ids, "return_token_ids": True, **vllm_sampling_fields(params)}

    def sglang_body(self, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        sp: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "top_k": params.top_k,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if params.stop:
            sp["stop"] = list(params.stop)
        if params.stop_token_ids:
            sp["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            sp["sampling_seed"] = params.seed
        sp.update(params.extra)
        return {"input_ids": prompt_ids, "sampling_params": sp, "return_logprob": True}

    # ---- reply parsing ----------------------------------------------------------------------------------------
    def parse_completions(self, reply: dict[str, Any], prompt_ids: list[int]) -> Generation:
        try:
            choice = reply["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise BackendError(f"{self.base_url}: reply has no choices: {_short(reply)}") from None
        ids = choice.get("token_ids")
        if ids is None:
            raise BackendError(
                f"{self.base_url}: reply has no token_ids; the server must support return_token_ids "
                f"(vLLM >= 0.10.2): {_short(choice)}"
            )
        echoed = choice.get("prompt_token_ids")
        if echoed is not None and list(echoed) != prompt_ids:
            raise BackendError(f"{self.base_url}: the server changed the prompt ids (sent {len(prompt_ids)}, "
                               f"echoed {len(echoed)}); refusing a trajectory whose prompt is not what was sent")
        lps = (choice.get("logprobs") or {}).get("token_logprobs")
        if lps is None or len(lps) != len(ids):
            raise BackendError(f"{self.base_url}: expected one logprob per token id ({len(ids)}), got "
                               f"{None if lps is None else len(lps)}: {_short(choice)}")
        return Generation([int(t) for t in ids], [_float(x) for x in lps], _finish(choice.get("finish_reason")))

    def parse_sglang(self, reply: Any) -> Generation:
        if isinstance(reply, list):  # a batch endpoint answers a list
            reply = reply[0] if reply else {}
        meta = reply.get("meta_info") if isinstance(reply, dict) else None
        triples = (meta or {}).get("output_token_logprobs")
        if triples is None:
            raise BackendError(f"{self.base_url}: reply has no meta_info.output_token_logprobs: {_short(reply)}")
        ids = [int(t[1]) for t in triples]
        output_ids = reply.get("output_ids")
        if ids and output_ids is not None and list(output_ids)[-len(ids):] != ids:
            raise BackendError(f"{self.base_url}: output_ids disagree with output_token_logprobs")
        reason = (meta.get("finish_reason") or {})
        kind = reason.get("type") if isinstance(reason, dict) else reason
        if kind == "abort":
            raise BackendError(f"{self.base_url}: the server aborted the request: {reason.get('message', reason)}")
        return Generation(ids, [_float(t[0]) for t in triples], _finish(kind))

    # ---- HTTP -------------------------------------------------------------------------------------------------
    def _client(self):
        import httpx

        loop = asyncio.get_running_loop()
        client = self._clients.get(id(loop))
        if client is None or client.is_closed:
            # keep-alive expiry under the servers' own (vLLM's and SGLang's uvicorn: 5 s, httpx's default is also 5 s):
            # a connection reused just as the server closes it fails "Server disconnected without sending a response"
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections,
                                  keepalive_expiry=KEEPALIVE_EXPIRY_S)
            client = httpx.AsyncClient(base_url=self.base_url, headers=self.headers, limits=limits,
                                       timeout=httpx.Timeout(self.timeout, connect=10.0))
            self._clients = {k: c for k, c in self._clients.items() if not c.is_closed}
            self._clients[id(loop)] = client
        return client

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        return await self._request("POST", path, body)

    async def _request(self, method: str, path: str, body: dict[str, Any] | None) -> Any:
        import httpx

        url = self.base_url + path
        try:
            resp = await self._client().request(method, path, json=body)
        except httpx.TimeoutException as e:
            raise BackendError(f"{url}: timed out after {self.timeout:g}s ({type(e).__name__})") from e
        except httpx.HTTPError as e:
            raise BackendError(f"{url}: cannot reach the server: {type(e).__name__}: {e}") from e
        if resp.status_code >= 400:
            raise BackendError(f"{url}: HTTP {resp.status_code}: {_server_message(resp)}")
        try:
            return resp.json()
        except json.JSONDecodeError:
            raise BackendError(f"{url}: reply is not JSON: {resp.text[:300]!r}") from None


def vllm_sampling_fields(params: SamplingParams) -> dict[str, Any]:
    """vLLM's sampling fields for ``params``: the top level of a ``/v1/completions`` body, and the
    ``sampling_params`` object of ``/inference/v1/generate`` (:mod:`envhub.backends.vllm_http`). Each sampled
    token's own raw logprob (``logprobs: 0``: no alternatives) and special tokens kept, so the text and the ids
    agree; ``params.extra`` last, for vLLM's own knobs (``ignore_eos``, ``min_tokens``, ``logit_bias``, ...)."""
    fields: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,
        "logprobs": 0,
        "skip_special_tokens": False,
    }
    if params.seed is not None:
        fields["seed"] = params.seed
    if params.stop:
        fields["stop"] = list(params.stop)
    if params.stop_token_ids:
        fields["stop_token_ids"] = list(params.stop_token_ids)
    fields.update(params.extra)
    return fields


def _server_message(resp: Any) -> str:
    """The error text a vLLM/SGLang/OpenAI server put in its reply (``{"error": {"message"}}``, ``{"message"}``
    or ``{"detail"}``), else the raw body."""
    try:
        data = resp.json()
    except (json.JSONDecodeError, ValueError):
        return resp.text[:500] or resp.reason_phrase
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        for key in ("message", "detail", "error"):
            if data.get(key):
                return str(data[key])
    return _short(data)


def _finish(reason: Any) -> str:
    """vLLM/SGLang's finish reason in our two words: ``"length"`` stays, anything else that ended normally is
    ``"stop"`` (EOS, a stop string, a stop token)."""
    return "length" if reason == "length" else "stop"


def _float(x: Any) -> float:
    # vLLM sends -9999.0 (older) or null for a -inf logprob; keep the number a trainer can still use
    return float("-inf") if x is None else float(x)


def _short(obj: Any, n: int = 300) -> str:
    text = json.dumps(obj, default=str) if not isinstance(obj, str) else obj
    return text if len(text) <= n else text[:n] + "..."
