"""The off-policy helpers' own contract: what they reduce to on-policy, and clear errors on bad input.

(Their equality with AReaL, slime and verl is in ``test_offpolicy_reference.py`` and
``tests/adapters/test_offpolicy_trainers.py``.)
"""
from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from envhub.training import (  # noqa: E402
    Rejection, behave_rejection, decoupled_ppo_loss, divergence_rejection_mask, icepop_weights, is_weights,
    loglinear_proximal_logprobs, policy_gradient_loss, ratio_rejection_mask, seq_mask_tis_weights, tis_weights,
)

pytestmark = pytest.mark.timeout(60)


def tensors(seed=0, B=4, T=10):
    g = torch.Generator().manual_seed(seed)
    behave = -torch.rand(B, T, generator=g) * 3 - 0.1
    logp = (behave + torch.randn(B, T, generator=g) * 0.3).requires_grad_()
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[:, 0] = True
    return logp, behave, mask, torch.randn(B, generator=g)


def test_importing_envhub_training_does_not_import_torch():
    """Not even when the helpers are looked up: torch is imported by the first call."""
    code = ("import sys, envhub.training as t; t.is_weights, t.decoupled_ppo_loss, t.Rejection(); "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_naive_ppo_is_the_decoupled_loss_with_the_behaviour_policy_as_proximal():
    """With π_prox = π_behave and no behaviour weight, decoupled PPO is the existing PPO-clip loss (token-mean)."""
    logp, behave, mask, adv = tensors()
    ours = decoupled_ppo_loss(logp, behave, behave, adv, mask, eps_clip_higher=0.28, rejection=None)
    plain = policy_gradient_loss(logp, behave, adv, mask.float(), clip_eps=0.2, clip_eps_high=0.28)
    torch.testing.assert_close(ours, plain)


def test_on_policy_every_correction_is_the_identity():
    logp, behave, mask, adv = tensors()
    same = logp.detach()
    for level in ("token", "sequence", "geometric"):
        w, m = is_weights(same, same, mask, level=level, mode="mask")
        assert torch.equal(w, mask.float()) and torch.equal(m, mask.float())
    assert torch.equal(tis_weights(same, same, mask), mask.float())
    assert torch.equal(icepop_weights(same, same, mask), mask.float())
    assert torch.equal(seq_mask_tis_weights(same, same, mask), mask.float())
    plain = policy_gradient_loss(logp, behave, adv, mask.float())
    assert torch.equal(policy_gradient_loss(logp, behave, adv, mask.float(), weights=mask.float()), plain)
    assert torch.equal(ratio_rejection_mask(same, same, mask, veto=1e-4), mask.float())
    for option, upper in (("token_k1", 1.01), ("seq_mean_k1", 1.01), ("seq_sum_k2", 0.01), ("seq_max_k3", 0.01)):
        assert torch.equal(divergence_rejection_mask(same, same, mask.float(), option=option, upper=upper),
                           mask.float())
    new_mask, weight = behave_rejection(same, same, mask, Rejection(level="sequence", upper=1.01, lower=0.99))
    assert torch.equal(new_mask, mask) and torch.equal(weight, mask.float())
    versions = torch.where(mask, 4, -1)
    assert torch.equal(loglinear_proximal_logprobs(same, same, versions, current_version=5), same)


def test_loglinear_interpolates_by_version_age():
    behave, cur = torch.zeros(1, 4), torch.ones(1, 4)
    versions = torch.tensor([[-1, 4, 3, 0]])  # prompt, one version old, two, five
    prox = loglinear_proximal_logprobs(behave, cur, versions, current_version=5)
    torch.testing.assert_close(prox, torch.tensor([[0.0, 0.0, 0.5, 0.8]]))


def test_a_rejected_token_leaves_the_numerator_not_the_denominator():
    logp, behave, mask, adv = tensors()
    prox = behave.clone()
    prox[0, 0] = behave[0, 0] + 5.0  # ratio e^5 > 5: rejected
    full = decoupled_ppo_loss(logp, prox, behave, adv, mask, rejection=Rejection(upper=1e9))
    rejected = decoupled_ppo_loss(logp, prox, behave, adv, mask)
    lone = decoupled_ppo_loss(logp, prox, behave, adv, mask & (torch.arange(mask.numel()).view_as(mask) == 0),
                              rejection=Rejection(upper=1e9)) / mask.sum()  # token (0, 0)'s term, as a share
    torch.testing.assert_close(rejected, full - lone)


@pytest.mark.parametrize("kwargs, message", [
    ({"level": "turn"}, "level"), ({"action": "drop"}, "action"), ({"metric": "kl"}, "metric"),
    ({"agg": "median", "level": "sequence"}, "agg"), ({"upper": 1.0}, "> 1"), ({"lower": 0.0}, "> 0"),
    ({"upper": 2.0, "lower": 3.0}, "above upper"), ({"metric": "kl_k2", "upper": 0.0}, "> 0"),
    ({"action": "clamp", "metric": "kl_k3", "upper": 1.0}, "metric='ratio'"),
])
def test_rejection_refuses_what_areal_refuses(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Rejection(**kwargs)


def test_bad_tensors_are_refused_with_a_reason():
    logp, behave, mask, adv = tensors()
    versions = torch.where(mask, 3, -1)
    with pytest.raises(ValueError, match="newer than current_version"):
        loglinear_proximal_logprobs(behave, logp, versions, current_version=2)
    with pytest.raises(ValueError, match="integer"):
        loglinear_proximal_logprobs(behave, logp, versions.float(), current_version=5)
    with pytest.raises(ValueError, match="shapes differ"):
        loglinear_proximal_logprobs(behave, logp[:, :-1], versions, current_version=5)
    with pytest.raises(ValueError, match="advantages"):
        decoupled_ppo_loss(logp, behave, behave, adv[:-1], mask)
    with pytest.raises(ValueError, match="c_clip"):
        decoupled_ppo_loss(logp, behave, behave, adv, mask, c_clip=1.0)
    with pytest.raises(ValueError, match=r"\[B, T\]"):
        is_weights(logp, behave[:, :-1], mask)
    with pytest.raises(ValueError, match="mode"):
        is_weights(logp, behave, mask, mode="cap")
    with pytest.raises(ValueError, match="level"):
        is_weights(logp, behave, mask, level="turn")
    with pytest.raises(ValueError, match="lower < upper"):
        icepop_weights(logp, behave, mask, lower=5.0, upper=2.0)
    with pytest.raises(ValueError, match="lower < upper"):
        ratio_rejection_mask(logp, behave, mask, lower=2.0, upper=0.5)
    with pytest.raises(ValueError, match="unknown rollout_rs option"):
        divergence_rejection_mask(logp, behave, mask, option="seq_max_k1")
    with pytest.raises(ValueError, match="one positive upper"):
        divergence_rejection_mask(logp, behave, mask, option="token_k3", upper=0.1, lower=0.01)
