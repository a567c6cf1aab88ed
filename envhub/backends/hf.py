"""The ``hf`` backend: a transformers causal LM on CPU, sampled token by token, batched across rollouts.

::

    backend = HFBackend("path/to/model")              # or make_backend("tiny" | "smollm2" | PATH)
    gen = await backend.generate(prompt_ids, SamplingParams(temperature=0), session_id="r1")

How it works, and why:

* **Token ids in, token ids out.** The prompt ids are fed as they are; the sampled ids come back exactly as drawn,
  EOS included when it was sampled (as vLLM returns them).
* **Sampling as vLLM samples** (:mod:`envhub.backends.sampling`): greedy at ``temperature == 0``, else temperature,
  top-k, top-p and an exponential race drawn from the request's own seeded generator, so ``seed`` reproduces a
  request whatever else shares its batch.
* **Logprobs** (``logprobs_mode``, vLLM's names): ``"raw_logprobs"`` (default, vLLM's default) is
  ``log_softmax`` of the model's raw float32 logits at the step that drew the token, before temperature and
  top-k/top-p: the policy's distribution at temperature 1, the same numbers vLLM returns by default, so the two
  backends can be compared token for token. ``"processed_logprobs"`` is ``log_softmax`` of the processed logits
  (after temperature, top-k, top-p): the distribution the token was actually drawn from (for greedy requests,
  with nothing processed, both modes agree).
* **KV cache.** The prompt is run once, then one token per step reuses the cache.
* **Micro-batching.** Many rollouts share one event loop. Requests are queued; a runner task waits
  ``batch_window_s`` for concurrent requests to arrive, then runs up to ``max_batch_size`` of them as one batch
  (left-padded, explicit position ids so padding changes nothing but float rounding). Requests arriving while a
  batch runs form the next one.
* **Never blocks the event loop.** Model calls run in one dedicated worker thread (one batch at a time: a torch
  model is not safe to call from two threads at once).

Stops: EOS (the tokenizer's and the generation config's ids; ``extra={"ignore_eos": True}`` disables),
``stop_token_ids``, stop strings (cut after the completing token, which is kept), ``max_tokens``
(``finish_reason="length"``), and the model's context length (also ``"length"``).
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envhub.backends.base import Generation, LLMBackend, SamplingParams
from envhub.backends.lifecycle import ABORT, WeightLifecycle, lifecycle_of
from envhub.backends.sampling import LOGPROBS_MODES, StopChecker, make_generator, sample_row

_DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
           "float16": "float16", "fp16": "float16"}


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop


class HFBackend(LLMBackend):
    """A transformers model behind the backend contract (see the module docstring).

    Args:
        model_path: a Hugging Face model directory (``envhub.testing.models.resolve_model`` turns ``"tiny"``/``"smollm2"``
            into one).
        dtype: ``"float32"`` (default: exact logprobs) or ``"bfloat16"`` (faster on CPU).
        device: a torch device string; ``"cpu"`` here.
        max_batch_size: most requests decoded together.
        batch_window_s: how long the runner waits for concurrent requests before starting a batch.
        logprobs_mode: ``"raw_logprobs"`` or ``"processed_logprobs"`` (overridable per request via
            ``params.extra["logprobs_mode"]``).
        attn_implementation: passed to ``from_pretrained``; ``"eager"`` by default because it keeps left-padded
            rows finite (no fully masked softmax rows) and is as fast as SDPA for tiny CPU batches.
        num_threads: when given, ``torch.set_num_threads(num_threads)`` (process-wide). A tiny model gains
            nothing from more threads, and on a busy machine OpenMP threads spinning for a core made it several
            times slower (batch 8 on two loaded cores: two threads against one).
    """

    name = "hf"
    samples_under_lifecycle = True  # stops between tokens on a pause (envhub.backends.lifecycle)

    def __init__(self, model_path: str | Path, *, dtype: str = "float32", device: str = "cpu",
                 max_batch_size: int = 8, batch_window_s: float = 0.002, logprobs_mode: str = "raw_logprobs",
                 attn_implementation: str = "eager", num_threads: int | None = None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {logprobs_mode!r}")
        if num_threads is not None:
            torch.set_num_threads(max(1, int(num_threads)))
        self.model_path = Path(model_path)
        self.device = torch.device(device)
        self.max_batch_size = max(1, int(max_batch_size))
        self.batch_window_s = batch_window_s
        self.logprobs_mode = logprobs_mode
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=getattr(torch, _DTYPES[dtype]), attn_implementation=attn_implementation
        ).to(self.device).eval()
        self.eos_token_ids = self._eos_ids(GenerationConfig)
        cfg = self.model.config
        self.max_context = int(getattr(cfg, "max_position_embeddings", 0) or 0) or None
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else min(self.eos_token_ids or {0}))
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="envhub-hf")
        self._pending: list[_Request] = []
        self._runner: asyncio.Task | None = None
        self._lock = threading.Lock()  # guards _pending against loops in other threads
        self.batches: list[int] = []  # size of every batch run, for tests and benchmarks
        self.tokens_sampled = 0  # every token sampled so far, counted as it is sampled (live tok/s in the CLI)

    def _eos_ids(self, GenerationConfig) -> set[int]:
        ids: set[int] = set()
        for value in (self.tokenizer.eos_token_id, getattr(self.model.config, "eos_token_id", None)):
            ids |= set(value if isinstance(value, (list, tuple)) else [value] if value is not None else [])
        try:
            gen_eos = GenerationConfig.from_pretrained(self.model_path).eos_token_id
        except (OSError, ValueError):
            gen_eos = None
        ids |= set(gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos] if gen_eos is not None else [])
        return {int(i) for i in ids}

    # ---- the contract -----------------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, session_id: str = "") -> Generation:
        prompt_ids = [int(t) for t in prompt_ids]
        self._validate(prompt_ids, params)
        loop = asyncio.get_running_loop()
        request = _Request(prompt_ids, params, loop.create_future(), loop)
        with self._lock:
            self._pending.append(request)
            if self._runner is None or self._runner.done() or self._runner.get_loop() is not loop:
                self._runner = loop.create_task(self._drain())
        return await request.future

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise ValueError("HFBackend.generate needs at least one prompt id")
        bad = [t for t in prompt_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"prompt ids out of the vocabulary (size {self.vocab_size}): {bad[:5]}")
        if self.max_context and len(prompt_ids) >= self.max_context:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens fills the model's context ({self.max_context})")
        if params.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {params.max_tokens}")
        mode = params.extra.get("logprobs_mode", self.logprobs_mode)
        if mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {mode!r}")

    # ---- the micro-batcher ------------------------------------------------------------------------------------
    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(self.batch_window_s)  # let concurrent rollouts enqueue their turns
        while True:
            with self._lock:
                mine = [r for r in self._pending if r.loop is loop and not r.future.done()]
                batch = mine[: self.max_batch_size]
                taken = {id(r) for r in batch}
                self._pending = [r for r in self._pending if id(r) not in taken and not r.future.done()]
            if not batch:
                return
            try:
                results = await loop.run_in_executor(self._executor, self._run_batch, batch)
            except BaseException as e:  # noqa: BLE001 - every waiting rollout must hear about it
                for r in batch:
                    if not r.future.done():
                        r.future.set_exception(e if isinstance(e, Exception) else RuntimeError(repr(e)))
                if not isinstance(e, Exception):
                    raise
                continue
            for r, gen in zip(batch, results):
                if not r.future.done():  # the rollout may have been cancelled meanwhile
                    r.future.set_result(gen)

    def _run_batch(self, batch: list[_Request]) -> list[Generation]:
        """Decode a batch to completion (worker thread), under the weight-update lifecycle: between two tokens a
        pause either holds the batch (then the context is re-run under the new weights, so every token's logprob is
        its tagged version's) or aborts it (each unfinished row returns what it sampled, ``finish_reason="abort"``)."""
        import torch

        lc = lifecycle_of(self)
        version = lc.enter_blocking()
        try:
            return self._decode(batch, lc, version, torch)
        finally:
            lc.exit()

    def _prefill(self, batch: list[_Request], out_ids: list[list[int]], torch: Any) -> tuple[Any, Any, Any]:
        """Run every row's prompt + what it sampled so far (left padded: each row's next token sits at the last
        column); returns the model output, the attention mask and the last positions."""
        rows = [r.prompt_ids + out for r, out in zip(batch, out_ids)]
        n, width = len(rows), max(len(row) for row in rows)
        ids = torch.full((n, width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((n, width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, width - len(row):] = torch.tensor(row)
            mask[i, width - len(row):] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        dev = self.device
        step = self.model(input_ids=ids.to(dev), attention_mask=mask.to(dev), position_ids=positions.to(dev),
                          use_cache=True)
        return step, mask, positions[:, -1:]

    def _decode(self, batch: list[_Request], lc: WeightLifecycle, version: int, torch: Any) -> list[Generation]:
        self.batches.append(len(batch))
        n = len(batch)
        checkers, generators, modes = [], [], []
        for r in batch:
            limit = r.params.max_tokens
            if self.max_context:
                limit = min(limit, self.max_context - len(r.prompt_ids))
            checkers.append(StopChecker(self.tokenizer, self.eos_token_ids, r.params, limit))
            generators.append(make_generator(r.params.seed))
            modes.append(r.params.extra.get("logprobs_mode", self.logprobs_mode))
        out_ids: list[list[int]] = [[] for _ in batch]
        out_lps: list[list[float]] = [[] for _ in batch]
        out_versions: list[list[int]] = [[] for _ in batch]
        finish: list[str | None] = [None] * n

        with torch.inference_mode():
            dev = self.device
            step, mask, positions = self._prefill(batch, out_ids, torch)
            while True:
                logits = step.logits[:, -1, :].float().cpu()
                next_tokens = []
                for i, r in enumerate(batch):
                    if finish[i] is not None:
                        next_tokens.append(self.pad_token_id)  # a finished row rides along until the batch ends
                        continue
                    tok, lp = sample_row(logits[i], r.params, generators[i], modes[i])
                    out_ids[i].append(tok)
                    out_lps[i].append(lp)
                    out_versions[i].append(version)
                    self.tokens_sampled += 1
                    finish[i] = checkers[i](out_ids[i])
                    next_tokens.append(tok)
                if all(f is not None for f in finish):
                    break
                event = lc.checkpoint()
                if event == ABORT:
                    finish = [f or ABORT for f in finish]
                    break
                if event is not None:  # held, then resumed: the next token is the new weights' (context re-run)
                    version = int(event)
                    step, mask, positions = self._prefill(batch, out_ids, torch)
                    continue
                mask = torch.cat([mask, torch.ones((n, 1), dtype=torch.long)], dim=1)
                positions = positions + 1
                step = self.model(input_ids=torch.tensor(next_tokens, device=dev).unsqueeze(1),
                                  attention_mask=mask.to(dev), position_ids=positions.to(dev),
                                  past_key_values=step.past_key_values, use_cache=True)
        return [Generation(out_ids[i], out_lps[i], finish[i] or "length", versions=out_versions[i])
                for i in range(n)]
