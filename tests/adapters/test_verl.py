"""envhub-verl against veRL 0.9's real code: the Hydra config composed with our overrides, its ``RLHFDataset``
reading our parquet, its ``AgentLoopWorker`` loading our agent-loop yaml, its ``LLMServerClient`` and sticky
``GlobalRequestLoadBalancer`` over Ray, ``generate_sequences`` to a ``DataProto``, and ``extract_reward``.

Only the vLLM server replicas (GPUs) are replaced, by Ray actors replaying envhub's own scripted rollouts
(``replay.ReplayServer``). Run in ``.venv-trainers`` (``make test-trainers``).
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainers
pytest.importorskip("verl", reason="needs the trainers venv (make test-trainers)")
ray = pytest.importorskip("ray", reason="needs the trainers venv (make test-trainers)")

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

from replay import ReplayServer, reference_rollouts  # noqa: E402

PROMPT_LEN, RESPONSE_LEN = 256, 512


@pytest.fixture(scope="module")
def ray_local():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": str(HERE)}})  # Ray workers import replay.ReplayServer
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_model_path):
    """Our generated files: the agent-loop yaml and two parquet datasets, and veRL's config composed with our
    overrides (an override naming a key veRL does not have fails here)."""
    import verl
    from hydra import compose, initialize_config_dir

    from envhub_verl import hydra_overrides, write_agent_loop_yaml, write_dataset

    out = tmp_path_factory.mktemp("verl-run")
    yaml_path = write_agent_loop_yaml(out / "envhub_agent_loop.yaml")
    files = [write_dataset(out / "gn.parquet", "guess-number", split="test", limit=3),
             write_dataset(out / "cd.parquet", "countdown", split="test", limit=2)]
    overrides = hydra_overrides(yaml_path, files[0], files[1], prompt_length=PROMPT_LEN,
                                response_length=RESPONSE_LEN, samples_per_prompt=1)
    overrides += [f"actor_rollout_ref.model.path={tiny_model_path}", "actor_rollout_ref.rollout.name=vllm",
                  "actor_rollout_ref.rollout.agent.num_workers=1"]
    with initialize_config_dir(config_dir=str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        config = compose(config_name="ppo_trainer", overrides=overrides)
    return {"config": config, "files": files, "yaml": yaml_path}


def scripted_policies():
    import envhub

    gn, cd = envhub.get_spec("guess-number"), envhub.get_spec("countdown")
    return [gn.golden, gn.golden, gn.hack_probes["claim-victory"], cd.golden, cd.noop]


def load_batch(config, files, tokenizer):
    """The gen batch exactly as veRL's trainer makes it: RLHFDataset rows -> collate_fn -> DataProto."""
    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    ds = RLHFDataset(data_files=[str(f) for f in files], tokenizer=tokenizer, config=config.data)
    batch = DataProto.from_single_dict(collate_fn([ds[i] for i in range(len(ds))]))
    batch.meta_info = {"global_steps": 1, "validate": False}
    return batch


@pytest.fixture(scope="module", params=["canonical", "non-canonical"])
def setup(ray_local, run_dir, request):
    """References from envhub's own executor (with veRL's tokenizer), two replay replicas behind veRL's real load
    balancer and client, and the real AgentLoopWorker. ``non-canonical``: the model's text sampled as byte-level ids
    (NonCanonicalScored), so a path that re-tokenizes what the model wrote cannot match the references."""
    import envhub
    from verl.experimental.agent_loop import AgentLoopWorker
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import get_router_handle

    config = run_dir["config"]
    tokenizer = AgentLoopWorker(config, llm_client=None).tokenizer  # the tokenizer veRL loads for the model
    batch = load_batch(config, run_dir["files"], tokenizer)

    async def refs():
        out = []
        for label, policy in zip(batch.non_tensor_batch["extra_info"], scripted_policies()):
            inst = json.loads(label["envhub"])
            spec = envhub.get_spec(inst["env_id"])
            task = next(r for r in spec.load_tasks(inst["split"]) if r["task_id"] == inst["task_id"])
            out += await reference_rollouts(spec, [task], policy, tokenizer, max_length=PROMPT_LEN + RESPONSE_LEN,
                                            canonical=request.param == "canonical")
        return out

    references = asyncio.run(refs())
    assert {r.reward for r in references} == {0.0, 1.0} and max(r.num_turns for r in references) > 2
    if request.param == "non-canonical":  # the case is really exercised
        spans = [[i for i, m in zip(r.response_ids, r.response_mask) if m] for r in references]
        assert any(tokenizer.encode(tokenizer.decode(s), add_special_tokens=False) != s for s in spans)
    server_cls = ray.remote(ReplayServer)
    servers = {f"replica-{i}": server_cls.options(num_cpus=0).remote(references) for i in range(2)}
    client = LLMServerClient(config, load_balancer_handle=get_router_handle(servers))
    worker = AgentLoopWorker(config, llm_client=client)
    return {"references": references, "servers": servers, "worker": worker, "batch": batch, "tokenizer": tokenizer}


def test_generate_sequences_matches_envhub_and_rewards_reach_the_trainer(setup):
    from verl.trainer.ppo.reward import extract_reward

    refs, worker, tok = setup["references"], setup["worker"], setup["tokenizer"]
    out = asyncio.run(worker.generate_sequences(setup["batch"]))
    b = out.batch
    assert b["prompts"].shape == (len(refs), PROMPT_LEN) and b["responses"].shape == (len(refs), RESPONSE_LEN)
    for i, ref in enumerate(refs):
        p, r = len(ref.prompt_ids), len(ref.response_ids)
        assert b["prompts"][i, PROMPT_LEN - p:].tolist() == ref.prompt_ids  # left-padded prompt
        assert b["attention_mask"][i, : PROMPT_LEN - p].sum() == 0
        assert b["responses"][i, :r].tolist() == ref.response_ids  # right-padded response
        assert b["response_mask"][i, :r].tolist() == ref.response_mask and b["response_mask"][i, r:].sum() == 0
        assert b["rollout_log_probs"][i, :r].tolist() == pytest.approx(ref.response_logprobs, abs=1e-6)
        assert b["input_ids"][i].tolist() == b["prompts"][i].tolist() + b["responses"][i].tolist()
        assert out.non_tensor_batch["__num_turns__"][i] == len(ref.messages)
        # the server's own version tag (its `global_steps`) reaches veRL's staleness keys
        assert out.non_tensor_batch["min_global_steps"][i] == out.non_tensor_batch["max_global_steps"][i] == 3
    assert tok.pad_token_id is not None

    rewards, extra = extract_reward(out)  # what veRL's trainer reads
    for i, ref in enumerate(refs):
        r = len(ref.response_ids)
        assert rewards[i].sum().item() == ref.reward and rewards[i, r - 1].item() == ref.reward
        assert extra["envhub_passed"][i] == float(ref.passed) and extra["envhub_error"][i] == 0.0


def test_every_turn_of_a_trajectory_is_routed_to_one_replica(setup):
    """One request id per trajectory: veRL's sticky load balancer keeps all its turns on one server."""
    refs, servers = setup["references"], setup["servers"]
    ray.get([s.clear.remote() for s in servers.values()])
    asyncio.run(setup["worker"].generate_sequences(setup["batch"]))
    where: dict[int, set[str]] = {}
    for name, server in servers.items():
        for req in ray.get(server.seen.remote()):
            ids = req["prompt_ids"]
            owner = next(i for i, ref in enumerate(refs) if (ref.prompt_ids + ref.response_ids)[: len(ids)] == ids)
            where.setdefault(owner, set()).add(name)
            assert req["logprobs"] is True and req["max_tokens"] <= RESPONSE_LEN
    multi = [i for i, ref in enumerate(refs) if ref.num_turns > 1]
    assert multi and all(len(where[i]) == 1 for i in multi)


def test_bad_instance_keeps_its_row_with_zero_reward(setup, run_dir):
    from verl.trainer.ppo.reward import extract_reward

    batch = load_batch(run_dir["config"], run_dir["files"][1:], setup["tokenizer"])
    batch.non_tensor_batch["extra_info"][0] = {"envhub": '{"env_id": "countdown", "task_id": "no-such-task"}'}
    out = asyncio.run(setup["worker"].generate_sequences(batch))
    rewards, extra = extract_reward(out)
    assert rewards[0].sum() == 0.0 and out.batch["response_mask"][0].sum() == 0
    assert extra["envhub_error"][0] == 1.0 and extra["envhub_error"][1] == 0.0
    assert out.batch["attention_mask"][0, :PROMPT_LEN].sum() > 0  # the dataset prompt keeps the row's shape
    assert "no-such-task" in out.non_tensor_batch["envhub_result"][0]["error"]


def test_cli_writes_yaml_datasets_and_overrides(tmp_path):
    out = subprocess.run([sys.executable, "-m", "envhub_verl.cli", "write-config", str(tmp_path), "--env",
                          "countdown", "--train-split", "train", "--val-split", "test", "--limit", "4"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"agent_loop_config_path={tmp_path / 'envhub_agent_loop.yaml'}" in out.stdout
    import datasets
    import yaml

    entries = yaml.safe_load((tmp_path / "envhub_agent_loop.yaml").read_text())
    assert entries == [{"name": "envhub", "_target_": "envhub_verl.EnvhubAgentLoop", "env_id": "countdown"}]
    rows = datasets.Dataset.from_parquet(str(tmp_path / "train.parquet"))
    assert len(rows) == 4 and rows[0]["agent_name"] == "envhub"
    assert json.loads(rows[0]["extra_info"]["envhub"])["env_id"] == "countdown"


def test_service_mode_takes_rollouts_from_the_rollout_service(setup, run_dir, rollout_service, tmp_path):
    """An agent-loop entry with service_urls runs its episodes on the rollout service (real HTTP); the replicas
    are never asked, and the batch still matches envhub's own trajectories."""
    import copy

    import envhub
    from verl.experimental.agent_loop import AgentLoopWorker
    from verl.trainer.ppo.reward import extract_reward

    from envhub_verl import write_agent_loop_yaml

    tok = setup["tokenizer"]
    srv = rollout_service(tok)
    config = copy.deepcopy(run_dir["config"])
    config.actor_rollout_ref.rollout.agent.agent_loop_config_path = str(
        write_agent_loop_yaml(tmp_path / "svc.yaml", name="envhub_service", service_urls=[srv.url]))
    worker = AgentLoopWorker(config, llm_client=setup["worker"].llm_client)
    batch = load_batch(config, run_dir["files"], tok)
    batch.non_tensor_batch["agent_name"][:] = "envhub_service"

    async def refs():
        out = []
        for extra in batch.non_tensor_batch["extra_info"]:
            inst = json.loads(extra["envhub"])
            spec = envhub.get_spec(inst["env_id"])
            task = next(r for r in spec.load_tasks(inst["split"]) if r["task_id"] == inst["task_id"])
            out += await reference_rollouts(spec, [task], spec.golden, tok, max_length=PROMPT_LEN + RESPONSE_LEN)
        return out

    references = asyncio.run(refs())
    ray.get([s.clear.remote() for s in setup["servers"].values()])

    async def generate():
        from envhub_verl.agent_loop import close_runners

        try:
            return await worker.generate_sequences(batch)
        finally:
            await close_runners()

    out = asyncio.run(generate())
    rewards, extra = extract_reward(out)
    for i, ref in enumerate(references):
        r = len(ref.response_ids)
        assert out.batch["responses"][i, :r].tolist() == ref.response_ids
        assert out.batch["response_mask"][i, :r].tolist() == ref.response_mask
        assert rewards[i].sum().item() == ref.reward == 1.0 and extra["envhub_error"][i] == 0.0
    assert all(ray.get(s.seen.remote()) == [] for s in setup["servers"].values())


@pytest.mark.parametrize("name, norm", [("grpo", True), ("grpo", False), ("rloo", None)])
def test_envhub_advantages_equal_verls_estimators(name, norm):
    """envhub's group advantages (usable by any trainer) agree with veRL's own GRPO, Dr. GRPO (no std) and RLOO on
    the same batch, computed from envhub's token layout (reward on the last model token)."""
    import numpy as np
    import torch
    from verl.trainer.ppo.core_algos import get_adv_estimator_fn

    from envhub.rollout.trajectory import Trajectory
    from envhub.training import dr_grpo_advantages, grpo_advantages, rloo_advantages, to_tensors

    rewards = [1.0, 0.0, 0.5, 1.0, 0.25, 0.25, 0.0, 0.75, 1.0]
    tasks = ["a", "a", "a", "b", "b", "b", "c", "c", "c"]
    trajs = [Trajectory(env_id="e", task_id=t, prompt_ids=[1, 2], response_ids=[3] * (2 + i),
                        response_mask=[1] * (2 + i), reward=r) for i, (r, t) in enumerate(zip(rewards, tasks))]
    batch = to_tensors(trajs)
    resp = slice(2, None)  # veRL's tensors cover the response only
    kwargs = {"token_level_rewards": batch["token_rewards"][:, resp], "response_mask": batch["action_mask"][:, resp],
              "index": np.array(tasks, dtype=object)}
    if norm is not None:
        kwargs["norm_adv_by_std_in_grpo"] = norm
    verl_adv, _ = get_adv_estimator_fn(name)(**kwargs)
    ours = {("grpo", True): grpo_advantages, ("grpo", False): dr_grpo_advantages,
            ("rloo", None): rloo_advantages}[(name, norm)](rewards, tasks)
    for i, t in enumerate(trajs):
        n = len(t.response_ids)
        assert torch.allclose(verl_adv[i, :n], torch.full((n,), ours[i]), atol=1e-5), (name, norm, i)


def test_a_rollout_that_crashed_mid_episode_trains_nothing_through_verl():
    from dataclasses import replace

    from envhub.rollout.trajectory import Trajectory
    from envhub_verl.agent_loop import to_agent_loop_output

    failed = Trajectory(env_id="x", task_id="y", prompt_ids=[1, 2], response_ids=[3, 4, 5, 6],
                        response_mask=[1, 1, 0, 1], response_logprobs=[-0.1, -0.2, 0.0, -0.3],
                        finish_reason="error", error="RUN: RuntimeError: env crashed mid-episode", num_turns=2)
    out = to_agent_loop_output(failed, failed.prompt_ids, with_logprobs=True)
    assert out.response_mask == [0, 0, 0, 0] and out.reward_score == 0.0
    ok = to_agent_loop_output(replace(failed, finish_reason="done", error=None), [1, 2], with_logprobs=True)
    assert ok.response_mask == [1, 1, 0, 1]
