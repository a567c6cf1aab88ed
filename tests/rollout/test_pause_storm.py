"""Abort-and-continue under a pause storm (#25 point 2): the distribution of episode outcomes stays the no-pause run's.

In *hold* mode a pause changes nothing at all: same seeds, same tokens (``test_weight_versions``). In *abort* mode it
cannot be token-identical: an aborted call is re-sent as prompt + partial output with the remaining ``max_tokens`` and
a seed derived from the request's seed and the tokens done, so the continuation draws from another random stream. What
must hold is that the *distribution* of outcomes is unchanged: an interrupted reply is one reply, sampled from the
same policy, with the same budget. Here 200 multi-turn episodes of the real executor on the real ``hf`` backend run
once calm and once under hundreds of abort-mode pauses at random token offsets (weights unchanged), with the same
seeds, and the two samples of per-episode reply length are compared by a two-sample Kolmogorov–Smirnov test at
α = 0.001 (the samples share their seeds, which makes the test conservative; its power is shown by the break-its).

Broken on purpose and caught: a continuation that restarts the request's own random stream (it re-draws the
exponential race that already passed over the stop tokens: the distribution of reply lengths moves). On a loaded
2-core host the storm is extreme: most chunks are aborted after one token, so every reply is cut at every offset.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
import random
from collections import Counter

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from lifecycle_support import Trainer, cut_turns, ended_well, run_episodes  # noqa: E402

from envhub.backends import lifecycle  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

EPISODES = 200
TOKENS = 24        # the budget binds on about 1 turn in 8 (a stop id is ~1 in 12 draws), so it is part of the outcome
SEED0 = 1000


@pytest.fixture(scope="module")
def hf(tiny_model_path):
    import asyncio

    from envhub.backends.hf import HFBackend

    backend = HFBackend(tiny_model_path, batch_window_s=0.001)
    yield backend
    asyncio.run(backend.close())


@pytest.fixture(scope="module")
def calm(hf, tiny_tokenizer):
    return run_episodes(hf, tiny_tokenizer, EPISODES, None, seed0=SEED0, tokens=TOKENS)


def storm(hf, tokenizer, n: int = EPISODES):
    trainer = Trainer(hf, "abort", seed=11, every_s=(0.004, 0.02), change_weights=False, max_updates=600)
    try:
        trajs = run_episodes(hf, tokenizer, n, trainer, seed0=SEED0, tokens=TOKENS)
    finally:
        trainer.restore()
    return trajs, trainer.pauses


def reply_tokens(trajs) -> list[int]:
    """The outcome compared: each episode's sampled reply tokens over all its turns (how long its replies ran, where
    the stop tokens and the budget ended them)."""
    return [sum(e - s for s, e in t.action_ranges) for t in trajs]


def ks_two_sample(a: list[int], b: list[int], c_alpha: float = 1.95) -> tuple[float, float]:
    """``(D, critical D)``: the largest gap between the two empirical CDFs, and its critical value at α = 0.001
    (c(α) = sqrt(-ln(α/2)/2) = 1.95; conservative for discrete data)."""
    a, b = sorted(a), sorted(b)
    d = max(abs(bisect.bisect_right(a, x) / len(a) - bisect.bisect_right(b, x) / len(b)) for x in set(a) | set(b))
    return d, c_alpha * math.sqrt((len(a) + len(b)) / (len(a) * len(b)))


def episode_end(t) -> tuple:
    return (t.finish_reason, t.reward, t.num_turns)


def permutation_p(a: list, b: list, rounds: int = 4000) -> float:
    """The p-value of a chi-square-style statistic on the categories of ``a`` vs ``b`` under label permutation
    (seeded: the same data give the same p)."""
    def stat(x: list, y: list) -> float:
        cx, cy = Counter(x), Counter(y)
        return sum((cx[k] / len(x) - cy[k] / len(y)) ** 2 / ((cx[k] + cy[k]) / (len(x) + len(y)))
                   for k in cx.keys() | cy.keys())

    observed, pooled, rng = stat(a, b), a + b, random.Random(0)
    hits = 0
    for _ in range(rounds):
        rng.shuffle(pooled)
        hits += stat(pooled[:len(a)], pooled[len(a):]) >= observed - 1e-12
    return (hits + 1) / (rounds + 1)


def outcome_problems(calm, stormy, eos) -> list[str]:
    problems = []
    if not all(ended_well(t) for t in stormy):
        problems.append(f"episodes that did not end well: {[(t.finish_reason, t.error) for t in stormy][:5]}")
    if cut := cut_turns(stormy, eos, tokens=TOKENS):
        problems.append(f"replies cut short (an abort reached the agent): {cut[:5]}")
    if over := [e - s for t in stormy for s, e in t.action_ranges if e - s > TOKENS]:
        problems.append(f"replies longer than max_tokens={TOKENS}: {over[:5]}")
    p_ends = permutation_p([episode_end(t) for t in calm], [episode_end(t) for t in stormy])
    if p_ends < 0.001:
        problems.append(f"episode ends moved (p = {p_ends:.4f}): {Counter(map(episode_end, calm))} calm, "
                        f"{Counter(map(episode_end, stormy))} under the storm")
    d, critical = ks_two_sample(reply_tokens(calm), reply_tokens(stormy))
    if d > critical:
        problems.append(f"reply-length distribution moved: KS D = {d:.3f} > {critical:.3f} (alpha 0.001)")
    return problems


def test_an_abort_storm_leaves_the_distribution_of_outcomes_unchanged(hf, tiny_tokenizer, calm):
    stormy, pauses = storm(hf, tiny_tokenizer)
    interruptions = sum(t.metrics.get("interruptions", 0) for t in stormy)
    print(f"storm: {pauses} pauses, {interruptions} replies cut and continued")
    assert pauses >= 100 and interruptions >= 100, (pauses, interruptions)  # the storm really cut replies
    assert all(ended_well(t) for t in calm)
    # informative: most replies end on a stop id, some at the budget (else lengths say nothing of the continuation)
    lengths = [e - s for t in calm for s, e in t.action_ranges]
    assert 0 < sum(n == TOKENS for n in lengths) < len(lengths) / 3
    assert outcome_problems(calm, stormy, hf.eos_token_ids) == []


def test_a_continuation_that_restarts_its_random_stream_is_caught(hf, tiny_tokenizer, calm, monkeypatch):
    """``_rest`` keeping the request's seed: the re-sent chunk replays the draws that already lost to the stop ids."""
    monkeypatch.setattr(lifecycle, "_rest", lambda p, done: dataclasses.replace(p, max_tokens=p.max_tokens - done))
    stormy, _ = storm(hf, tiny_tokenizer, EPISODES // 2)  # the first half of the calm run has the same seeds
    problems = outcome_problems(calm[:EPISODES // 2], stormy, hf.eos_token_ids)
    assert any("distribution moved" in p for p in problems), problems

