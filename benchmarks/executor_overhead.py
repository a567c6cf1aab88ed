"""Executor overhead per turn: envhub's executor vs OpenRLHF's real ``MultiTurnAgentExecutor``, same env, same run.

Both drive the same multi-turn env (``Countdown``-style replies, ``TURNS`` turns per episode) against an *instant*
backend that returns a fixed short generation, so what is measured is the executor's own work per turn: prompt and
reply tokenization, bookkeeping, decoding, env call. OpenRLHF's env replies are rendered two ways:

* ``openrlhf (hand-formatted)``: the reply wrapped in hard-coded ChatML strings, as OpenRLHF's examples do (fast,
  but only right for one template family);
* ``openrlhf (chat template)``: the reply rendered by ``apply_chat_template`` (right for any model), which is what
  envhub does for every env.

The env and its verifier are both microseconds of pure Python and say so (``blocking = False``, as a real cheap env
and answer checker would): envhub then calls them inline instead of through a worker thread. The default,
a verifier graded in a worker thread (one ~100 µs hop per episode), is measured too and printed on its own line.

Run it with the trainer virtualenv (OpenRLHF installed there): ``.venv-trainers/bin/python
benchmarks/executor_overhead.py``. Prints µs per turn for each, the ratios, and where envhub's time goes (from the
trajectories' own stage timings). The stand-ins for the vLLM engine and its ``SamplingParams`` are named as such
(they cannot run here: no GPU).
"""
from __future__ import annotations

import asyncio
import statistics
import sys
import time
from dataclasses import dataclass, field

from envhub import EnvSpec, Response, TextEnv
from envhub.backends.base import Generation, LLMBackend
from envhub.codec.chat import ChatCodec
from envhub.rollout.executor import RolloutConfig, rollout
from envhub.verifier import FunctionVerifier

TURNS = 32
EPISODES = 40
REPEATS = 5
ANSWER = "My guess is 42."


class Loop(TextEnv):
    """Answers every guess with a short, varying hint, for TURNS turns."""

    blocking = False

    def start(self, task):
        return "Guess the number between 1 and 100. Reply with one integer."

    def respond(self, action):
        left = TURNS - self.turn
        return Response(f"{self.turn * 7 % 100} is wrong, the number is higher. Guesses left: {left}.",
                        done=left <= 0, artifacts={"answer": action.text})


def accept(task, artifacts):
    return True


SPEC = EnvSpec(id="bench-loop", env=Loop, tasks=lambda s: [{"task_id": "t"}],
               verifier=FunctionVerifier(accept, blocking=False), golden=lambda t, m: "1", max_turns=TURNS + 1)
THREADED = EnvSpec(id="bench-loop", env=Loop, tasks=lambda s: [{"task_id": "t"}], verifier=accept,
                   golden=lambda t, m: "1", max_turns=TURNS + 1)  # the default: grading in a worker thread


def load_tokenizer():
    from envhub.testing.models import load_tokenizer, resolve_model

    try:
        return load_tokenizer(resolve_model("smollm2")), "smollm2"
    except Exception:
        return load_tokenizer(resolve_model("tiny")), "tiny"


# ---- envhub ----------------------------------------------------------------------------------------------------
class InstantBackend(LLMBackend):
    def __init__(self, ids):
        self.ids = ids

    async def generate(self, prompt_ids, params, *, session_id=""):
        return Generation(list(self.ids), [-0.25] * len(self.ids))


STAGES = ("init_s", "run_s", "eval_s", "gen_s", "env_s")


async def run_envhub(tok, ids, spec=SPEC, stages: dict | None = None) -> float:
    """µs per turn; ``stages`` (if given) accumulates the trajectories' stage timings, in seconds."""
    backend, cfg = InstantBackend(ids), RolloutConfig(max_length=1_000_000)
    turns, t0 = 0, time.perf_counter()
    for _ in range(EPISODES):
        traj = await rollout(spec, {"task_id": "t"}, backend, tok, cfg)
        assert traj.finish_reason == "done", traj.error
        turns += traj.num_turns
        if stages is not None:
            for k in STAGES:
                stages[k] = stages.get(k, 0.0) + traj.metrics[k]
    if stages is not None:
        stages["turns"] = stages.get("turns", 0) + turns
    return (time.perf_counter() - t0) / turns * 1e6


# ---- OpenRLHF ----------------------------------------------------------------------------------------------------
@dataclass
class StandInSamplingParams:
    """Stand-in for vllm.SamplingParams (the fields OpenRLHF's executor touches)."""

    max_tokens: int = 64
    logprobs: int | None = 0
    temperature: float = 1.0
    stop: list = field(default_factory=list)


class _Logprob:
    def __init__(self, lp):
        self.logprob = lp


class StandInEngine:
    """Stand-in for OpenRLHF's vLLM engine handle: returns the same generation instantly (needs a GPU otherwise)."""

    def __init__(self, ids, text):
        self.ids, self.text = ids, text

    async def generate(self, prompt_ids, sampling_params, multi_modal_data=None):
        out = type("Completion", (), {})()
        out.token_ids, out.text, out.finish_reason = list(self.ids), self.text, "stop"
        out.logprobs = [{i: _Logprob(-0.25)} for i in self.ids]
        res = type("RequestOutput", (), {})()
        res.outputs = [out]
        return res


def openrlhf_agent(tok, render: str):
    import torch
    from openrlhf.utils.agent import AgentInstanceBase, MultiTurnAgentExecutor

    codec = ChatCodec(tok)

    class Agent(AgentInstanceBase):
        def __init__(self, *args, **kwargs):
            self.env = Loop()

        async def reset(self, states, **kwargs):
            self.messages, _ = self.env.reset(options={"task": {"task_id": "t"}})
            return {"observation": states["observation"]}

        async def step(self, states, **kwargs):
            text = states["action_text"]
            obs, reward, done, trunc, _ = self.env.step(text)
            if render == "hand":
                feedback = "".join(f"\n<|im_start|>{m['role']}\n{m['content']}<|im_end|>" for m in obs)
                feedback += "\n<|im_start|>assistant\n"
            else:  # the chat template's rendering of the new messages after the conversation so far
                history = self.messages + [{"role": "assistant", "content": text}]
                before = tok.apply_chat_template(history, tokenize=False)
                after = tok.apply_chat_template(history + obs, tokenize=False, add_generation_prompt=True)
                cut = before.rfind(codec.end_of_turn) + len(codec.end_of_turn)  # the model sampled up to here
                feedback = after[cut:]
                self.messages = history + obs
            return {"rewards": torch.tensor(float(reward)), "scores": torch.tensor(float(reward)),
                    "environment_feedback": feedback, "done": done or trunc}

    return MultiTurnAgentExecutor(Agent), codec


async def run_openrlhf(tok, ids, text, render: str) -> float:
    executor, codec = openrlhf_agent(tok, render)
    prompt = codec.render(Loop().reset(options={"task": {"task_id": "t"}})[0], add_generation_prompt=True)
    engine = StandInEngine(ids, text)
    turns, t0 = 0, time.perf_counter()
    for _ in range(EPISODES):
        out = await executor.execute(prompt, "", StandInSamplingParams(), 1_000_000, tok, engine)
        turns += len(out["action_ranges"])
    return (time.perf_counter() - t0) / turns * 1e6


def main() -> None:
    try:
        import openrlhf  # noqa: F401
    except ImportError:
        sys.exit("OpenRLHF is not installed here: run `bash scripts/setup-trainers.sh` and use .venv-trainers/bin/python")
    tok, name = load_tokenizer()
    codec = ChatCodec(tok)
    ids = codec.encode(ANSWER) + [codec.end_of_turn_id]
    text = ANSWER
    envhub_default = "envhub, verifier in a thread"
    results: dict[str, list[float]] = {"envhub": [], envhub_default: [], "openrlhf (hand-formatted)": [],
                                       "openrlhf (chat template)": []}
    stages: dict = {}
    for _ in range(REPEATS):  # interleaved, so drift in machine load hits every contender alike
        results["envhub"].append(asyncio.run(run_envhub(tok, ids, SPEC, stages)))
        results[envhub_default].append(asyncio.run(run_envhub(tok, ids, THREADED)))
        results["openrlhf (hand-formatted)"].append(asyncio.run(run_openrlhf(tok, ids, text, "hand")))
        results["openrlhf (chat template)"].append(asyncio.run(run_openrlhf(tok, ids, text, "template")))
    print(f"tokenizer {name}; {EPISODES} episodes x {TURNS} turns, {REPEATS} repeats, median µs per turn")
    ours = statistics.median(results["envhub"])
    for label, values in results.items():
        med = statistics.median(values)
        ratio = "" if label.startswith("envhub") else f"   openrlhf/envhub = {med / ours:.2f}x"
        print(f"  {label:30s} {med:9.1f} µs/turn{ratio}")
    per_turn = {k: stages[k] / stages["turns"] * 1e6 for k in STAGES}
    own = per_turn["run_s"] - per_turn["gen_s"] - per_turn["env_s"]
    print("envhub per turn, all repeats (the trajectories' stage timings):")
    print(f"  executor loop: decode, delta tokenization, record  {own:6.1f} µs")
    print(f"  stand-in backend (generate)                        {per_turn['gen_s']:6.1f} µs")
    print(f"  env.step (the env's own work)                      {per_turn['env_s']:6.1f} µs")
    print(f"  per episode / {TURNS}: init (env, reset, prompt)       {per_turn['init_s']:6.1f} µs")
    print(f"  per episode / {TURNS}: grading                         {per_turn['eval_s']:6.1f} µs")


if __name__ == "__main__":
    main()
