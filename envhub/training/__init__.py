"""Training helpers for any trainer (the core's optional ``torch`` extra: ``pip install envhub[torch]``).

- :func:`to_tensors`: a batch of trajectories as padded ``input_ids`` / ``attention_mask`` / ``position_ids`` /
  ``action_mask`` / ``loss_mask`` / ``labels`` / ``logprobs`` / ``rewards`` tensors (``envhub.training.tensors``).
- :func:`grpo_advantages`, :func:`dr_grpo_advantages`, :func:`rloo_advantages`, :func:`dapo_keep`,
  :func:`dapo_filter`: group advantages and DAPO's zero-variance filter (``envhub.training.advantages``: pure
  Python, no torch needed).
- :func:`token_logprobs`, :func:`policy_gradient_loss`, :func:`aggregate_loss`: a masked policy-gradient surrogate
  (``envhub.training.loss``).
- Off-policy corrections for asynchronous training (pure torch, each equal to its source trainer's code):
  :func:`decoupled_ppo_loss`, :func:`loglinear_proximal_logprobs`, :func:`behave_rejection`, :class:`Rejection`
  (AReaL's decoupled PPO, ``envhub.training.decoupled``); :func:`is_weights`, :func:`tis_weights`,
  :func:`icepop_weights`, :func:`seq_mask_tis_weights`, :func:`ratio_rejection_mask`,
  :func:`divergence_rejection_mask` (verl's rollout correction, slime's TIS / IcePop / MIS, OpenRLHF's IS
  correction, ``envhub.training.offpolicy``). Options mapped in ``docs/async.md``.
- :class:`RolloutClient` (``envhub.training.client``): the rollout service's client, with retries over several
  servers; :class:`DAPOCollector` (``envhub.training.dapo``): DAPO's dynamic sampling over it, asynchronously.

``import envhub`` never imports this package; importing it imports torch (only the tensor parts need it, and they
are loaded on first use so ``from envhub.training import grpo_advantages`` works without torch).
"""
from envhub.training.advantages import (
    dapo_filter, dapo_keep, dr_grpo_advantages, group_indices, group_keys, grpo_advantages, rloo_advantages,
)

__all__ = [
    "DAPOCollector", "RolloutClient", "TooManyGroups", "aggregate_loss", "dapo_filter", "dapo_keep", "dr_grpo_advantages", "group_indices", "group_keys",
    "grpo_advantages", "policy_gradient_loss", "rloo_advantages", "to_tensors", "token_logprobs",
    "Rejection", "behave_rejection", "decoupled_ppo_loss", "loglinear_proximal_logprobs",
    "divergence_rejection_mask", "icepop_weights", "is_weights", "ratio_rejection_mask", "seq_mask_tis_weights",
    "tis_weights",
]

_LAZY = {
    "to_tensors": "envhub.training.tensors", "token_logprobs": "envhub.training.tensors",
    "IGNORE_INDEX": "envhub.training.tensors",
    "aggregate_loss": "envhub.training.loss", "policy_gradient_loss": "envhub.training.loss",
    "RolloutClient": "envhub.training.client", "DAPOCollector": "envhub.training.dapo",
    "TooManyGroups": "envhub.training.dapo",
    **{name: "envhub.training.decoupled" for name in (
        "Rejection", "behave_rejection", "decoupled_ppo_loss", "loglinear_proximal_logprobs")},
    **{name: "envhub.training.offpolicy" for name in (
        "divergence_rejection_mask", "icepop_weights", "is_weights", "ratio_rejection_mask", "seq_mask_tis_weights",
        "tis_weights")},
}


def __getattr__(name: str):
    if name in _LAZY:  # torch is imported only when a tensor helper is asked for (httpx when the client is)
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'envhub.training' has no attribute {name!r}")
