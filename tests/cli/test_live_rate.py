"""The CLI's tok/s moves while a generation is still running (a long transformers generation must not look like a
stalled run), counted from the tokens the backend has sampled, not from finished episodes."""
from __future__ import annotations

import threading
import time

import pytest

import envhub
from envhub.backends.base import SamplingParams
from envhub.backends.hf import HFBackend
from envhub.cli.runner import Run
from envhub.rollout.request import RolloutConfig


def test_hf_backend_counts_every_sampled_token(tiny_model_path, tiny_tokenizer):
    import asyncio

    backend = HFBackend(tiny_model_path)
    ids = tiny_tokenizer.encode("hello there")
    gens = asyncio.run(_two(backend, ids))
    assert backend.tokens_sampled == sum(len(g.token_ids) for g in gens) > 0


async def _two(backend, ids):
    import asyncio

    try:
        return await asyncio.gather(backend.generate(ids, SamplingParams(max_tokens=7, seed=1)),
                                    backend.generate(ids, SamplingParams(max_tokens=5, seed=2)))
    finally:
        await backend.close()


@pytest.mark.slow
def test_the_rate_moves_before_any_episode_finishes(tiny_model_path, tiny_tokenizer):
    spec = envhub.get_spec("countdown")
    backend = HFBackend(tiny_model_path)
    config = RolloutConfig(max_length=4096, sampling=SamplingParams(max_tokens=1500, temperature=1.0, seed=0,
                                                                    stop_token_ids=[]))
    run = Run(spec, backend, tiny_tokenizer, n=1, samples=1, concurrency=1, config=config, show_progress=False)
    seen: list[str] = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            if not run.finished and backend.tokens_sampled > 0:
                seen.append(run.rate_text())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert run.execute() == 0
    finally:
        done.set()
        watcher.join()
    assert seen, "no sampled token was counted while the episode was running"
    assert any(float(s.split()[0]) > 0 for s in seen), seen
