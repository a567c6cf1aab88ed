"""Token fidelity that can fail: the real executor (and the service over HTTP) driven by a backend whose ids are
really sampled by the tiny model and are not the canonical tokenization of their text, and a mutation test that
injects ``encode(decode(ids))`` into the executor and shows these checks catch it.

Each model turn is: ids sampled by the real tiny model (temperature 1: random tokens, rarely canonical), then the
three shapes a re-tokenizing pipeline gets wrong — characters split across byte tokens (``é`` as two byte ids), a
lone UTF-8 lead byte (decodes to U+FFFD, which re-encodes to other ids), and a turn ending on the tokenizer's *other*
end-of-sequence token (``<|endoftext|>``, not the template's ``<|im_end|>``). The backend records what it returned;
the fidelity check must find every one of those ids, with its logprob, at its place in the trajectory.
"""
from __future__ import annotations

import asyncio
import json
import inspect
import sys
import types

import pytest
from rollout_sim import byte_ids

import envhub
from envhub.backends.base import Generation, LLMBackend
from envhub.rollout.fidelity import check_trajectory

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


class SampledNonCanonical(LLMBackend):
    """The tiny model's own samples plus the three non-canonical shapes (see the module docstring)."""

    def __init__(self, model_path, tokenizer, sampled_tokens: int = 6):
        from envhub.backends.hf import HFBackend

        self.model = HFBackend(model_path)
        self.tok = tokenizer
        self.sampled_tokens = sampled_tokens
        self.generations: dict[str, list[Generation]] = {}
        self.turn = 0

    async def generate(self, prompt_ids, params, *, session_id=""):
        from dataclasses import replace

        real = await self.model.generate(prompt_ids, replace(params, max_tokens=self.sampled_tokens, temperature=1.0),
                                         session_id=session_id)
        ids = [i for i in real.token_ids if i not in self.tok.all_special_ids]  # the end comes below
        lps = [lp for i, lp in zip(real.token_ids, real.logprobs) if i not in self.tok.all_special_ids]
        self.turn += 1
        lead = byte_ids(self.tok, "é")[:1]  # a lone UTF-8 lead byte
        crafted = byte_ids(self.tok, " café ") + lead + byte_ids(self.tok, f" {self.turn}")
        end = self.tok.convert_tokens_to_ids("<|endoftext|>" if self.turn % 2 else "<|im_end|>")
        ids += crafted + [end]
        lps += [-1.0 - 0.01 * k for k in range(len(crafted) + 1)]
        gen = Generation(ids, lps, "stop")
        self.generations.setdefault(session_id, []).append(gen)
        return gen

    async def close(self):
        await self.model.close()


def non_canonical(tok, ids) -> bool:
    return tok.encode(tok.decode(ids), add_special_tokens=False) != list(ids)


def run_episodes(rollout_fn, backend, tokenizer, n: int = 3):
    from envhub.rollout.executor import RolloutConfig

    spec = envhub.get_spec("guess-number")
    tasks = [dict(t) for t in spec.load_tasks()][:n]

    async def go():
        return [await rollout_fn(spec, task, backend, tokenizer, RolloutConfig(max_turns=3), session_id=f"s{i}")
                for i, task in enumerate(tasks)]

    return asyncio.run(go())


def problems_of(trajs, backend, tokenizer) -> list[str]:
    out = []
    for i, t in enumerate(trajs):
        out += check_trajectory(t, tokenizer, generations=backend.generations[f"s{i}"])
    return out


@pytest.fixture(scope="module")
def backend(tiny_model_path, tiny_tokenizer):
    return SampledNonCanonical(tiny_model_path, tiny_tokenizer)


def test_the_executor_keeps_real_non_canonical_samples_exactly(backend, tiny_tokenizer):
    from envhub.rollout.executor import rollout

    trajs = run_episodes(rollout, backend, tiny_tokenizer)
    gens = [g for i in range(3) for g in backend.generations[f"s{i}"]]
    assert all(non_canonical(tiny_tokenizer, g.token_ids) for g in gens)  # the case is really exercised
    assert all(t.num_turns >= 2 for t in trajs)  # multi-turn: env tokens sit between sampled ones
    assert problems_of(trajs, backend, tiny_tokenizer) == []
    for i, t in enumerate(trajs):  # and directly: the mask-1 tokens are the sampled ids, in order, with logprobs
        sampled = [tid for g in backend.generations[f"s{i}"] for tid in g.token_ids]
        kept = [tid for tid, m in zip(t.response_ids, t.response_mask) if m]
        lps = [lp for lp, m in zip(t.response_logprobs, t.response_mask) if m]
        assert kept == sampled and lps == [lp for g in backend.generations[f"s{i}"] for lp in g.logprobs]


def mutant_executor(tokenizer) -> types.ModuleType:
    """``envhub.rollout.executor`` with one deliberate bug: the sampled ids re-tokenized from their text."""
    import envhub.rollout.executor as real

    src = inspect.getsource(real)
    target = "ids = gen.token_ids"
    assert src.count(target) == 1, "the executor changed: update the mutation point"
    mod = types.ModuleType("executor_mutant")
    sys.modules[mod.__name__] = mod  # its dataclasses look their module up there
    mod.__dict__["RETOKENIZE"] = lambda ids: tokenizer.encode(tokenizer.decode(list(ids)), add_special_tokens=False)
    exec(compile(src.replace(target, "ids = RETOKENIZE(gen.token_ids)"), "executor_mutant", "exec"), mod.__dict__)
    return mod


def test_a_re_tokenizing_executor_is_caught(backend, tiny_tokenizer):
    mutant = mutant_executor(tiny_tokenizer)
    backend.generations.clear()
    trajs = run_episodes(mutant.rollout, backend, tiny_tokenizer)
    problems = problems_of(trajs, backend, tiny_tokenizer)
    assert problems, "an executor that re-tokenizes the model's text passed the fidelity check"


async def test_the_service_returns_real_non_canonical_samples_exactly(backend, tiny_tokenizer):
    """The same through ``/process`` on a real server on loopback (one job at a time, so the backend's one new
    session is the job's)."""
    from envhub.rollout.trajectory import Trajectory
    from envhub.service import RolloutService, ServerThread
    from envhub.training.client import RolloutClient

    srv = ServerThread(RolloutService(tiny_tokenizer, backends=[backend])).start()
    spec = envhub.get_spec("guess-number")
    try:
        async with RolloutClient(srv.url) as c:
            for task in [dict(t) for t in spec.load_tasks()][:2]:
                before = set(backend.generations)
                reply = await c.process({"env_id": "guess-number", "task_id": task["task_id"]}, raw=True)
                (session,) = set(backend.generations) - before
                traj = Trajectory.from_dict(reply)
                assert traj.num_turns >= 2 and traj.finish_reason in ("max_turns", "done"), traj.error
                assert check_trajectory(traj, tiny_tokenizer, generations=backend.generations[session]) == []
    finally:
        srv.stop()


def test_the_cli_runner_keeps_real_non_canonical_samples_exactly(tiny_model_path, tiny_tokenizer):
    """`envhub rollout`'s runner (the CLI path), one episode at a time so each backend session is one trajectory;
    the trajectories also survive the JSON a run directory stores them as. (A backend of its own: the runner closes
    its backend when it is done.)"""
    from envhub.cli.runner import Run
    from envhub.rollout.executor import RolloutConfig
    from envhub.rollout.trajectory import Trajectory

    backend = SampledNonCanonical(tiny_model_path, tiny_tokenizer)
    run = Run(envhub.get_spec("guess-number"), backend, tiny_tokenizer, n=2, samples=1, concurrency=1,
              config=RolloutConfig(max_turns=3), show_progress=False)
    assert run.execute() == 0
    trajs, gens = run.results(), list(backend.generations.values())
    assert len(trajs) == len(gens) == 2 and all(t.num_turns >= 2 for t in trajs)
    for t, g in zip(trajs, gens):
        assert check_trajectory(t, tiny_tokenizer, generations=g) == []
        assert check_trajectory(Trajectory.from_dict(json.loads(t.to_json())), tiny_tokenizer, generations=g) == []


def test_a_re_tokenizing_executor_under_the_cli_runner_is_caught(tiny_model_path, tiny_tokenizer, monkeypatch):
    from envhub.cli.runner import Run
    from envhub.rollout.executor import RolloutConfig

    monkeypatch.setattr("envhub.rollout.executor.rollout", mutant_executor(tiny_tokenizer).rollout)
    backend = SampledNonCanonical(tiny_model_path, tiny_tokenizer)
    run = Run(envhub.get_spec("guess-number"), backend, tiny_tokenizer, n=2, samples=1, concurrency=1,
              config=RolloutConfig(max_turns=3), show_progress=False)
    run.execute()
    assert [t.finish_reason for t in run.results()] != ["error", "error"]  # the episodes really ran
    problems = [p for t, g in zip(run.results(), backend.generations.values())
                for p in check_trajectory(t, tiny_tokenizer, generations=g)]
    assert problems, "the CLI runner with a re-tokenizing executor passed the fidelity check"
