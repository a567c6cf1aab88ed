"""envhub's ``hf`` backend on a GPU: through the backend, the executor and the gateway vs raw ``transformers``
``generate`` on the same prompts, in one run (ratios; absolute times are per machine).

    python benchmarks/gpu_backend.py [--device cuda] [--batch 32] [--tokens 128] [--layers 24] [--hidden 896]

The model is a random Qwen2 of Qwen2.5-0.5B's shape (24 layers, hidden 896; the tiny tokenizer's 706-token
vocabulary, so the embedding is small), built here (no model hub), in bfloat16. Rows:

* ``raw generate``: ``model.generate`` on the left-padded batch, greedy, ``min_new_tokens = max_new_tokens`` (every
  row decodes the same number of tokens), logits kept for logprobs: the baseline;
* ``envhub backend``: ``HFBackend.generate`` for every prompt at once (the micro-batcher forms the batch), greedy,
  ``ignore_eos``, through ``generate_tagged`` (the weight-version lifecycle, as the executor calls it);
* ``envhub executor``: one-turn guess-number episodes (render, generate, decode, env step, verifier) on the same
  backend, against the backend alone on those episodes' own prompts;
* ``envhub gateway``: chat completions over HTTP on loopback, against the backend alone on the prompts the gateway
  rendered, each with the number of tokens its call sampled.

What this cannot show: vLLM (not on the GPU image, and its wheels exceed what can be carried there).
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import time


def build_model(root: str, layers: int, hidden: int, device: str) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    from envhub.testing.models import build_tiny_model

    path = build_tiny_model(root, template="chatml")
    cfg = AutoConfig.from_pretrained(path)
    cfg.num_hidden_layers, cfg.hidden_size = layers, hidden
    cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads = hidden * 54 // 10, 14, 2
    cfg.head_dim = hidden // 14
    cfg.max_position_embeddings = 4096
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = ["full_attention"] * layers
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return str(path)


def prompts(tokenizer, n: int) -> list[list[int]]:
    from envhub.codec.chat import ChatCodec

    codec = ChatCodec(tokenizer)
    return [list(codec.prompt_ids([{"role": "user", "content": f"Tell me a story about the number {i}."}]))
            for i in range(n)]


def raw_generate(model, tokenizer, batch: list[list[int]], tokens: int, device: str) -> float:
    import torch

    width = max(map(len, batch))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
    sync(device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=pad)
        logits = torch.stack(out.logits, 1).float()
        torch.log_softmax(logits, -1).gather(-1, out.sequences[:, width:, None])
    sync(device)
    return time.perf_counter() - t0


def sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


async def backend_generate(backend, batch, tokens) -> float:
    from envhub.backends.base import SamplingParams
    from envhub.backends.lifecycle import generate_tagged

    params = SamplingParams(max_tokens=tokens, temperature=0.0, extra={"ignore_eos": True})
    t0 = time.perf_counter()
    await asyncio.gather(*(generate_tagged(backend, p, params, session_id=f"b{i}") for i, p in enumerate(batch)))
    return time.perf_counter() - t0


async def executor_run(backend, tokenizer, n, tokens):
    import envhub
    from envhub.backends.base import SamplingParams
    from envhub.rollout.executor import RolloutConfig, rollout

    spec = envhub.get_spec("guess-number")
    try:
        tasks = [dict(t) for t in spec.load_tasks()]
    except ModuleNotFoundError:  # no `datasets` on the GPU image: read the env's JSONL itself
        import json

        import envhub_guess_number as g

        lines = (g.DATA / f"{spec.default_split}.jsonl").read_text().splitlines()
        tasks = [json.loads(line) for line in lines if line.strip()]
    cfg = RolloutConfig(max_turns=1, sampling=SamplingParams(max_tokens=tokens, temperature=0.0,
                                                             extra={"ignore_eos": True}))
    t0 = time.perf_counter()
    trajs = await asyncio.gather(*(rollout(spec, tasks[i % len(tasks)], backend, tokenizer, cfg, session_id=f"e{i}")
                                   for i in range(n)))
    return time.perf_counter() - t0, [t.prompt_ids for t in trajs]


def gateway_run(backend, tokenizer, n, tokens):
    import httpx

    from envhub.gateway import Gateway, GatewayThread

    gw = Gateway(backend, tokenizer)
    sessions = [gw.start_session(f"g{i}") for i in range(n)]
    with GatewayThread(gw) as srv:
        async def go():
            async with httpx.AsyncClient(base_url=srv.url, timeout=600) as c:
                async def one(i):
                    r = await c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {sessions[i].api_key}"},
                                     json={"model": "m", "max_tokens": tokens, "temperature": 0,
                                           "messages": [{"role": "user", "content": f"Tell me a story about {i}."}]})
                    r.raise_for_status()
                t0 = time.perf_counter()
                await asyncio.gather(*(one(i) for i in range(n)))
                return time.perf_counter() - t0
        elapsed = asyncio.run(go())
    calls = [c for s in sessions for c in s.calls if c.ok]
    return elapsed, [(c.prompt_ids, len(c.sampled_ids)) for c in calls]


async def backend_exact(backend, work) -> float:
    from envhub.backends.base import SamplingParams

    from envhub.backends.lifecycle import generate_tagged

    t0 = time.perf_counter()
    await asyncio.gather(*(generate_tagged(backend, p, SamplingParams(max_tokens=k, temperature=0.0),
                                           session_id=f"x{i}") for i, (p, k) in enumerate(work)))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=896)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--root", default="/tmp/envhub-gpu-bench")
    a = ap.parse_args()
    import torch

    from envhub.backends.hf import HFBackend
    from envhub.testing.models import load_tokenizer

    path = build_model(a.root, a.layers, a.hidden, a.device)
    tok = load_tokenizer(path)
    dtype = "bfloat16" if a.device.startswith("cuda") else "float32"
    backend = HFBackend(path, dtype=dtype, device=a.device, max_batch_size=a.batch, batch_window_s=0.005,
                        attn_implementation="sdpa" if a.device.startswith("cuda") else "eager")
    model = backend.model  # the same weights for the baseline
    if a.device.startswith("cuda"):
        print("device:", torch.cuda.get_device_name(0))
    batch = prompts(tok, a.batch)
    rows: dict[str, list[float]] = {k: [] for k in ("raw", "backend", "executor", "exec_backend", "gateway",
                                                     "gw_backend")}
    raw_generate(model, tok, batch, 8, a.device)  # warm-up
    asyncio.run(backend_generate(backend, batch, 8))
    for _ in range(a.repeats):  # interleaved, so drift hits every row alike
        rows["raw"].append(raw_generate(model, tok, batch, a.tokens, a.device))
        rows["backend"].append(asyncio.run(backend_generate(backend, batch, a.tokens)))
        ex, ex_prompts = asyncio.run(executor_run(backend, tok, a.batch, a.tokens))
        rows["executor"].append(ex)
        rows["exec_backend"].append(asyncio.run(backend_generate(backend, ex_prompts, a.tokens)))
        gw, work = gateway_run(backend, tok, a.batch, a.tokens)
        rows["gateway"].append(gw)
        rows["gw_backend"].append(asyncio.run(backend_exact(backend, work)))
        print("repeat:", {k: round(v[-1], 4) for k, v in rows.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    n_tok = a.batch * a.tokens
    print(f"model: {a.layers} layers, hidden {a.hidden}, {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M "
          f"params, {dtype}; batch {a.batch} x {a.tokens} tokens; median of {a.repeats}")
    print(f"raw transformers generate   {med['raw']:.3f} s  {n_tok / med['raw']:8.0f} tok/s")
    print(f"envhub hf backend           {med['backend']:.3f} s  {n_tok / med['backend']:8.0f} tok/s  "
          f"ratio vs raw {med['raw'] / med['backend']:.2f}x")
    print(f"envhub executor (1 turn)    {med['executor']:.3f} s  vs backend alone on its prompts "
          f"{med['exec_backend']:.3f} s: overhead x{med['executor'] / med['exec_backend']:.3f}")
    print(f"envhub gateway (HTTP chat)  {med['gateway']:.3f} s  vs backend alone on its prompts "
          f"{med['gw_backend']:.3f} s: overhead x{med['gateway'] / med['gw_backend']:.3f}")


if __name__ == "__main__":
    main()
