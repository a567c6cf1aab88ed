"""``to_tensors`` emits per-token ``versions`` (AReaL's layout) when the trajectories carry ``response_versions``,
aligned so that ``versions[:, 1:]`` feeds :func:`~envhub.training.loglinear_proximal_logprobs` beside
``logprobs[:, 1:]`` and ``loss_mask``.

The trajectories get ``response_versions`` by attribute, so these tests hold whether or not the field is declared
on ``Trajectory`` yet (the lead adds it for #25 point 1).
"""
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))

from offpolicy_support import mutant  # noqa: E402

from envhub.rollout.trajectory import Trajectory  # noqa: E402
from envhub.training import (  # noqa: E402
    decoupled_ppo_loss, loglinear_proximal_logprobs, tensors, to_tensors, token_logprobs,
)

pytestmark = pytest.mark.timeout(60)


def versioned(prompt, response, mask, versions, task="a") -> Trajectory:
    t = Trajectory(env_id="e", task_id=task, prompt_ids=prompt, response_ids=response, response_mask=mask,
                   response_logprobs=[-0.5 if m else 0.0 for m in mask], reward=1.0)
    t.response_versions = versions
    return t


def two() -> list[Trajectory]:
    # a generation that spanned a weight update (versions 3 then 4), an env reply, then a turn at version 4
    return [versioned([10, 11, 12], [20, 21, 30, 31, 22], [1, 1, 0, 0, 1], [3, 4, -1, -1, 4]),
            versioned([10, 11], [40], [1], [5], task="b")]


def test_versions_are_laid_out_like_the_tokens_with_minus_one_elsewhere():
    b = to_tensors(two(), pad_token_id=99)
    assert b["versions"].dtype == torch.long
    assert b["versions"].tolist() == [[-1, -1, -1, 3, 4, -1, -1, 4], [-1, -1, 5, -1, -1, -1, -1, -1]]
    left = to_tensors(two(), padding_side="left")
    assert left["versions"][1].tolist() == [-1] * 7 + [5]
    cut = to_tensors(two()[:1], max_length=4)
    assert cut["versions"].tolist() == [[-1, -1, -1, 3]]


def test_a_model_token_has_a_version_exactly_where_the_loss_mask_is_one():
    b = to_tensors(two())
    assert torch.equal(b["versions"][:, 1:] >= 0, b["loss_mask"].bool())


def test_no_versions_key_without_versions():
    plain = Trajectory(env_id="e", task_id="c", prompt_ids=[1], response_ids=[2], response_mask=[1],
                       response_logprobs=[-0.1])
    assert "versions" not in to_tensors([plain])


def test_mixed_or_misaligned_versions_are_refused():
    plain = Trajectory(env_id="e", task_id="c", prompt_ids=[1], response_ids=[2], response_mask=[1],
                       response_logprobs=[-0.1])
    with pytest.raises(ValueError, match=r"trajectories \[1\] have no response_versions"):
        to_tensors([two()[0], plain])
    failed = Trajectory.failed("e", "d", "error", "backend down", prompt_ids=[1, 2])  # no token: nothing to tag
    assert to_tensors([two()[0], failed])["versions"][1].tolist() == [-1] * 8
    bad = two()[0]
    bad.response_versions = bad.response_versions[:-1]
    with pytest.raises(ValueError, match=r"trajectory 0 \(e/a\): 5 response_ids but 4 response_versions"):
        to_tensors([bad])


def test_the_batch_feeds_the_decoupled_loss_end_to_end():
    """Shapes line up from trajectories to a loss with the loglinear proximal policy: a tiny logits tensor stands
    in for a model's output (the alignment, not the model, is under test)."""
    b = to_tensors(two())
    logits = torch.randn(*b["input_ids"].shape, 100, generator=torch.Generator().manual_seed(0), requires_grad=True)
    logp = token_logprobs(logits, b["input_ids"])
    behave, mask = b["logprobs"][:, 1:], b["loss_mask"]
    prox = loglinear_proximal_logprobs(behave, logp, b["versions"][:, 1:], current_version=6)
    loss = decoupled_ppo_loss(logp, prox, behave, torch.tensor([1.0, -1.0]), mask)
    loss.backward()
    assert torch.isfinite(loss) and logits.grad.abs().sum() > 0


def test_forgetting_the_prompt_offset_fails_the_layout_test():
    broken = mutant(tensors, "torch.tensor(([-1] * len(t.prompt_ids) + _versions(t))[:n]",
                    "torch.tensor((_versions(t) + [-1] * len(t.prompt_ids))[:n]")
    original = tensors.to_tensors
    try:
        tensors.to_tensors = broken.to_tensors
        globals()["to_tensors"] = broken.to_tensors
        with pytest.raises(AssertionError):
            test_versions_are_laid_out_like_the_tokens_with_minus_one_elsewhere()
    finally:
        tensors.to_tensors = original
        globals()["to_tensors"] = original
