"""A policy-gradient loss over model tokens only, with the loss aggregations RL trainers use.

This is the smallest correct surrogate for group-relative training on envhub batches (what the CPU end-to-end
check trains with, and a reference for trainers): a PPO-style clipped ratio against the rollout's logprobs,
weighted by one advantage per sequence, masked so that env and prompt tokens never receive gradient::

    batch = to_tensors(trajs, pad_token_id=pad)
    adv = torch.tensor(grpo_advantages(batch["rewards"], group_keys(trajs)))
    logp = token_logprobs(model(...).logits, batch["input_ids"])
    loss = policy_gradient_loss(logp, batch["logprobs"][:, 1:], adv, batch["loss_mask"])
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def aggregate_loss(loss: torch.Tensor, mask: torch.Tensor, mode: str = "token-mean",
                   norm_length: int | None = None) -> torch.Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar over the masked tokens.

    - ``token-mean``: every model token in the batch weighs the same (DAPO; veRL's default).
    - ``seq-mean-token-mean``: mean per sequence, then over sequences (the original GRPO; long answers are
      down-weighted per token).
    - ``seq-mean-token-sum``: sum per sequence, then mean over sequences.
    - ``seq-mean-token-sum-norm``: sum per sequence divided by a constant (``norm_length``, default ``T``), then
      mean (Dr. GRPO: no length bias).
    """
    mask = mask.to(loss.dtype)
    if mode == "token-mean":
        return (loss * mask).sum() / mask.sum().clamp(min=1.0)
    per_seq = (loss * mask).sum(dim=-1)
    if mode == "seq-mean-token-mean":
        per_seq = per_seq / mask.sum(dim=-1).clamp(min=1.0)
    elif mode == "seq-mean-token-sum-norm":
        per_seq = per_seq / float(norm_length or loss.shape[-1])
    elif mode != "seq-mean-token-sum":
        raise ValueError(f"unknown loss aggregation {mode!r}; choose one of {AGG_MODES}")
    has_tokens = (mask.sum(dim=-1) > 0).to(loss.dtype)  # a sequence with no model token does not count
    return (per_seq * has_tokens).sum() / has_tokens.sum().clamp(min=1.0)


def policy_gradient_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    clip_eps_high: float | None = None,
    mode: str = "token-mean",
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """PPO-clip surrogate ``-min(ratio * A, clip(ratio) * A)`` over masked tokens.

    Args:
        logprobs: ``[B, T]`` current policy's logprobs of the taken tokens (with grad).
        old_logprobs: ``[B, T]`` logprobs the tokens were sampled with (no grad); equal to ``logprobs`` on the first
            step of on-policy training, so the ratio is 1 and this is plain REINFORCE with a group baseline.
        advantages: ``[B]`` one per sequence (broadcast over its tokens) or ``[B, T]`` per token.
        mask: ``[B, T]`` 1 on model tokens (``batch["loss_mask"]``).
        clip_eps / clip_eps_high: the clip range ``[1 - eps, 1 + eps_high]`` (DAPO's clip-higher when they differ).
        weights: ``[B, T]`` per-token factors on the surrogate (no grad): the train/rollout importance weights of
            :mod:`envhub.training.offpolicy` (TIS, IcePop, MIS), as verl, slime and OpenRLHF multiply them in.
    """
    import torch  # lazily: importing envhub.training never loads torch by itself

    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs.detach())
    high = clip_eps if clip_eps_high is None else clip_eps_high
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + high)
    per_token = -torch.minimum(ratio * advantages, clipped * advantages)
    if weights is not None:
        per_token = per_token * weights.detach()
    return aggregate_loss(per_token, mask, mode)
