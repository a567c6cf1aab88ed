"""Gateway test fixtures: the tiny model's real tokenizer, a pool of ids really sampled by the tiny model."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "rollout"))  # rollout_sim.byte_ids


@pytest.fixture(scope="session")
def tiny_samples(tiny_model_path, tiny_tokenizer):
    """Eight short sequences sampled by the real tiny model at temperature 1 (special tokens left out)."""
    import asyncio

    from envhub.backends.base import SamplingParams
    from envhub.backends.hf import HFBackend

    backend = HFBackend(tiny_model_path)
    special = set(tiny_tokenizer.all_special_ids) | set(tiny_tokenizer.get_added_vocab().values())
    prompt = tiny_tokenizer.encode("hello there", add_special_tokens=False)

    async def draw():
        out = []
        for seed in range(8):
            gen = await backend.generate(prompt, SamplingParams(max_tokens=5, temperature=1.0, seed=seed))
            out.append([i for i in gen.token_ids if i not in special])
        await backend.close()
        return out

    return asyncio.run(draw())
