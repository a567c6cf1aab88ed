"""Stand-ins for the trainers' GPU inference engines, replaying envhub's own scripted rollouts.

The one thing the trainer tests cannot run here is the GPU engine (OpenRLHF's vLLM actor, veRL's vLLM server
replicas). Everything else is the trainers' real code. So the engine is replaced by a *replay*: first envhub's own
executor plays a scripted policy (golden or a known-bad one) through the real tokenizer and chat template, giving a
reference :class:`Trajectory` per task; then, inside the trainer's code path, the stand-in engine answers each
``generate`` by looking the prompt ids up in those references and returning the next model span with its logprobs.

That makes the test strict: the adapter must present the engine with *exactly* the ids envhub produced (prompt,
earlier model turns, env deltas) or the lookup fails loudly. Masks, ids, logprobs and rewards out of the trainer's
code are then compared with the reference trajectories.

Scripted tokens have logprob 0.0 (a script is certain); :class:`ScoredScripted` gives them distinct, non-zero
values so that a misaligned logprob cannot pass unnoticed.
"""
from __future__ import annotations

from dataclasses import dataclass

from envhub.backends.base import Generation, SamplingParams
from envhub.backends.scripted import ScriptedBackend, play
from envhub.env import Action


def fake_logprob(token_id: int, position: int) -> float:
    """A deterministic, distinct, negative logprob for a (token, position) pair."""
    return -(((token_id * 7919 + position * 104729) % 997) + 1) / 1000.0


class ScoredScripted(ScriptedBackend):
    """The scripted backend, with :func:`fake_logprob` values instead of 0.0 (see module docstring)."""

    async def generate(self, prompt_ids, params, *, session_id=""):
        gen = await super().generate(prompt_ids, params, session_id=session_id)
        n = len(prompt_ids)
        return Generation(gen.token_ids, [fake_logprob(t, n + i) for i, t in enumerate(gen.token_ids)],
                          gen.finish_reason)


class NonCanonicalScored(ScoredScripted):
    """:class:`ScoredScripted`, but the first characters of the text (before any tool call) are one token per UTF-8
    byte: the same text as the canonical tokenization, other ids (what a model sampling a non-canonical split produces). An adapter that
    re-tokenizes anything the model wrote sends the engine ids no reference continues, and the replay fails."""

    async def generate(self, prompt_ids, params, *, session_id=""):
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).parent.parent / "rollout"))
        from rollout_sim import byte_ids

        session = self._sessions[session_id]
        codec = session.codec
        text = codec.render_action(Action.coerce(self.policy(session.task, session.messages)))
        # the first characters only: non-canonical, and hardly longer than the canonical ids (the trainers' tests
        # have fixed response budgets)
        cut = min(text.find("<tool_call>") if "<tool_call>" in text else len(text), 4)
        gen = play(byte_ids(codec.tokenizer, text[:cut]) + (codec.encode(text[cut:]) if text[cut:] else []), codec,
                   params)
        n = len(prompt_ids)
        return Generation(gen.token_ids, [fake_logprob(t, n + i) for i, t in enumerate(gen.token_ids)],
                          gen.finish_reason)


@dataclass
class Span:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


class Replay:
    """Index of reference trajectories: prompt ids -> the model span that followed them."""

    def __init__(self, trajectories):
        self.spans: dict[tuple[int, ...], Span] = {}
        self.calls: list[tuple[tuple[int, ...], int]] = []
        for t in trajectories:
            full = list(t.prompt_ids) + list(t.response_ids)
            p = len(t.prompt_ids)
            ranges = t.action_ranges
            for k, (s, e) in enumerate(ranges):
                last = k == len(ranges) - 1
                finish = "length" if last and t.finish_reason == "length" else "stop"
                key = tuple(full[: p + s])
                span = Span(full[p + s: p + e], list(t.response_logprobs[s:e]), finish)
                if key in self.spans and self.spans[key] != span:
                    raise ValueError("two reference trajectories continue the same prefix differently")
                self.spans[key] = span

    def next(self, prompt_ids: list[int], max_tokens: int | None) -> Span:
        key = tuple(int(i) for i in prompt_ids)
        self.calls.append((key, max_tokens or 0))
        span = self.spans.get(key)
        if span is None:
            raise KeyError(f"no reference continues these {len(key)} prompt ids (last 12: {list(key[-12:])}): "
                           "the adapter sent ids envhub's own rollout did not produce")
        if max_tokens is not None and len(span.token_ids) > max_tokens:
            return Span(span.token_ids[:max_tokens], span.logprobs[:max_tokens], "length")
        return span


async def reference_rollouts(spec, tasks, policy, tokenizer, *, max_length: int = 1024, max_tokens: int = 256,
                             canonical: bool = True):
    """envhub's own trajectories of ``policy`` on ``tasks`` (scripted, with :class:`ScoredScripted` logprobs;
    ``canonical=False``: with :class:`NonCanonicalScored` ids)."""
    from envhub.rollout.executor import RolloutConfig, rollout

    backend = ScoredScripted(policy) if canonical else NonCanonicalScored(policy)
    config = RolloutConfig(max_length=max_length, sampling=SamplingParams(max_tokens=max_tokens))
    return [await rollout(spec, task, backend, tokenizer, config) for task in tasks]


class ReplayVLLMEngine:
    """Stands in for OpenRLHF's ``RolloutRayActor`` (a vLLM ``AsyncLLMEngine`` on a GPU): same ``generate``
    signature, real ``vllm.outputs.RequestOutput`` / ``CompletionOutput`` / ``Logprob`` objects back."""

    def __init__(self, replay: Replay, tokenizer):
        self.replay, self.tokenizer = replay, tokenizer
        self.executor = None  # OpenRLHF's generate_responses reads self.executor
        self.params_seen = []

    async def generate(self, prompt_token_ids, sampling_params, multi_modal_data=None):
        from vllm.logprobs import Logprob
        from vllm.outputs import CompletionOutput, RequestOutput

        self.params_seen.append(sampling_params)
        span = self.replay.next(prompt_token_ids, sampling_params.max_tokens)
        logprobs = None
        if sampling_params.logprobs is not None:
            logprobs = [{t: Logprob(logprob=lp, rank=1)} for t, lp in zip(span.token_ids, span.logprobs)]
        text = self.tokenizer.decode(span.token_ids, skip_special_tokens=bool(sampling_params.skip_special_tokens))
        comp = CompletionOutput(index=0, text=text, token_ids=list(span.token_ids), cumulative_logprob=None,
                                logprobs=logprobs, finish_reason=span.finish_reason)
        return RequestOutput(request_id="replay", prompt=None, prompt_token_ids=list(prompt_token_ids),
                             prompt_logprobs=None, outputs=[comp], finished=True)


class ReplayServer:
    """Stands in for one of veRL's rollout server replicas (a vLLM ``AsyncLLM`` on GPUs, as a Ray actor): same
    ``generate`` signature, a real ``verl.workers.rollout.replica.TokenOutput`` back. Wrapped with ``ray.remote``
    by the test, so veRL's real ``LLMServerClient`` and load balancer route to it over Ray."""

    def __init__(self, trajectories):
        self.replay = Replay(trajectories)
        self.requests: list[dict] = []

    async def generate(self, request_id, *, prompt_ids, sampling_params, image_data=None, video_data=None, **kw):
        from verl.workers.rollout.replica import TokenOutput

        self.requests.append({"request_id": request_id, "prompt_ids": list(prompt_ids), **dict(sampling_params)})
        span = self.replay.next(prompt_ids, sampling_params.get("max_tokens"))
        return TokenOutput(token_ids=list(span.token_ids),
                           log_probs=list(span.logprobs) if sampling_params.get("logprobs") else None,
                           stop_reason="completed", extra_fields={"global_steps": 3})  # the server's weights

    def seen(self) -> list[dict]:
        return list(self.requests)

    def clear(self) -> None:
        self.requests.clear()
