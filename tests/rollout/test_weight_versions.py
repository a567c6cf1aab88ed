"""Per-token weight versions and weight updates the agent never sees (#25 points 1 and 2), on the real executor and
the real ``hf`` backend, with real weight changes between versions.

A "trainer" task pauses the backend at random moments while multi-turn episodes run, loads the next version's
weights (the base weights plus a seeded perturbation, a real parameter change), and resumes. Then every sampled
token is re-scored under the weights of the version it is tagged with (|Δlogprob| ≤ 1e-4) and under every other
version (where it must be wrong: the tags are not vacuous). Breaking the invariants on purpose (a resumed chunk
keeping the old tag, a held batch continuing on its stale KV cache, an abort leaking to the agent, a timeout that
counts paused time) makes these checks fail.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from envhub.backends.lifecycle import LifecycleError, PausedTooLong, WeightLifecycle, lifecycle_of
from envhub.rollout.fidelity import check_trajectory
from envhub.rollout.versions import areal_versions, segments, slime_weight_versions, verl_global_steps, version_span

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from lifecycle_support import (  # noqa: E402  (after the skips: it imports torch)
    Trainer,
    cut_turns,
    ended_well,
    mislabelled,
    run_episodes,
    split_turns,
)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def hf(tiny_model_path):
    from envhub.backends.hf import HFBackend

    backend = HFBackend(tiny_model_path, batch_window_s=0.001)
    yield backend
    asyncio.run(backend.close())


@pytest.mark.parametrize("mode", ["hold", "abort"])
@pytest.mark.slow
def test_every_token_is_scored_by_the_weights_of_its_tag(hf, tiny_tokenizer, mode):
    trainer = Trainer(hf, mode, seed={"hold": 1, "abort": 2}[mode])
    try:
        trajs = run_episodes(hf, tiny_tokenizer, 8, trainer)
    finally:
        trainer.restore()
    assert trainer.pauses >= 5 and len(trainer.weights) >= 4
    assert all(ended_well(t) for t in trajs), [(t.finish_reason, t.error) for t in trajs]
    assert sum(t.num_turns for t in trajs) >= 2 * len(trajs)
    # the agent saw whole replies, however many pauses cut through them
    assert cut_turns(trajs, hf.eos_token_ids) == []
    assert split_turns(trajs) >= 3, "no weight update landed inside a generation: the check proves nothing"
    if mode == "abort":
        assert sum(t.metrics.get("interruptions", 0) for t in trajs) >= 3
    for t in trajs:
        assert check_trajectory(t, tiny_tokenizer) == []  # fidelity (versions aligned: -1 exactly on env tokens)
    checked, bad, n_seg, ambiguous = mislabelled(trajs, hf, trainer.weights)
    assert checked == sum(sum(t.response_mask) for t in trajs)
    assert bad == 0, f"{bad} of {checked} tokens do not have their tagged version's logprob"
    assert ambiguous <= 0.05 * n_seg, f"{ambiguous} of {n_seg} segments are also explained by another version"


@pytest.mark.slow
def test_a_resumed_chunk_keeping_the_old_tag_is_caught(hf, tiny_tokenizer):
    """The attack: drop the version on resumed chunks (tag the whole turn with the version it started under)."""
    trainer = Trainer(hf, "abort", seed=3)
    try:
        trajs = run_episodes(hf, tiny_tokenizer, 8, trainer)
    finally:
        trainer.restore()
    assert split_turns(trajs) >= 1
    for t in trajs:
        for s, e in t.action_ranges:
            t.response_versions[s:e] = [t.response_versions[s]] * (e - s)
    _, bad, _, _ = mislabelled(trajs, hf, trainer.weights)
    assert bad > 0


@pytest.mark.slow
def test_a_held_batch_that_keeps_its_stale_cache_is_caught(hf, tiny_tokenizer, monkeypatch):
    """Break the hold: after the resume the batch continues on the KV cache of the old weights (vLLM's ``keep``)
    instead of re-running its context; its later tokens then match no version exactly."""
    from envhub.backends import hf as hf_module

    real = hf_module.HFBackend._prefill
    calls = {"n": 0}

    def stale_after_first(self, batch, out_ids, torch_mod):
        calls["n"] += 1
        if any(out_ids):  # a re-run after a hold: skip it, reuse the cache by re-running only the old prefix
            return real(self, batch, [o[:-1] if o else o for o in out_ids], torch_mod)
        return real(self, batch, out_ids, torch_mod)

    monkeypatch.setattr(hf_module.HFBackend, "_prefill", stale_after_first)
    trainer = Trainer(hf, "hold", seed=4)
    try:
        trajs = run_episodes(hf, tiny_tokenizer, 8, trainer)
    finally:
        trainer.restore()
    assert split_turns(trajs) >= 1
    _, bad, _, _ = mislabelled(trajs, hf, trainer.weights)
    assert bad > 0


def test_an_abort_leaked_to_the_agent_is_caught(hf, tiny_tokenizer, monkeypatch):
    """Break abort-and-continue: the partial reply goes to the agent as if it were whole (miles#2589)."""
    from envhub.backends.base import Generation
    from envhub.rollout import executor

    async def leaky(backend, prompt_ids, params, *, session_id=""):
        lc = lifecycle_of(backend)
        await lc.enter()
        lc.exit()
        gen = await backend.generate(prompt_ids, params, session_id=session_id)
        return Generation(gen.token_ids, gen.logprobs, "stop" if gen.finish_reason == "abort" else gen.finish_reason,
                          versions=gen.versions)

    monkeypatch.setattr(executor, "generate_tagged", leaky)
    trainer = Trainer(hf, "abort", seed=5)
    try:
        trajs = run_episodes(hf, tiny_tokenizer, 8, trainer)
    finally:
        trainer.restore()
    assert cut_turns(trajs, hf.eos_token_ids)


@pytest.mark.slow
def test_a_pause_storm_changes_nothing_the_agent_sees(hf, tiny_tokenizer):
    """Hold mode with the weights unchanged: the same seeds give the same episodes, token for token, with or
    without hundreds of pauses at random token offsets."""
    calm = run_episodes(hf, tiny_tokenizer, 12, None, seed0=100)
    trainer = Trainer(hf, "hold", seed=6, every_s=(0.0005, 0.003), change_weights=False, max_updates=400)
    try:
        stormy = run_episodes(hf, tiny_tokenizer, 12, trainer, seed0=100)
    finally:
        trainer.restore()
    assert trainer.pauses >= 20
    assert [t.response_ids for t in stormy] == [t.response_ids for t in calm]
    assert [t.messages for t in stormy] == [t.messages for t in calm]
    assert [(t.finish_reason, t.reward) for t in stormy] == [(t.finish_reason, t.reward) for t in calm]
    for a, b in zip(stormy, calm):
        assert max(abs(x - y) for x, y in zip(a.response_logprobs, b.response_logprobs)) < 1e-4


@pytest.mark.slow
def test_paused_time_does_not_count_towards_the_rollout_timeout(hf, tiny_tokenizer, monkeypatch):
    """A 1.5 s episode budget and 3 s paused (from before the first model call): the episodes still complete. With
    the timeout counting paused time (the defence off), the same run times out."""

    class LongPause(Trainer):
        async def run(self, stop):
            await asyncio.sleep(3.0)
            lifecycle_of(self.backend).resume()

    def go():
        trainer = LongPause(hf, "hold")
        lifecycle_of(hf).pause("hold")
        try:
            return run_episodes(hf, tiny_tokenizer, 2, trainer, timeout_s=1.5)
        finally:
            trainer.restore()

    t0 = time.monotonic()
    trajs = go()
    assert time.monotonic() - t0 >= 3.0
    assert all(ended_well(t) for t in trajs), [t.error for t in trajs]
    assert all(t.metrics["run_s"] >= 3.0 for t in trajs)

    from envhub.rollout import executor

    async def plain(coro, timeout_s, backend):
        return await asyncio.wait_for(coro, timeout_s)

    monkeypatch.setattr(executor, "wait_excluding_pauses", plain)
    assert [t.finish_reason for t in go()] == ["timeout"] * 2


def test_versions_reduce_to_every_trainers_form(hf, tiny_tokenizer):
    trainer = Trainer(hf, "abort", seed=7)
    try:
        trajs = run_episodes(hf, tiny_tokenizer, 8, trainer)
    finally:
        trainer.restore()
    t = max(trajs, key=lambda t: len(segments(t)))
    lo, hi = version_span(t)
    sampled = [v for m, v in zip(t.response_mask, t.response_versions) if m]
    assert (lo, hi) == (min(sampled), max(sampled))
    assert verl_global_steps(t) == {"min_global_steps": lo, "max_global_steps": hi}
    assert areal_versions(t) == [-1] * len(t.prompt_ids) + t.response_versions
    assert len(slime_weight_versions(t)) == len(segments(t)) >= len(t.action_ranges)
    assert all(v == -1 for m, v in zip(t.response_mask, t.response_versions) if not m)
    # the fidelity check catches a shifted version list
    broken = type(t).from_dict(t.to_dict())
    broken.response_versions = [broken.response_versions[-1]] + broken.response_versions[:-1]
    assert any("version" in p for p in check_trajectory(broken, tiny_tokenizer))


# ---- bad input and failure ------------------------------------------------------------------------------------

def test_lifecycle_refuses_what_it_cannot_honour():
    lc = WeightLifecycle(3)
    with pytest.raises(LifecycleError, match="without a pause"):
        lc.resume(4)
    lc.pause("hold")
    with pytest.raises(LifecycleError, match="already paused"):
        lc.pause("hold")
    with pytest.raises(LifecycleError, match="backwards"):
        lc.resume(2)
    assert lc.paused  # a refused resume changes nothing
    lc.resume(5)
    assert (lc.version, lc.paused) == (5, False)
    with pytest.raises(LifecycleError, match="mode"):
        lc.pause("sometimes")


def test_a_pause_that_never_ends_fails_the_rollout_clearly(hf, tiny_tokenizer):
    """No resume ever comes: the waiting call fails after max_pause_s with a clear error, marked, nothing hung."""
    lc = WeightLifecycle(0, max_pause_s=0.5)
    hf.lifecycle = lc
    try:
        lc.pause("hold")
        t0 = time.monotonic()
        trajs = run_episodes(hf, tiny_tokenizer, 2, None)
        assert time.monotonic() - t0 < 20
        assert [t.finish_reason for t in trajs] == ["error"] * 2
        assert all("without a resume" in (t.error or "") for t in trajs)
    finally:
        lc.resume()
        hf.lifecycle = WeightLifecycle(0)


async def test_a_pause_that_cannot_drain_times_out_and_undoes_itself():
    """A call that never reaches a token boundary (a hung server): pause gives up after its timeout, un-pauses,
    and says why; later calls are not stuck behind it."""
    lc = WeightLifecycle(0)
    await lc.enter()  # a call in flight that never finishes
    with pytest.raises(LifecycleError, match="still sampling"):
        await asyncio.to_thread(lc.pause, "hold", timeout_s=0.2)
    assert not lc.paused
    assert await asyncio.wait_for(lc.enter(), 1) == 0


async def test_calls_arriving_while_paused_wait_on_the_loop_and_run_after_resume():
    lc = WeightLifecycle(1, max_pause_s=5)
    lc.pause("abort")
    waiters = [asyncio.create_task(lc.enter()) for _ in range(200)]  # no thread each: 200 waiters are cheap
    await asyncio.sleep(0.05)
    assert not any(w.done() for w in waiters)
    lc.resume(2)
    assert await asyncio.gather(*waiters) == [2] * 200
    with pytest.raises(PausedTooLong):
        lc2 = WeightLifecycle(0, max_pause_s=0.1)
        lc2.pause()
        await lc2.enter()
