"""Both trainer adapters refuse a trajectory marked untrainable (made by the text-only chat backend), with a message
that says why; the same trajectory unmarked converts (so the refusal is the mark, nothing else)."""
from __future__ import annotations

import asyncio

import pytest

pytestmark = pytest.mark.trainers


@pytest.fixture(scope="module")
def golden_traj(tiny_tokenizer):
    import envhub
    from envhub.backends.scripted import ScriptedBackend
    from envhub.rollout.executor import rollout

    spec = envhub.get_spec("guess-number")
    task = list(spec.load_tasks("test"))[0]
    return asyncio.run(rollout(spec, task, ScriptedBackend(spec.golden), tiny_tokenizer))


def test_openrlhf_adapter_refuses_untrainable(golden_traj):
    pytest.importorskip("openrlhf", reason="needs the trainers venv (make test-trainers)")
    from envhub.backends.chat import UntrainableTrajectory, mark_untrainable
    from envhub_openrlhf.executor import to_openrlhf_output

    assert to_openrlhf_output(golden_traj, prompt="p", label="l")  # unmarked: converts
    marked = mark_untrainable(type(golden_traj).from_dict(golden_traj.to_dict()))
    with pytest.raises(UntrainableTrajectory, match="OpenRLHF cannot train on .*text-only chat backend"):
        to_openrlhf_output(marked, prompt="p", label="l")


def test_verl_adapter_refuses_untrainable(golden_traj):
    pytest.importorskip("verl", reason="needs the trainers venv (make test-trainers)")
    from envhub.backends.chat import UntrainableTrajectory, mark_untrainable
    from envhub_verl.agent_loop import to_agent_loop_output

    assert to_agent_loop_output(golden_traj, list(golden_traj.prompt_ids), with_logprobs=True)
    marked = mark_untrainable(type(golden_traj).from_dict(golden_traj.to_dict()))
    with pytest.raises(UntrainableTrajectory, match="veRL cannot train on .*text-only chat backend"):
        to_agent_loop_output(marked, list(marked.prompt_ids), with_logprobs=True)
