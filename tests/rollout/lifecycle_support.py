"""The pieces the weight-lifecycle tests share (#25 point 2): a "trainer" that pauses the real ``hf`` backend at
random moments and swaps in real weight changes, multi-turn episodes on the real executor, and the checks on what
they produced (re-scoring under each tagged version, replies cut short, turns split by an update)."""
from __future__ import annotations

import asyncio
import random

import torch

import envhub
from envhub.backends.base import SamplingParams
from envhub.backends.lifecycle import WeightLifecycle, lifecycle_of
from envhub.rollout.executor import RolloutConfig, rollout
from envhub.rollout.versions import segments

# A turn ends on one of STOP_IDS (about 1 in 12 of the random tiny model's draws) or at TOKENS: a reply cut by a
# leaked abort is visible as a turn that ends on neither.
STOP_IDS = list(range(100, 160))
TOKENS = 64
TURNS = 3


def weights_for(base: dict, version: int) -> dict:
    """The weights of ``version``: the base weights plus a seeded perturbation (version 0: the base)."""
    if version == 0:
        return base
    g = torch.Generator().manual_seed(1000 + version)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g, dtype=v.dtype) if v.is_floating_point() else v
            for k, v in base.items()}


class Trainer:
    """Pauses at random moments, swaps in the next version's weights, resumes; keeps every version's weights.

    At most ``max_updates`` updates: the pace is in wall time, so on a loaded machine (slower generation, more
    pauses) an unbounded trainer made more versions, each one more full re-scoring pass, and the test's cost grew
    with its own slowness (past its time limit on 2 busy cores)."""

    def __init__(self, backend, mode: str, *, seed: int = 0, every_s: tuple[float, float] = (0.02, 0.06),
                 change_weights: bool = True, max_updates: int = 40):
        self.backend, self.mode, self.rng = backend, mode, random.Random(seed)
        self.every_s, self.change_weights, self.max_updates = every_s, change_weights, max_updates
        self.base = {k: v.clone() for k, v in backend.model.state_dict().items()}
        self.weights = {0: self.base}
        self.pauses = 0

    async def run(self, stop: asyncio.Event) -> None:
        lc = lifecycle_of(self.backend)
        while not stop.is_set() and self.pauses < self.max_updates:
            await asyncio.sleep(self.rng.uniform(*self.every_s))
            if stop.is_set():
                break
            await asyncio.to_thread(lc.pause, self.mode, timeout_s=30)
            version = lc.version + 1 if self.change_weights else lc.version
            if self.change_weights:
                self.weights[version] = weights_for(self.base, version)
                self.backend.model.load_state_dict(self.weights[version])  # nothing samples now
            await asyncio.sleep(self.rng.uniform(0, 0.005))
            lc.resume(version)
            self.pauses += 1

    def restore(self) -> None:
        self.backend.model.load_state_dict(self.base)
        self.backend.lifecycle = WeightLifecycle(0)  # the next test starts unpaused, at version 0 (the base weights)


def run_episodes(backend, tokenizer, n: int, trainer: Trainer | None, *, seed0: int = 0, timeout_s=None,
                 tokens: int = TOKENS):
    spec = envhub.get_spec("guess-number")
    tasks = [dict(t) for t in spec.load_tasks()][:n]
    tasks = (tasks * (n // max(1, len(tasks)) + 1))[:n]

    async def go():
        stop = asyncio.Event()
        bg = asyncio.create_task(trainer.run(stop)) if trainer else None
        try:
            return await asyncio.gather(*(
                rollout(spec, task, backend, tokenizer, RolloutConfig(
                    max_turns=TURNS, sampling=SamplingParams(max_tokens=tokens, temperature=1.0, seed=seed0 + i,
                                                             stop_token_ids=STOP_IDS)),
                        session_id=f"s{seed0 + i}", timeout_s=timeout_s)
                for i, task in enumerate(tasks)))
        finally:
            stop.set()
            if bg:
                await bg

    return asyncio.run(go())


def mislabelled(trajs, backend, weights: dict, *, tol: float = 1e-4) -> tuple[int, int, int, int]:
    """Re-score every sampled token under its tagged version's weights. Returns ``(tokens checked, tokens whose
    logprob differs by more than tol, segments, segments that other versions ALSO explain within tol)``."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(backend.model_path, attn_implementation="eager").eval()
    scores: dict[int, dict[int, torch.Tensor]] = {}  # version -> trajectory index -> logprob of each response id
    for v, w in weights.items():
        ref.load_state_dict(w)
        scores[v] = {}
        with torch.inference_mode():
            for k, t in enumerate(trajs):
                ids = t.prompt_ids + t.response_ids
                lp = torch.log_softmax(ref(torch.tensor([ids])).logits[0].float(), dim=-1)
                p = len(t.prompt_ids)
                scores[v][k] = lp[p - 1:len(ids) - 1].gather(1, torch.tensor(t.response_ids)[:, None])[:, 0]
    checked = bad = n_seg = ambiguous = 0
    for k, t in enumerate(trajs):
        for seg in segments(t):
            n_seg += 1
            got = torch.tensor(t.response_logprobs[seg["start"]:seg["end"]])
            tagged = scores[seg["version"]][k][seg["start"]:seg["end"]]
            checked += len(got)
            bad += int(((tagged - got).abs() > tol).sum())
            others = [v for v in weights if v != seg["version"]]
            if any(float((scores[v][k][seg["start"]:seg["end"]] - got).abs().max()) <= tol for v in others):
                ambiguous += 1
    return checked, bad, n_seg, ambiguous


def cut_turns(trajs, eos: set[int], *, tokens: int = TOKENS) -> list[tuple[str, int, int]]:
    """Model turns that ended on neither a stop token (ours or EOS) nor a token budget: replies cut short."""
    return [(t.task_id, s, e) for t in trajs for k, (s, e) in enumerate(t.action_ranges)
            if e - s < tokens and t.response_ids[e - 1] not in STOP_IDS and t.response_ids[e - 1] not in eos
            and not (t.finish_reason == "length" and k == len(t.action_ranges) - 1)]


def ended_well(t) -> bool:
    return t.finish_reason in ("max_turns", "length") and t.error is None


def split_turns(trajs) -> int:
    """Model turns sampled by more than one version (a weight update landed mid-generation)."""
    return sum(len({t.response_versions[i] for i in range(s, e)}) > 1 for t in trajs for s, e in t.action_ranges)
