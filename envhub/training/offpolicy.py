"""Importance sampling and rejection between the rollout and the trainer's policy: TIS, MIS, IcePop (verl, slime...).

Tokens come from an inference engine (another numeric stack, and in asynchronous training an older weight
version); the loss is computed with the trainer's logprobs. The ratio ``ρ = π_train / π_rollout`` per token (or
per sequence) corrects the mismatch; extreme ratios are truncated, clipped, zeroed or their tokens rejected. All
helpers take padded ``[B, T]`` tensors (``mask`` 1 on model tokens) and return tensors to multiply into a
per-token policy-gradient loss and a mask to aggregate it with::

    w, mask = is_weights(train_logp, batch["logprobs"][:, 1:], batch["loss_mask"], level="sequence", upper=2.0)
    mask = mask * divergence_rejection_mask(train_logp, batch["logprobs"][:, 1:], batch["loss_mask"],
                                            option="seq_mean_k3", upper=0.01)
    per_token = pg_losses * w            # then aggregate over `mask`

Which trainer option each helper is (verl: ``algorithm.rollout_correction.*``; slime: flags, MIS: its ``mis.yaml``;
OpenRLHF: ``--algo.advantage.is_correction_*``):

- :func:`tis_weights` ``(upper=C, lower=c)``: verl ``rollout_is=token, rollout_is_threshold=C`` (c = 0); slime
  ``--use-tis --tis-clip C --tis-clip-low c``; OpenRLHF ``level token, mode clip, threshold c C``.
- :func:`icepop_weights` ``(lower=a, upper=b)``: verl ``rollout_is_threshold="a_b"``; slime ``--use-tis
  --tis-clip b --tis-clip-low a --custom-tis-function-path slime.backends.megatron_utils.loss.icepop_function``;
  OpenRLHF ``level token, mode mask, gating ratio, threshold a b``.
- :func:`is_weights`: the general form. ``level=sequence``: verl ``rollout_is=sequence``, MIS ``tis_level:
  sequence``; ``level=geometric``: MIS ``tis_level: geometric``; ``mode=clip | mask``: MIS ``tis_mode``;
  ``batch_normalize``: verl ``rollout_is_batch_normalize``, MIS ``tis_batch_normalize``.
- :func:`seq_mask_tis_weights` ``(lower=a, upper=b)``: OpenRLHF ``level seq, mode mask, gating ratio``.
- :func:`ratio_rejection_mask`: MIS ``use_rs, rs_level, rs_lower_bound, rs_upper_bound, rs_veto_threshold``.
- :func:`divergence_rejection_mask`: verl ``rollout_rs=<option>, rollout_rs_threshold``.

(slime's MIS is ``examples/train_infer_mismatch_helper/mis.py:compute_mis_weights_with_cp`` given to
``--custom-tis-function-path``, configured by its ``mis.yaml``.) Every helper equals the trainer's own function to
1e-6 on the same tensors: verl's in ``tests/adapters/test_offpolicy_trainers.py`` (its installed code), slime's in
``tests/training/test_offpolicy_reference.py`` (the vendored upstream text); OpenRLHF's ``PolicyLoss`` in
``tests/adapters/test_offpolicy_trainers.py`` too, through :func:`~envhub.training.policy_gradient_loss`'s ``weights``.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SAFETY_BOUND = 20.0
"""Log ratios are clamped to ±20 before ``exp``, as verl and slime's MIS do (slime's plain TIS / IcePop and OpenRLHF
do not): ``e^-20`` (2e-9) is 0 for every purpose and ``e^20`` (5e8) is above every threshold, so only a weight that
is left untruncated (MIS ``mask`` mode, :func:`seq_mask_tis_weights`) and beyond ``e^20`` differs: a sample that
far off-policy is noise either way."""

_LEVELS = ("token", "sequence", "geometric")
_MODES = ("truncate", "clip", "mask", "icepop")


def _check(logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor) -> None:
    if not (logprobs.shape == rollout_logprobs.shape == mask.shape) or logprobs.dim() != 2:
        raise ValueError(f"expected three [B, T] tensors of one shape, got logprobs {tuple(logprobs.shape)}, "
                         f"rollout_logprobs {tuple(rollout_logprobs.shape)}, mask {tuple(mask.shape)}")


def _log_ratio(logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, level: str):
    """``log ρ`` per token, or per sequence broadcast over its tokens: ``sequence`` = the sum over the sequence's
    model tokens (the product of ratios), ``geometric`` = their mean. Detached: weights change the measure, not
    the objective."""
    if level not in _LEVELS:
        raise ValueError(f"level must be one of {_LEVELS}, got {level!r}")
    log_ratio = (logprobs - rollout_logprobs).detach()
    if level == "token":
        return log_ratio
    total = (log_ratio * mask).sum(dim=-1, keepdim=True)
    if level == "geometric":
        total = total / mask.sum(dim=-1, keepdim=True).clamp(min=1)
    return total.expand_as(log_ratio)


def is_weights(
    logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    upper: float = 2.0,
    lower: float | None = None,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Importance weights ``ρ = π_train / π_rollout`` with their extremes handled, and the mask to aggregate with.

    Args:
        logprobs: ``[B, T]`` the trainer's logprobs of the sampled tokens (verl's ``old_log_prob``, slime's
            ``train_log_probs``).
        rollout_logprobs: ``[B, T]`` the inference engine's (``batch["logprobs"][:, 1:]``).
        mask: ``[B, T]`` 1 on model tokens.
        level: ``token`` (biased, low variance), ``sequence`` (product over the sequence: unbiased, high variance)
            or ``geometric`` (geometric mean over the sequence).
        mode: what happens outside ``[lower, upper]``:
            ``truncate`` caps at ``upper`` (TIS), ``clip`` clamps to ``[lower, upper]``, ``icepop`` zeroes the
            weight (the token stays in the mask, contributing 0: IcePop), ``mask`` keeps the weight but removes the
            token from the returned mask (MIS rejection: it leaves the denominator too).
        upper / lower: the bounds; ``lower=None`` means ``1 / upper`` (slime's default; unused by ``truncate``).
        batch_normalize: divide by the batch's mean weight (per token, or per sequence for the sequence levels;
            sequences with no model token do not count) so the weights average 1.

    Returns:
        ``(weights, mask)``: ``weights`` ``[B, T]`` detached, 0 off the mask; ``mask`` as given (float) unless
        ``mode="mask"`` removed tokens.
    """
    import torch  # lazily: importing envhub.training never loads torch by itself

    _check(logprobs, rollout_logprobs, mask)
    if mode not in _MODES:
        raise ValueError(f"mode must be one of {_MODES}, got {mode!r}")
    lower = 1.0 / upper if lower is None else lower
    if upper <= 0 or lower < 0 or (mode != "truncate" and lower >= upper):
        raise ValueError(f"need 0 <= lower < upper and upper > 0, got lower={lower}, upper={upper}")
    mask = given = mask.to(logprobs.dtype if logprobs.is_floating_point() else torch.float32)
    raw = torch.exp(_log_ratio(logprobs, rollout_logprobs, mask, level).clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
    inside = (raw >= lower) & (raw <= upper)
    if mode == "truncate":
        weights = raw.clamp(max=upper)
    elif mode == "clip":
        weights = raw.clamp(lower, upper) * mask
    elif mode == "icepop":
        weights = torch.where(inside, raw, torch.zeros_like(raw))
    else:
        weights, mask = raw, mask * inside.to(mask.dtype)
    if batch_normalize:
        # over the *given* mask: tokens rejected by mode="mask" still count (slime normalises over loss_masks)
        if level == "token":
            mean = (weights * given).sum() / given.sum().clamp(min=1)
        else:  # one weight per sequence: the mean over sequences that have a model token
            valid = given.sum(dim=-1) > 0
            per_seq = (weights * given).sum(dim=-1) / given.sum(dim=-1).clamp(min=1)
            mean = per_seq[valid].sum() / valid.sum().clamp(min=1)
        if mean > 1e-8:
            weights = weights / mean
    return weights.detach(), mask


def tis_weights(
    logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, *, upper: float = 2.0,
    lower: float = 0.0,
) -> torch.Tensor:
    """Token-level truncated importance sampling: ``clamp(π_train / π_rollout, lower, upper)`` on model tokens.

    slime ``--use-tis --tis-clip upper --tis-clip-low lower`` (``vanilla_tis_function``); verl
    ``rollout_is=token, rollout_is_threshold=upper`` (with ``lower=0``). Multiply into the per-token loss.
    """
    mode = "truncate" if lower == 0 else "clip"
    return is_weights(logprobs, rollout_logprobs, mask, level="token", mode=mode, upper=upper, lower=lower)[0]


def icepop_weights(
    logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, *, lower: float = 0.5,
    upper: float = 5.0, level: str = "token",
) -> torch.Tensor:
    """IcePop: the ratio where it lies in ``[lower, upper]``, 0 outside (the token contributes nothing, yet still
    counts in the loss's denominator).

    slime ``--use-tis --tis-clip upper --tis-clip-low lower --custom-tis-function-path
    slime.backends.megatron_utils.loss.icepop_function`` (token level); verl ``rollout_is=token|sequence,
    rollout_is_threshold="lower_upper"``.
    """
    return is_weights(logprobs, rollout_logprobs, mask, level=level, mode="icepop", upper=upper, lower=lower)[0]


def seq_mask_tis_weights(
    logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, *, lower: float = 0.5,
    upper: float = 5.0,
) -> torch.Tensor:
    """Sequence-gated token IS: each token keeps its own ratio ``π_train / π_rollout`` if its sequence's
    geometric-mean ratio lies in ``[lower, upper]``; every token of a sequence outside it gets 0.

    OpenRLHF ``--algo.advantage.is_correction_level seq`` (``is_correction_mode mask``, ``is_correction_gating
    ratio``, ``is_correction_threshold lower upper``): its "seq-mask-tis".
    """
    token, _ = is_weights(logprobs, rollout_logprobs, mask, level="token", mode="truncate", upper=math.inf)
    return token * ratio_rejection_mask(logprobs, rollout_logprobs, mask, level="geometric", lower=lower, upper=upper)


def ratio_rejection_mask(
    logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, *, level: str = "token",
    lower: float = 0.5, upper: float = 2.0, veto: float | None = None,
) -> torch.Tensor:
    """slime MIS rejection (``use_rs``): ``mask`` without the tokens (or sequences, by ``level``) whose ratio lies
    outside ``[lower, upper]`` (``rs_lower_bound`` / ``rs_upper_bound``), and without every sequence holding a
    token whose own ratio is below ``veto`` (``rs_veto_threshold``, e.g. 1e-4: one catastrophic token rejects its
    sequence). Multiply it into the mask from :func:`is_weights`."""
    import torch

    _check(logprobs, rollout_logprobs, mask)
    if not 0 <= lower < upper:
        raise ValueError(f"need 0 <= lower < upper, got lower={lower}, upper={upper}")
    mask = mask.float()
    ratio = torch.exp(_log_ratio(logprobs, rollout_logprobs, mask, level).clamp(-SAFETY_BOUND, SAFETY_BOUND))
    keep = mask * ((ratio >= lower) & (ratio <= upper)).float()
    if veto is not None:
        token_lr = (logprobs - rollout_logprobs).detach()
        catastrophic = ((token_lr < math.log(veto)) & mask.bool()).any(dim=-1, keepdim=True)
        keep = keep * (~catastrophic).float()
    return keep


_K1_AGGS = ("token", "sum", "mean")


def divergence_rejection_mask(
    logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor, *, option: str = "seq_mean_k1",
    upper: float = 2.0, lower: float | None = None,
) -> torch.Tensor:
    """verl ``rollout_rs``: ``mask`` without the tokens / sequences whose estimated divergence is out of bounds.

    ``option`` is ``<agg>_<estimator>`` exactly as verl names it: agg ``token``, ``seq_sum``, ``seq_mean`` or
    ``seq_max`` over the sequence's model tokens; estimator, with ``log ρ = log π_train - log π_rollout``:
    ``k1 = -log ρ`` (bounds are *ratios*: kept while ``log lower <= k1 <= log upper``; ``lower=None`` means
    ``1 / upper``), ``k2 = (log ρ)² / 2`` and ``k3 = ρ - 1 - log ρ`` (``upper`` only). ``seq_max_k1`` does not
    exist in verl either. Several options are several calls, multiplied (verl's comma list, all must pass).
    """
    import torch

    _check(logprobs, rollout_logprobs, mask)
    agg, _, estimator = option.rpartition("_")
    if agg not in ("token", "seq_sum", "seq_mean", "seq_max") or estimator not in ("k1", "k2", "k3") or (
            option == "seq_max_k1"):
        raise ValueError(f"unknown rollout_rs option {option!r} (verl's: token|seq_sum|seq_mean|seq_max _ k1|k2|k3,"
                         " no seq_max_k1)")
    if estimator == "k1":
        lower = 1.0 / upper if lower is None else lower
        if not 0 < lower <= upper:
            raise ValueError(f"k1 bounds are ratios: need 0 < lower <= upper, got lower={lower}, upper={upper}")
    elif lower is not None or upper <= 0:
        raise ValueError(f"{option} takes one positive upper bound, got lower={lower}, upper={upper}")
    log_ratio = (logprobs - rollout_logprobs).detach().clamp(-SAFETY_BOUND, SAFETY_BOUND)
    stat = {"k1": -log_ratio, "k2": 0.5 * log_ratio ** 2, "k3": torch.exp(log_ratio) - 1.0 - log_ratio}[estimator]
    on = mask.bool()
    if agg == "seq_max":
        top = stat.masked_fill(~on, float("-inf")).max(dim=-1, keepdim=True).values
        stat = torch.where(top == float("-inf"), torch.zeros_like(top), top)
    elif agg != "token":
        stat = torch.where(on, stat, 0.0).sum(dim=-1, keepdim=True)
        if agg == "seq_mean":
            stat = stat / mask.sum(dim=-1, keepdim=True).clamp(min=1)
    if estimator == "k1":
        assert lower is not None
        keep = (stat >= math.log(lower)) & (stat <= math.log(upper))
    else:
        keep = stat <= upper
    return (mask * keep.expand_as(mask).to(mask.dtype)).to(mask.dtype)
