"""envhub-openrlhf against OpenRLHF 0.11's real code: its agent-file loader, its rollout actor's
``generate_responses``, and its sample building (``SamplesGenerator._process_response_into_experience``).

Only the vLLM engine (a GPU) is replaced, by a replay of envhub's own scripted rollouts (``replay.py``); the
sampling params are real ``vllm.SamplingParams`` built as OpenRLHF builds them, the engine's outputs real
``vllm`` output objects. Run in ``.venv-trainers`` (``make test-trainers``).
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainers
pytest.importorskip("openrlhf", reason="needs the trainers venv (make test-trainers)")
pytest.importorskip("vllm", reason="needs the trainers venv (make test-trainers)")

sys.path.insert(0, str(Path(__file__).parent))

from replay import Replay, ReplayVLLMEngine, reference_rollouts  # noqa: E402

MAX_LEN = 1024


def openrlhf_sampling_params(max_new_tokens=256, logprobs=True):
    """Exactly what OpenRLHF's SamplesGenerator._dispatch_prompts_to_vllm builds."""
    from vllm import SamplingParams

    return SamplingParams(temperature=1.0, top_p=1.0, top_k=-1, max_tokens=max_new_tokens, min_tokens=1,
                          skip_special_tokens=False, logprobs=1 if logprobs else None)


def scripted_cases():
    """(spec, task, policy) triples: golden and known-bad players on a multi-turn and a single-turn env."""
    import envhub

    gn, cd = envhub.get_spec("guess-number"), envhub.get_spec("countdown")
    gn_tasks, cd_tasks = list(gn.load_tasks("test"))[:3], list(cd.load_tasks("test"))[:2]
    return [(gn, gn_tasks[0], gn.golden), (gn, gn_tasks[1], gn.golden),
            (gn, gn_tasks[2], gn.hack_probes["claim-victory"]),
            (cd, cd_tasks[0], cd.golden), (cd, cd_tasks[1], cd.noop)]


@pytest.fixture(scope="module", params=["canonical", "non-canonical"])
def references(tiny_tokenizer, request):
    """Reference rollouts; ``non-canonical``: the model's text sampled as byte-level ids (see NonCanonicalScored),
    so an adapter path that re-tokenizes what the model wrote cannot match them."""
    async def build():
        out = []
        for spec, task, policy in scripted_cases():
            out += await reference_rollouts(spec, [task], policy, tiny_tokenizer, max_length=MAX_LEN,
                                            canonical=request.param == "canonical")
        return out

    refs = asyncio.run(build())
    assert {r.reward for r in refs} == {0.0, 1.0} and max(r.num_turns for r in refs) > 2  # a meaningful mix
    if request.param == "non-canonical":  # the case is really exercised
        spans = [[i for i, m in zip(r.response_ids, r.response_mask) if m] for r in refs]
        assert any(tiny_tokenizer.encode(tiny_tokenizer.decode(s), add_special_tokens=False) != s for s in spans)
    return refs


@pytest.fixture
def agent_executor(tmp_path):
    """Our agent file, loaded by OpenRLHF's own loader."""
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor
    from openrlhf.utils.agent import AgentExecutorBase

    from envhub_openrlhf import write_agent_file

    path = write_agent_file(tmp_path / "envhub_agent.py", split="test")
    executor = _load_agent_executor(str(path))
    assert isinstance(executor, AgentExecutorBase) and type(executor).__name__ == "AgentExecutor"
    return executor


def label_of(t) -> str:
    return json.dumps({"env_id": t.env_id, "task_id": t.task_id})


def generate_responses(engine, **kw):
    """OpenRLHF's RolloutRayActor.generate_responses (the real method, unbound from its Ray actor class)."""
    from openrlhf.trainer.ray.vllm_engine import RolloutRayActor

    cls = RolloutRayActor.__ray_metadata__.modified_class
    return cls.generate_responses(engine, **kw)


def build_experience(response):
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    gen = SamplesGenerator.__new__(SamplesGenerator)  # the method reads only its arguments
    return gen._process_response_into_experience(response, max_len=MAX_LEN)


def test_agent_file_runs_through_openrlhf_and_matches_envhub(references, agent_executor, tiny_tokenizer):
    engine = ReplayVLLMEngine(Replay(references), tiny_tokenizer)
    engine.executor = agent_executor

    async def run_all():
        return [await generate_responses(engine, prompt=f"{r.env_id}/{r.task_id}", label=label_of(r),
                                         sampling_params=openrlhf_sampling_params(), max_length=MAX_LEN,
                                         hf_tokenizer=tiny_tokenizer, num_samples=2)
                for r in references]

    results = asyncio.run(run_all())
    for ref, responses in zip(references, results):
        assert len(responses) == 2  # num_samples executions, each its own episode
        for resp in responses:
            p = len(ref.prompt_ids)
            assert resp["observation_tokens"] == ref.prompt_ids + ref.response_ids
            assert resp["action_ranges"] == [(p + s, p + e) for s, e in ref.action_ranges]
            assert isinstance(resp["reward"], float) and resp["reward"] == ref.reward
            assert resp["extra_logs"]["envhub_passed"] == float(ref.passed)
            # the weight version that sampled it (the engine's lifecycle: version 0, nothing updated it)
            assert resp["extra_logs"]["envhub_version_min"] == resp["extra_logs"]["envhub_version_max"] == 0.0

            exp = build_experience(resp)
            assert exp.sequences[0].tolist() == ref.prompt_ids + ref.response_ids
            assert exp.action_mask[0].tolist() == ([0] * p + ref.response_mask)[1:]
            expected_lp = ([0.0] * p + ref.response_logprobs)[1:]
            assert exp.rollout_log_probs[0].tolist() == pytest.approx(expected_lp, abs=1e-6)
            assert exp.rewards.tolist() == [ref.reward] and exp.scores.tolist() == [ref.reward]
            assert exp.truncated.tolist() == [ref.finish_reason == "length"]
            assert exp.info["envhub_error"].tolist() == [0.0]
    # every turn asked the engine for at most the trainer's per-turn cap, with the trainer's own params
    assert all(sp.max_tokens <= 256 and sp.skip_special_tokens is False for sp in engine.params_seen)


def test_no_logprobs_requested_gives_none_like_openrlhf(references, agent_executor, tiny_tokenizer):
    ref = references[0]
    engine = ReplayVLLMEngine(Replay([ref]), tiny_tokenizer)
    resp = asyncio.run(agent_executor.execute(prompt="p", label=label_of(ref),
                                              sampling_params=openrlhf_sampling_params(logprobs=False),
                                              max_length=MAX_LEN, hf_tokenizer=tiny_tokenizer, llm_engine=engine))
    assert resp["rollout_log_probs"] is None
    assert resp["observation_tokens"] == ref.prompt_ids + ref.response_ids
    assert build_experience(resp).rollout_log_probs is None


def test_token_budget_cut_is_truncated(references, agent_executor, tiny_tokenizer):
    """``truncated`` with OpenRLHF 0.11's meaning (``AgentExecutorBase.execute``: the last generation's
    ``finish_reason == "length"``): a budget that cuts the second model turn is truncated; one that runs out right
    after it ended on its own (its end-of-turn token in, the env reply not) is not (#13; before, both were)."""
    ref = next(r for r in references if r.num_turns > 2)
    start, end = ref.action_ranges[1]
    assert end - start >= 2
    for cut_at, truncated in ((start + 1, True), (end, False)):
        engine = ReplayVLLMEngine(Replay([ref]), tiny_tokenizer)
        budget = len(ref.prompt_ids) + cut_at
        resp = asyncio.run(agent_executor.execute(prompt="p", label=label_of(ref),
                                                  sampling_params=openrlhf_sampling_params(), max_length=budget,
                                                  hf_tokenizer=tiny_tokenizer, llm_engine=engine))
        assert len(resp["observation_tokens"]) == budget
        assert resp["observation_tokens"] == (ref.prompt_ids + ref.response_ids)[:budget]
        assert resp["action_ranges"][-1][1] == budget
        assert resp["truncated"] is truncated, cut_at
        assert build_experience(resp).truncated.tolist() == [truncated]


def test_bad_label_keeps_a_well_formed_untrained_row(agent_executor, tiny_tokenizer):
    engine = ReplayVLLMEngine(Replay([]), tiny_tokenizer)
    for label in ['{"env_id": "countdown"}', "not json", '{"env_id": "no-such-env", "task_id": "x"}',
                  '{"env_id": "countdown", "task_id": "missing"}']:
        resp = asyncio.run(agent_executor.execute(prompt="what the dataset said", label=label,
                                                  sampling_params=openrlhf_sampling_params(), max_length=MAX_LEN,
                                                  hf_tokenizer=tiny_tokenizer, llm_engine=engine))
        assert resp["reward"] == 0.0 and resp["action_ranges"] == []
        assert resp["extra_logs"]["envhub_error"] == 1.0
        assert resp["observation_tokens"]  # the row still has a sequence
        exp = build_experience(resp)
        assert exp.action_mask.sum() == 0  # nothing of it is trained on
    assert engine.replay.calls == []  # and the engine was never asked


def test_event_loop_is_never_blocked_by_a_slow_env(agent_executor, tiny_tokenizer):
    """OpenRLHF runs execute() on its vLLM actor's event loop: a slow (blocking) env step must not stall it."""
    import envhub
    from envhub import EnvSpec, Response, TextEnv
    from envhub.plugins import default_hub

    class SlowEcho(TextEnv):
        def start(self, task):
            return f"Say {task['word']}."

        def respond(self, action):
            time.sleep(0.4)  # a blocking env: a sandbox command, a test run...
            return Response("ok", done=True, artifacts={"answer": action.text})

    spec = EnvSpec(id="slow-echo-openrlhf", env=SlowEcho, tasks=lambda split: [{"task_id": "w", "word": "hi"}],
                   verifier=lambda task, art: art["answer"] == task["word"], golden=lambda task, m: task["word"])
    default_hub().register(spec)
    refs = asyncio.run(reference_rollouts(spec, [{"task_id": "w", "word": "hi"}], spec.golden, tiny_tokenizer))
    assert refs[0].reward == 1.0 and envhub.get_spec(spec.id) is spec
    engine = ReplayVLLMEngine(Replay(refs), tiny_tokenizer)

    async def main():
        gaps, stop = [], asyncio.Event()

        async def heartbeat():
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0.01)
                now = time.perf_counter()
                gaps.append(now - last)
                last = now

        hb = asyncio.create_task(heartbeat())
        resp = await agent_executor.execute(prompt="p", label=json.dumps({"env_id": spec.id, "task_id": "w"}),
                                            sampling_params=openrlhf_sampling_params(), max_length=MAX_LEN,
                                            hf_tokenizer=tiny_tokenizer, llm_engine=engine)
        stop.set()
        await hb
        return resp, max(gaps)

    resp, worst = asyncio.run(main())
    assert resp["reward"] == 1.0
    assert worst < 0.2, f"the event loop stalled for {worst:.3f}s while the env stepped"


def test_cli_writes_agent_file_dataset_and_prints_flags(tmp_path):
    agent, data = tmp_path / "agent.py", tmp_path / "cd.jsonl"
    out = subprocess.run([sys.executable, "-m", "envhub_openrlhf.cli", "write-agent-file", str(agent),
                          "--env", "countdown", "--split", "test", "--dataset", str(data), "--limit", "3"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--train.agent_func_path" in out.stdout and str(agent) in out.stdout
    assert "--data.label_key label" in out.stdout
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(rows) == 3 and json.loads(rows[0]["label"])["env_id"] == "countdown"
    assert "options = {" in agent.read_text() and "'env_id': 'countdown'" in agent.read_text()
    bad = subprocess.run([sys.executable, "-m", "envhub_openrlhf.cli", "write-agent-file", str(tmp_path / "a.txt")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and ".py" in bad.stderr


def test_service_mode_takes_rollouts_from_the_rollout_service(tmp_path, tiny_tokenizer, rollout_service):
    """With service_urls configured, episodes run on the rollout service (real HTTP): the trainer's engine is never
    asked, and the result is the service's trajectory in OpenRLHF's layout."""
    import envhub
    from openrlhf.trainer.ray.vllm_engine import _load_agent_executor

    from envhub_openrlhf import write_agent_file

    srv = rollout_service(tiny_tokenizer)
    executor = _load_agent_executor(str(write_agent_file(tmp_path / "svc_agent.py", service_urls=[srv.url])))
    engine = ReplayVLLMEngine(Replay([]), tiny_tokenizer)  # answers nothing: must not be called

    gn, cd = envhub.get_spec("guess-number"), envhub.get_spec("countdown")
    cases = [(gn, list(gn.load_tasks("test"))[4]), (cd, list(cd.load_tasks("test"))[5])]

    async def run():
        out = []
        for spec, task in cases:
            ref = (await reference_rollouts(spec, [task], spec.golden, tiny_tokenizer, max_length=MAX_LEN))[0]
            label = json.dumps({"env_id": spec.id, "task_id": task["task_id"], "split": "test"})
            resp = await executor.execute(prompt="p", label=label, sampling_params=openrlhf_sampling_params(),
                                          max_length=MAX_LEN, hf_tokenizer=tiny_tokenizer, llm_engine=engine)
            out.append((ref, resp))
        await executor.aclose()
        return out

    for ref, resp in asyncio.run(run()):
        p = len(ref.prompt_ids)
        assert resp["extra_logs"]["envhub_error"] == 0.0, resp
        assert resp["observation_tokens"] == ref.prompt_ids + ref.response_ids
        assert resp["action_ranges"] == [(p + s, p + e) for s, e in ref.action_ranges]
        assert resp["reward"] == ref.reward == 1.0
        assert build_experience(resp).action_mask[0].tolist() == ([0] * p + ref.response_mask)[1:]
    assert engine.replay.calls == []


def failed_and_ok_trajectories():
    from dataclasses import replace

    from envhub.rollout.trajectory import Trajectory

    failed = Trajectory(env_id="x", task_id="y", prompt_ids=[1, 2], response_ids=[3, 4, 5, 6],
                        response_mask=[1, 1, 0, 1], response_logprobs=[-0.1, -0.2, 0.0, -0.3],
                        finish_reason="error", error="RUN: RuntimeError: env crashed mid-episode", num_turns=2)
    return failed, replace(failed, finish_reason="done", error=None)


def test_a_rollout_that_crashed_mid_episode_trains_nothing_through_openrlhf():
    from envhub_openrlhf.executor import to_openrlhf_output

    failed, ok = failed_and_ok_trajectories()
    out = to_openrlhf_output(failed, prompt="p", label="l")
    assert out["action_ranges"] == [] and out["reward"] == 0.0 and out["extra_logs"]["envhub_error"] == 1.0
    assert build_experience(out).action_mask.sum() == 0  # OpenRLHF's own experience: no trained position
    assert to_openrlhf_output(ok, prompt="p", label="l")["action_ranges"] == [(2, 4), (5, 6)]
