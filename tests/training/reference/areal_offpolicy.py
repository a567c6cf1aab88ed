# ruff: noqa
# Vendored VERBATIM by tests/training/reference/vendor.py (do not edit; rerun it).
# Source: https://github.com/inclusionAI/AReaL at commit 4aef98d8d818af55b43621aaadba047ae10f4e77
#   areal/utils/constants.py
#   areal/utils/data.py
#   areal/api/cli_args.py
#   areal/utils/functional/functional.py
#   areal/trainer/ppo/actor.py
# Apache License 2.0 (the upstream project's licence). Only the import lines above the copied
# definitions are ours.



import warnings
from dataclasses import dataclass, field
from enum import Enum

import torch



# ---- areal/utils/constants.py


class ProxLogpMethod(str, Enum):
    """Method for computing proximal policy log-probabilities in decoupled PPO.

    Attributes:
        RECOMPUTE: Standard decoupled PPO - recompute via forward pass.
        LOGLINEAR: Use log-linear approximation (skip forward pass).
        METRICS: Recompute + compute approximation metrics for evaluation.
    """

    RECOMPUTE = "recompute"
    LOGLINEAR = "loglinear"
    METRICS = "metrics"

    def skips_forward_pass(self) -> bool:
        """Return True if this method skips the forward pass (optimization enabled)."""
        return self == ProxLogpMethod.LOGLINEAR


class ProxApproxMethod(str, Enum):
    """Approximation method for proximal policy log-probabilities.

    Attributes:
        LOGLINEAR: Log-linear interpolation in log-space (geometric mean in prob space).
        LINEAR: Linear interpolation in probability space (arithmetic mean).
        ROLLOUT: Use behavior policy from rollout as-is (no approximation).
    """

    LOGLINEAR = "loglinear"
    LINEAR = "linear"
    ROLLOUT = "rollout"


PROX_APPROX_METHOD_LOGLINEAR = ProxApproxMethod.LOGLINEAR.value


PROX_APPROX_METHOD_LINEAR = ProxApproxMethod.LINEAR.value


PROX_APPROX_METHOD_ROLLOUT = ProxApproxMethod.ROLLOUT.value


PROX_APPROX_METHODS_ALL = [m.value for m in ProxApproxMethod]


# ---- areal/utils/data.py


class KLEstimator:
    """
    KL divergence estimator, supports k1, k2 and k3.
    """

    def __init__(self, kl_estimator: str = "k1", apply_clamp: bool = True):
        self.kl_estimator = kl_estimator
        if kl_estimator not in ["k1", "k2", "k3"]:
            raise ValueError(
                f"Invalid KL estimator: {kl_estimator}. Valid choices: k1, k2, k3"
            )
        self.apply_clamp = apply_clamp

    def __call__(
        self, log_probs: torch.Tensor, log_probs_base: torch.Tensor
    ) -> torch.Tensor:
        return self._compute_approx_kl(
            log_probs, log_probs_base, self.kl_estimator, self.apply_clamp
        )

    # adapted from https://github.com/OpenRLHF/OpenRLHF/blob/main/openrlhf/models/utils.py#L7
    @staticmethod
    def _compute_approx_kl(
        log_probs: torch.Tensor,
        log_probs_base: torch.Tensor,
        kl_estimator: str = "k1",
        apply_clamp: bool = True,
    ) -> torch.Tensor:
        """
        Compute the approximate KL divergence between two distributions.
        Schulman blog: http://joschu.net/blog/kl-approx.html

        Args:
            log_probs: Log probabilities of the new distribution.
            log_probs_base: Log probabilities of the base distribution.
        """

        if kl_estimator == "k1":
            log_ratio = log_probs.float() - log_probs_base.float()

        # The k2 estimator is the non negative kl approximation in
        # http://joschu.net/blog/kl-approx.html
        # The k2_loss is approximately equivalent to the
        # one-step KL divergence penalty with the k1 estimator
        # used in https://arxiv.org/pdf/2310.10505.
        if kl_estimator == "k2":
            log_ratio = log_probs.float() - log_probs_base.float()
            log_ratio = log_ratio**2 / 2.0

        # The k3 estimator is the non negative kl approximation in
        # http://joschu.net/blog/kl-approx.html
        if kl_estimator == "k3":
            log_ratio = log_probs.float() - log_probs_base.float()
            log_ratio = -log_ratio
            log_ratio = log_ratio.exp() - 1 - log_ratio

        if apply_clamp:
            log_ratio = log_ratio.clamp(min=-10, max=10)
        return log_ratio


# ---- areal/api/cli_args.py


@dataclass
class RejectionSamplingConfig:
    """Unified configuration for sample filtering based on policy divergence.

    Filters tokens/sequences where the divergence between proximal policy
    and behavior policy exceeds a threshold, via two action modes:
    - 'mask': zero out loss_mask (rejection, exclude from gradient)
    - 'clamp': clamp importance weight to bounds (truncation, bounded gradient)

    Supports direct ratio bounds and KL divergence estimators (K1/K2/K3),
    at both token-level and sequence-level granularity.

    Replaces the removed ``behave_imp_weight_cap`` and ``behave_imp_weight_mode``.

    Attributes:
        level: Filtering granularity ('token' or 'sequence'). When ``level='sequence'``
            and ``metric='ratio'``, both the filtering decision and the correction
            weight (behave_imp_weight) use the sequence-level geometric mean,
            matching the old ``sequence_mask``/``sequence_truncate`` semantics.
        action: Action mode ('mask' or 'clamp').
        metric: Divergence metric ('ratio', 'kl_k1', 'kl_k2', 'kl_k3').
        agg: Aggregation method for sequence-level ('sum', 'mean', 'max').
            For 'ratio' metric, aggregation is performed in log space (geometric
            mean/sum) to avoid the "length trap" and match GSPO semantics.
            For KL metrics, aggregation is arithmetic.
        upper: Upper bound for filtering.
        lower: Lower bound for filtering (optional).
    """

    level: str = field(
        default="token",
        metadata={
            "help": "Filtering granularity. "
            "'token': per-token filtering (each token judged independently). "
            "'sequence': per-sequence filtering (all tokens in a sequence share the same fate). "
            "When metric='ratio', both the filtering decision and the correction weight "
            "(behave_imp_weight) operate at sequence level using the geometric mean.",
            "choices": ["token", "sequence"],
        },
    )
    action: str = field(
        default="mask",
        metadata={
            "help": "Action to take when metric exceeds threshold. "
            "'mask': zero out loss_mask for filtered tokens/sequences (rejection, "
            "completely excludes from gradient computation). "
            "'clamp': clamp importance weight to [lower, upper] bounds (truncation, "
            "tokens still participate in gradient but with bounded weight).",
            "choices": ["mask", "clamp"],
        },
    )
    metric: str = field(
        default="ratio",
        metadata={
            "help": "Divergence metric for filtering. "
            "'ratio': direct importance ratio π_proximal/π_behave. "
            "'kl_k1': KL estimator k1 = log(r), forward KL unbiased estimator (can be negative). "
            "'kl_k2': KL estimator k2 = 0.5 * (log r)^2, non-negative quadratic approximation. "
            "'kl_k3': KL estimator k3 = r - log(r) - 1, non-negative exact forward KL estimator.",
            "choices": ["ratio", "kl_k1", "kl_k2", "kl_k3"],
        },
    )
    agg: str = field(
        default="mean",
        metadata={
            "help": "Aggregation method for sequence-level filtering. "
            "Only used when level='sequence'. "
            "For 'ratio' metric, aggregation is in log space: "
            "'sum' = exp(sum(log(r_i))), 'mean' = exp(mean(log(r_i))) = geometric mean "
            "(length-invariant, consistent with GSPO). "
            "For KL metrics, aggregation is arithmetic: "
            "'sum' = sum(kl_i), 'mean' = mean(kl_i). "
            "'max': max of per-token metric values (most conservative).",
            "choices": ["sum", "mean", "max"],
        },
    )
    upper: float = field(
        default=5.0,
        metadata={
            "help": "Upper bound for filtering. "
            "Tokens/sequences with metric > upper are filtered out (loss_mask zeroed). "
            "For 'ratio' metric: must be > 1.0, typical values are 2.0 or 5.0. "
            "For 'kl_k2'/'kl_k3' metrics: typical values are 0.5-2.0."
        },
    )
    lower: float | None = field(
        default=None,
        metadata={
            "help": "Lower bound for filtering (optional). "
            "None means no lower bound. "
            "For 'ratio' metric: typical value is 0.5 (filter out tokens where policy "
            "probability dropped significantly). Must be > 0. "
            "For 'kl_k1' metric: can be used to filter negative KL estimates."
        },
    )

    def __post_init__(self):
        """Validate configuration."""
        import warnings

        _VALID_LEVELS = ("token", "sequence")
        _VALID_ACTIONS = ("mask", "clamp")
        _VALID_METRICS = ("ratio", "kl_k1", "kl_k2", "kl_k3")
        _VALID_AGGS = ("sum", "mean", "max")

        # Validate enum-like fields.
        if self.level not in _VALID_LEVELS:
            raise ValueError(
                f"level must be one of {_VALID_LEVELS}, got '{self.level}'"
            )
        if self.action not in _VALID_ACTIONS:
            raise ValueError(
                f"action must be one of {_VALID_ACTIONS}, got '{self.action}'"
            )
        if self.metric not in _VALID_METRICS:
            raise ValueError(
                f"metric must be one of {_VALID_METRICS}, got '{self.metric}'"
            )
        if self.agg not in _VALID_AGGS:
            raise ValueError(f"agg must be one of {_VALID_AGGS}, got '{self.agg}'")

        # Validate lower <= upper when both are set.
        if self.lower is not None and self.lower > self.upper:
            raise ValueError(
                f"lower ({self.lower}) cannot be greater than upper ({self.upper})"
            )

        # For ratio metric, upper must be > 1.0 (otherwise all non-identical policy tokens are filtered).
        if self.metric == "ratio":
            if self.upper <= 1.0:
                raise ValueError(
                    f"upper must be > 1.0 for 'ratio' metric (otherwise all non-identical "
                    f"policy tokens will be filtered), got {self.upper}"
                )
            if self.lower is not None and self.lower <= 0:
                raise ValueError(
                    f"lower must be positive for 'ratio' metric, got {self.lower}"
                )
        # For KL metrics, upper must be > 0.
        # Note: kl_k1 is excluded because it is a forward KL unbiased estimator that
        # can produce negative values, so requiring upper > 0 would be too restrictive.
        if self.metric in ("kl_k2", "kl_k3") and self.upper <= 0:
            raise ValueError(
                f"upper must be positive for '{self.metric}' metric, got {self.upper}"
            )
        # Clamp action only supports ratio metric (direct importance weight truncation).
        if self.action == "clamp" and self.metric != "ratio":
            raise ValueError(
                f"action='clamp' only supports metric='ratio' (direct importance weight "
                f"truncation). Got metric='{self.metric}'. "
                f"Use action='mask' for KL-based filtering."
            )
        # Clamp action defaults lower to 0.0 (consistent with old truncate behavior).
        if self.action == "clamp" and self.lower is None:
            self.lower = 0.0
        # Validate sequence-level aggregation.
        if self.level == "token" and self.agg != "mean":
            warnings.warn(
                f"agg='{self.agg}' is ignored when level='token'. "
                "Aggregation is only used for sequence-level filtering.",
                UserWarning,
                stacklevel=2,
            )


# ---- areal/utils/functional/functional.py


def _compute_sequence_level_ratio_and_advantages(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Compute sequence-level geometric mean ratios and average advantages per sequence (GSPO).

    Args:
        log_ratio: Log of probability ratios (logprobs - proximal_logprobs)
        advantages: Per-token advantages
        loss_mask: Boolean mask indicating valid tokens
        cu_seqlens: Cumulative sequence lengths. Required for 1D tensors (packed format).
            Shape: [batch_size + 1], where cu_seqlens[i] marks the start of sequence i.
            For a single sequence, use cu_seqlens=torch.tensor([0, seq_len]).

    Returns:
        ratio: Sequence-level importance sampling ratios (broadcast to all tokens)
        advantages: Sequence-averaged advantages (broadcast to all tokens)
            Note: We use mean instead of sum to keep gradient magnitude independent
            of sequence length. When multiplied by ratio and summed over tokens,
            this gives the correct total gradient contribution per sequence.
    """
    # Handle both 1D (packed) and 2D (padded) tensor shapes
    if log_ratio.ndim == 1:
        # For 1D tensors (packed format), cu_seqlens is required
        if cu_seqlens is None:
            raise ValueError(
                "cu_seqlens is required for 1D tensors (packed format). "
                "In AReaL, 1D tensors are produced by pack_tensor_dict() and always have cu_seqlens. "
                "For a single sequence, use cu_seqlens=torch.tensor([0, seq_len], dtype=torch.int32)."
            )

        # Packed sequences: use cu_seqlens boundaries
        batch_size = cu_seqlens.shape[0] - 1
        seq_lengths = cu_seqlens[1:] - cu_seqlens[:-1]
        # Create sequence index for each token: [0,0,0,1,1,2,2,2,2,...]
        sequence_idx = torch.arange(
            batch_size, device=log_ratio.device
        ).repeat_interleave(seq_lengths)

        # Use scatter_add for vectorized summation per sequence (faster than Python loop)
        masked_log_ratio = torch.where(loss_mask, log_ratio, 0.0)
        log_ratio_sum_per_seq = torch.zeros(
            batch_size, device=log_ratio.device, dtype=log_ratio.dtype
        ).scatter_add_(0, sequence_idx, masked_log_ratio)

        masked_advantages = torch.where(loss_mask, advantages, 0.0)
        advantages_sum_per_seq = torch.zeros(
            batch_size, device=advantages.device, dtype=advantages.dtype
        ).scatter_add_(0, sequence_idx, masked_advantages)

        valid_count_per_seq = (
            torch.zeros(batch_size, device=loss_mask.device, dtype=torch.int32)
            .scatter_add_(0, sequence_idx, loss_mask.int())
            .clamp(min=1)
        )

        # Compute sequence-level means
        log_ratio_mean_per_seq = log_ratio_sum_per_seq / valid_count_per_seq.to(
            log_ratio.dtype
        )
        adv_mean_per_seq = advantages_sum_per_seq / valid_count_per_seq.to(
            advantages.dtype
        )

        # Broadcast sequence-level values back to token-level
        ratio = torch.exp(log_ratio_mean_per_seq)[sequence_idx]
        ratio = torch.where(loss_mask, ratio, 0.0)

        advantages = adv_mean_per_seq[sequence_idx]
        advantages = torch.where(loss_mask, advantages, 0.0)
    else:
        # For 2D tensors (padded sequences)
        # Input shape: [batch_size, seq_len]
        # Compute mean log ratio over sequence length for each sample
        seq_log_ratio_mean = torch.where(loss_mask, log_ratio, 0.0).sum(dim=1) / (
            loss_mask.sum(dim=1).clamp(min=1)
        )
        # Broadcast back to original shape: each sequence gets its own geometric mean ratio
        ratio = torch.exp(seq_log_ratio_mean.unsqueeze(1).expand_as(log_ratio))
        # Apply mask
        ratio = torch.where(loss_mask, ratio, 0.0)

        # Average token advantages per sequence
        # This ensures gradient magnitude is independent of sequence length
        seq_lengths = loss_mask.sum(dim=-1, keepdim=True).clamp(min=1)
        masked_advantages = torch.where(loss_mask, advantages, 0.0)
        advantages = (
            masked_advantages.sum(dim=-1, keepdim=True) / seq_lengths
        ).expand_as(log_ratio)
        advantages = torch.where(loss_mask, advantages, 0.0)

    return ratio, advantages


@dataclass
class RejectionSamplingResult:
    """Result of rejection sampling, used by ppo_actor_loss_fn.

    Attributes:
        loss_mask: Updated loss mask (mask mode) or original loss mask (clamp mode).
        behave_imp_weight: Importance weight (clamped in clamp mode, raw in mask mode).
        filtered_fraction: Fraction of valid tokens that were filtered/clamped (for logging).
    """

    loss_mask: torch.Tensor
    behave_imp_weight: torch.Tensor
    filtered_fraction: float


def _check_bounds(
    metric: torch.Tensor, config: RejectionSamplingConfig
) -> torch.Tensor:
    """Check if metric values are within configured bounds.

    Args:
        metric: Per-token or per-sequence metric values.
        config: Rejection sampling configuration with upper and optional lower bounds.

    Returns:
        Boolean tensor, True where metric is within bounds.
    """
    if config.lower is not None:
        return (metric >= config.lower) & (metric <= config.upper)
    else:
        return metric <= config.upper


def apply_rejection_sampling(
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    cu_seqlens: torch.Tensor | None,
    config: RejectionSamplingConfig,
) -> RejectionSamplingResult:
    """Apply rejection sampling based on divergence between proximal and behavior policy.

    Supports two action modes:
    - 'mask': zero out loss_mask for tokens/sequences exceeding threshold (rejection)
    - 'clamp': clamp importance weight to bounds for tokens/sequences exceeding
      threshold (truncation, tokens still participate in gradient)

    Args:
        proximal_logprobs: Proximal policy log-probabilities,
            shape [batch, seq_len] (2D padded) or [total_tokens] (1D packed).
        old_logprobs: Behavior policy log-probabilities from inference engine,
            same shape as proximal_logprobs.
        loss_mask: Original loss mask (1 for valid tokens), same shape as proximal_logprobs.
        cu_seqlens: Cumulative sequence lengths for 1D packed format. Shape: [batch_size + 1].
            Required when inputs are 1D. None for 2D padded inputs.
        config: Configuration for rejection sampling.

    Returns:
        RejectionSamplingResult with updated loss_mask, behave_imp_weight, and filtered_fraction.
    """
    # Step 0: Validate input shapes.
    if proximal_logprobs.shape != old_logprobs.shape:
        raise ValueError(
            f"proximal_logprobs shape {proximal_logprobs.shape} != "
            f"old_logprobs shape {old_logprobs.shape}"
        )
    if proximal_logprobs.shape != loss_mask.shape:
        raise ValueError(
            f"proximal_logprobs shape {proximal_logprobs.shape} != "
            f"loss_mask shape {loss_mask.shape}"
        )
    if proximal_logprobs.ndim not in (1, 2):
        raise ValueError(
            f"Expected 1D (packed) or 2D (padded) tensors, "
            f"got ndim={proximal_logprobs.ndim}"
        )

    # Step 1: Compute log ratio = log(π_proximal / π_behave)
    # Upcast operands to fp32 before subtraction to avoid precision loss in bf16/fp16.
    log_ratio = proximal_logprobs.detach().float() - old_logprobs.detach().float()
    # Sanitize non-finite values (e.g. -inf - (-inf) = NaN) to prevent NaN propagation.
    log_ratio = torch.where(torch.isfinite(log_ratio), log_ratio, 0.0)

    # Step 2: Compute metric value (reuse existing KLEstimator sign conventions)
    if config.metric == "ratio":
        # Direct ratio π_proximal / π_behave
        metric = torch.exp(log_ratio)
    elif config.metric in ("kl_k1", "kl_k2", "kl_k3"):
        # Use existing KLEstimator (note: _compute_approx_kl takes log_probs, log_probs_base)
        estimator_name = config.metric.replace("kl_", "")  # "k1", "k2", "k3"
        metric = KLEstimator._compute_approx_kl(
            log_probs=proximal_logprobs.detach(),
            log_probs_base=old_logprobs.detach(),
            kl_estimator=estimator_name,
            apply_clamp=False,  # Don't clamp; threshold check handles bounds
        )
    else:
        raise ValueError(f"Unknown metric: {config.metric}")

    # Step 3: Compute behave_imp_weight (needed for both modes)
    behave_imp_weight = torch.exp(log_ratio)
    # Save original weight before any clamping, to compute clamped fraction later.
    original_weight = behave_imp_weight

    # Step 4: Aggregate and filter
    #
    # For ratio metric, aggregate in log space (geometric mean) to match GSPO
    # semantics and avoid the "length trap" where arithmetic mean inflates
    # sequence-level ratios. For KL metrics, aggregate in metric space
    # (arithmetic) since KL divergence is additive.
    _use_log_agg = config.metric == "ratio"

    if config.level == "sequence":
        # Pre-compute sequence indexing (shared by filtering and weight broadcast).
        if loss_mask.ndim == 1:
            # 1D packed format: use cu_seqlens
            if cu_seqlens is None:
                raise ValueError(
                    "cu_seqlens is required for 1D packed tensors "
                    "in sequence-level filtering."
                )
            batch_size = cu_seqlens.shape[0] - 1
            seq_lengths = cu_seqlens[1:] - cu_seqlens[:-1]
            sequence_idx = torch.arange(
                batch_size, device=metric.device
            ).repeat_interleave(seq_lengths)

            # For ratio metric: aggregate log_ratio (geometric); else: aggregate metric (arithmetic).
            agg_values = log_ratio if _use_log_agg else metric
            masked_agg = torch.where(loss_mask.bool(), agg_values, 0.0)
            valid_count_per_seq = (
                torch.zeros(batch_size, device=loss_mask.device, dtype=torch.int32)
                .scatter_add_(0, sequence_idx, loss_mask.int())
                .clamp(min=1)
            )

            # Ratio metric + sequence level: use geometric mean as uniform weight
            # for all tokens (matches old sequence_mask/sequence_truncate semantics).
            if _use_log_agg:
                # masked_agg is already log_ratio masked by loss_mask (computed above).
                seq_log_sum = torch.zeros(
                    batch_size, device=log_ratio.device, dtype=log_ratio.dtype
                ).scatter_add_(0, sequence_idx, masked_agg)
                seq_log_mean = seq_log_sum / valid_count_per_seq.to(log_ratio.dtype)
                behave_imp_weight = torch.exp(seq_log_mean)[sequence_idx]
                original_weight = behave_imp_weight

            if config.agg == "sum":
                seq_agg = torch.zeros(
                    batch_size, device=metric.device, dtype=agg_values.dtype
                ).scatter_add_(0, sequence_idx, masked_agg)
            elif config.agg == "mean":
                seq_agg_sum = torch.zeros(
                    batch_size, device=metric.device, dtype=agg_values.dtype
                ).scatter_add_(0, sequence_idx, masked_agg)
                seq_agg = seq_agg_sum / valid_count_per_seq.to(agg_values.dtype)
            elif config.agg == "max":
                agg_for_max = agg_values.masked_fill(~loss_mask.bool(), float("-inf"))
                seq_agg = torch.full(
                    (batch_size,),
                    float("-inf"),
                    device=metric.device,
                    dtype=agg_values.dtype,
                ).scatter_reduce_(0, sequence_idx, agg_for_max, reduce="amax")
                # All-masked sequences stay -inf; treat them as in-bounds (no valid
                # tokens to filter, and their loss_mask is already all-zero).
                # Recompute from raw counts to detect true zero.
                raw_valid = torch.zeros(
                    batch_size, device=loss_mask.device, dtype=torch.int32
                ).scatter_add_(0, sequence_idx, loss_mask.int())
                all_masked = raw_valid == 0
                seq_agg = torch.where(all_masked, torch.zeros_like(seq_agg), seq_agg)
            else:
                raise ValueError(f"Unknown agg method: {config.agg}")

            # Convert back to metric space for threshold comparison.
            seq_metric = torch.exp(seq_agg) if _use_log_agg else seq_agg

            # Check each sequence against bounds
            in_bounds_per_seq = _check_bounds(seq_metric, config)

            if config.action == "mask":
                # Broadcast back to token level, filter entire sequence
                in_bounds = in_bounds_per_seq[sequence_idx]
            else:
                # clamp mode: clamp tokens in out-of-bounds sequences
                out_of_bounds = (~in_bounds_per_seq)[sequence_idx]
                behave_imp_weight = torch.where(
                    out_of_bounds,
                    behave_imp_weight.clamp(
                        min=config.lower if config.lower is not None else 0.0,
                        max=config.upper,
                    ),
                    behave_imp_weight,
                )
        else:
            # 2D padded format
            agg_values = log_ratio if _use_log_agg else metric
            masked_agg = torch.where(loss_mask.bool(), agg_values, 0.0)
            valid_count = loss_mask.sum(dim=-1, keepdim=True).clamp(min=1)

            # Ratio metric + sequence level: geometric mean as uniform weight.
            if _use_log_agg:
                seq_log_mean = masked_agg.sum(dim=-1, keepdim=True) / valid_count
                behave_imp_weight = torch.exp(seq_log_mean).expand_as(log_ratio)
                original_weight = behave_imp_weight

            if config.agg == "sum":
                seq_agg = masked_agg.sum(dim=-1, keepdim=True)
            elif config.agg == "mean":
                seq_agg = masked_agg.sum(dim=-1, keepdim=True) / valid_count
            elif config.agg == "max":
                agg_for_max = agg_values.masked_fill(~loss_mask.bool(), float("-inf"))
                seq_agg = agg_for_max.max(dim=-1, keepdim=True)[0]
                # All-masked sequences stay -inf; treat them as in-bounds (no valid
                # tokens to filter, and their loss_mask is already all-zero).
                all_masked = loss_mask.sum(dim=-1, keepdim=True) == 0
                seq_agg = torch.where(all_masked, torch.zeros_like(seq_agg), seq_agg)
            else:
                raise ValueError(f"Unknown agg method: {config.agg}")

            # Convert back to metric space for threshold comparison.
            seq_metric = torch.exp(seq_agg) if _use_log_agg else seq_agg

            if config.action == "mask":
                in_bounds = _check_bounds(seq_metric, config).expand_as(loss_mask)
            else:
                # clamp mode: clamp tokens in out-of-bounds sequences
                out_of_bounds = (~_check_bounds(seq_metric, config)).expand_as(
                    loss_mask
                )
                behave_imp_weight = torch.where(
                    out_of_bounds,
                    behave_imp_weight.clamp(
                        min=config.lower if config.lower is not None else 0.0,
                        max=config.upper,
                    ),
                    behave_imp_weight,
                )
    else:
        # Token level
        if config.action == "mask":
            in_bounds = _check_bounds(metric, config)
        else:
            # clamp mode: directly clamp importance weight
            behave_imp_weight = behave_imp_weight.clamp(
                min=config.lower if config.lower is not None else 0.0,
                max=config.upper,
            )

    # Step 5: Update loss_mask or keep it based on action mode
    if config.action == "mask":
        candidates = loss_mask.bool()
        updated_mask = (candidates & in_bounds).to(loss_mask.dtype)
        filtered_count = (candidates & ~in_bounds).sum().item()
        total_count = candidates.sum().item()
        filtered_fraction = filtered_count / max(total_count, 1)
    else:
        # clamp mode: loss_mask unchanged
        updated_mask = loss_mask
        # Report fraction of clamped tokens (for logging)
        clamped_count = (
            (loss_mask.bool() & (original_weight != behave_imp_weight)).sum().item()
        )
        total_count = loss_mask.bool().sum().item()
        filtered_fraction = clamped_count / max(total_count, 1)

    # Apply loss_mask to behave_imp_weight
    behave_imp_weight = torch.where(updated_mask.bool(), behave_imp_weight, 0.0)

    return RejectionSamplingResult(
        loss_mask=updated_mask,
        behave_imp_weight=behave_imp_weight,
        filtered_fraction=filtered_fraction,
    )


def ppo_actor_loss_fn(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    loss_mask: torch.Tensor,
    eps_clip_higher: float | None = None,
    c_clip: float | None = None,
    rejection_sampling: RejectionSamplingConfig | None = None,
    importance_sampling_level: str = "token",
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """PPO actor loss function with optional rejection sampling.

    The ``rejection_sampling`` parameter replaces the removed
    ``behave_imp_weight_cap`` / ``behave_imp_weight_mode``.

    - ``action='mask'``: modifies loss_mask before loss computation (rejection)
    - ``action='clamp'``: clamps importance weight to bounds (truncation)

    When decoupled loss is disabled:
    1. if recompute logp, both old_logprobs and proximal_logprobs are recomputed logp;
    2. if no recomputation, both old_logp and proximal_logprobs are produced by the inference backend.

    When decoupled loss is enabled, proximal_logprobs is the recomputed logp,
    old_logprobs is produced by the inference engine.

    Note: ``importance_sampling_level`` controls PPO ratio (π_θ/π_proximal)
    aggregation (GSPO), which is orthogonal to ``rejection_sampling.level``
    that controls staleness filtering (π_proximal/π_behave) granularity.

    Args:
        logprobs: Current policy log-probabilities (π_θ).
        proximal_logprobs: Proximal policy log-probabilities (π_proximal).
        old_logprobs: Behavior policy log-probabilities from inference (π_behave).
        advantages: Per-token advantage estimates.
        eps_clip: PPO clipping factor for policy ratio.
        loss_mask: Mask for valid tokens (1 = valid).
        eps_clip_higher: Upper clipping factor (decoupled clipping). None = use eps_clip.
        c_clip: Dual clipping factor, must be > 1.0. None disables dual clipping.
        rejection_sampling: Rejection sampling configuration. None disables filtering.
        importance_sampling_level: Level at which to compute importance sampling ratios.
            - 'token': Per-token ratios (standard PPO)
            - 'sequence': Sequence-level geometric mean of per-token ratios (GSPO)
        cu_seqlens: Cumulative sequence lengths for packed sequences (1D tensors).
            Required when inputs are 1D and importance_sampling_level='sequence'.
            Shape: [batch_size + 1], where cu_seqlens[i] marks the start of sequence i.
            Not needed for 2D padded inputs (sequences identified by batch dimension).
    """
    # Save original count BEFORE rejection sampling may modify loss_mask.
    # This keeps the denominator consistent with loss_weight_fn in actor.py,
    # which always uses the original loss_mask from input_data. Without this,
    # mask mode would inflate per-token gradients by N_original / N_kept.
    loss_mask_count = loss_mask.count_nonzero() or 1

    # === Apply rejection sampling (replaces old compute_behave_imp_weight) ===
    if rejection_sampling is not None:
        rs_result = apply_rejection_sampling(
            proximal_logprobs=proximal_logprobs,
            old_logprobs=old_logprobs,
            loss_mask=loss_mask,
            cu_seqlens=cu_seqlens,
            config=rejection_sampling,
        )
        # mask mode updates loss_mask; clamp mode keeps it unchanged
        loss_mask = rs_result.loss_mask
        behave_imp_weight = rs_result.behave_imp_weight
        filtered_fraction = rs_result.filtered_fraction
    else:
        filtered_fraction = 0.0

    if importance_sampling_level == "sequence":
        # GSPO: Compute sequence-level geometric mean of probability ratios
        log_ratio = logprobs - proximal_logprobs
        ratio, advantages = _compute_sequence_level_ratio_and_advantages(
            log_ratio, advantages, loss_mask, cu_seqlens
        )
    elif importance_sampling_level == "token":
        # Standard PPO: per-token ratio
        ratio = torch.where(loss_mask, torch.exp(logprobs - proximal_logprobs), 0)
    else:
        raise ValueError(
            f"Invalid importance_sampling_level: {importance_sampling_level}. "
            "Must be 'token' or 'sequence'."
        )

    clipped_ratio = torch.clamp(
        ratio,
        1.0 - eps_clip,
        1.0 + (eps_clip if eps_clip_higher is None else eps_clip_higher),
    )

    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * clipped_ratio
    clip_mask = pg_loss1.detach() < pg_loss2.detach()
    pg_loss = torch.max(pg_loss1, pg_loss2)
    if c_clip is not None:
        assert c_clip > 1.0, c_clip
        pg_loss3 = torch.sign(advantages) * c_clip * advantages
        dual_clip_mask = pg_loss3.detach() < pg_loss.detach()
        pg_loss = torch.min(pg_loss, pg_loss3)
    else:
        dual_clip_mask = torch.zeros_like(clip_mask)

    # Apply behavioural importance weight from rejection sampling
    if rejection_sampling is not None:
        behave_approx_kl = proximal_logprobs.detach() - old_logprobs.detach()
        behave_mask = (behave_imp_weight > 0).logical_and(loss_mask.bool())
        behave_approx_kl = torch.where(behave_mask, behave_approx_kl, 0.0)
        pg_loss = pg_loss * behave_imp_weight

    logging_loss = pg_loss.detach()
    pg_loss = torch.where(loss_mask, pg_loss, 0).sum() / loss_mask_count
    clip_mask.logical_and_(loss_mask)
    dual_clip_mask.logical_and_(loss_mask)
    stat = dict(
        loss=logging_loss,
        importance_weight=ratio.detach(),
        approx_kl=(logprobs - proximal_logprobs).detach(),
        clip_mask=clip_mask,
        dual_clip_mask=dual_clip_mask,
    )
    if rejection_sampling is not None:
        stat.update(
            behave_approx_kl=behave_approx_kl.detach(),
            behave_imp_weight=behave_imp_weight.detach(),
            behave_mask=behave_mask,
            filtered_fraction=filtered_fraction,
        )
    return pg_loss, stat


# ---- areal/trainer/ppo/actor.py


def compute_prox_logp_approximations(
    old_logp: torch.Tensor,
    logprobs: torch.Tensor,
    versions: torch.Tensor,
    current_version: int,
    method: str | None = None,
) -> dict[str, torch.Tensor]:
    """
    Compute approximation(s) for proximal policy log-probabilities.

    This function approximates the log-probabilities of the proximal policy (one training step
    behind the current policy) using version-aware interpolation between the behavior policy
    (old_logp) and current policy (logprobs). This avoids the need for an expensive forward pass
    to compute the proximal policy's log-probabilities explicitly.

    Args:
        old_logp: log_p_behave from the rollout (behavior policy)
        logprobs: log_p_theta from current training forward pass
        versions: per-token policy versions from rollout (v_behave for each token)
        current_version: current training step version (v_theta)
        method: If specified, only compute this method. If None, compute all methods.

    Returns:
        Dictionary with approximation results. Single key if method specified, all methods otherwise.
    """
    # Assume proximal version is current_version - 1 (last broadcast)
    # In AReaL, proximal policy is the last updated/broadcast policy version
    v_proximal = current_version - 1

    # Extract version information
    v_behave = versions.float()
    v_theta = float(current_version)

    # CRITICAL: Only approximate generated tokens (version >= 0)
    # Prompt tokens (version < 0) must NOT be approximated - they have no generation version
    generated_tokens_mask = versions >= 0

    # Compute interpolation factor alpha
    # When v_behave == v_proximal: alpha=0 (use old_logp)
    # When v_behave == v_theta: alpha=1 (use logprobs)
    # For prompt tokens (version < 0): alpha=0 (no interpolation)
    version_diff = v_theta - v_behave
    version_gap = v_proximal - v_behave
    # Avoid division by zero AND exclude prompt tokens
    alpha = torch.where(
        (version_diff > 0) & generated_tokens_mask,
        version_gap / version_diff,
        torch.zeros_like(v_behave),
    )
    alpha = torch.clamp(alpha, 0.0, 1.0)

    approximations = {}

    # If method is specified, only compute that one
    # Otherwise compute all methods (for metrics comparison)
    methods_to_compute = [method] if method else PROX_APPROX_METHODS_ALL

    for m in methods_to_compute:
        if m == PROX_APPROX_METHOD_LOGLINEAR:
            # Method 1: Log-linear interpolation in log-space (geometric mean in probability space)
            # log(p_prox) = (1-α)·log(p_behave) + α·log(p_theta)
            approximations[PROX_APPROX_METHOD_LOGLINEAR] = old_logp + alpha * (
                logprobs - old_logp
            )

        elif m == PROX_APPROX_METHOD_LINEAR:
            # Method 2: Linear interpolation in probability space (arithmetic mean)
            # p_prox = (1-α)·p_behave + α·p_theta
            # Then convert back to log space: log(p_prox)
            p_behave = torch.exp(old_logp)
            p_theta = torch.exp(logprobs)
            p_arithmetic = (1 - alpha) * p_behave + alpha * p_theta
            approximations[PROX_APPROX_METHOD_LINEAR] = torch.log(p_arithmetic + 1e-10)

        elif m == PROX_APPROX_METHOD_ROLLOUT:
            # Method 3: Use behavior policy from rollout as-is (no approximation)
            # p_prox = p_behave
            # Used for metrics comparison
            approximations[PROX_APPROX_METHOD_ROLLOUT] = old_logp.clone()

    return approximations
