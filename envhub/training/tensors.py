"""Padded torch tensors from a batch of :class:`~envhub.rollout.trajectory.Trajectory`, for any trainer.

A trajectory is already the exact token record of a rollout: ``prompt_ids``, then ``response_ids`` in which model
tokens (``response_mask == 1``, with the logprobs they were sampled with) interleave with env tokens (mask 0, the
chat template's rendering of the env's replies). Training only needs that record laid out as rectangles::

    from envhub.training import to_tensors, token_logprobs

    batch = to_tensors(trajectories, pad_token_id=tokenizer.pad_token_id)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"]).logits
    logp = token_logprobs(logits, batch["input_ids"])        # [B, T-1]: log p(input_ids[:, t+1] | ...<= t)
    loss_mask = batch["loss_mask"]                           # [B, T-1]: 1 where that token was sampled by the model

Every tensor is aligned with ``input_ids`` (``[B, T]``, ``T`` = the longest prompt + response in the batch), except
``loss_mask`` which is aligned with the *predicted* tokens ``input_ids[:, 1:]`` (what :func:`token_logprobs`
returns), so the off-by-one of causal LM training is done once, here, and not in every trainer.

Nothing is re-tokenized: ``input_ids`` is ``prompt_ids + response_ids`` verbatim. A trajectory whose lists disagree
in length is rejected with a :class:`ValueError` that names it, instead of being silently misaligned.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    import torch

from envhub.rollout.trajectory import Trajectory

IGNORE_INDEX = -100
"""The ``labels`` value that transformers' causal-LM loss ignores."""


def _check(i: int, t: Trajectory) -> None:
    n = len(t.response_ids)
    if len(t.response_mask) != n:
        raise ValueError(
            f"trajectory {i} ({t.env_id}/{t.task_id}): {n} response_ids but {len(t.response_mask)} mask entries"
        )
    if t.response_logprobs and len(t.response_logprobs) != n:
        raise ValueError(
            f"trajectory {i} ({t.env_id}/{t.task_id}): {n} response_ids but {len(t.response_logprobs)} logprobs"
        )
    if any(m not in (0, 1) for m in t.response_mask):
        raise ValueError(f"trajectory {i} ({t.env_id}/{t.task_id}): response_mask must hold only 0 and 1")
    versions = _versions(t)
    if versions and len(versions) != n:
        raise ValueError(
            f"trajectory {i} ({t.env_id}/{t.task_id}): {n} response_ids but {len(versions)} response_versions"
        )


def _versions(t: Trajectory) -> list[int]:
    # getattr: trajectories built before per-token versions existed (or by hand) have none
    return list(getattr(t, "response_versions", None) or [])


def to_tensors(
    trajectories: Sequence[Trajectory | dict[str, Any]],
    *,
    pad_token_id: int = 0,
    padding_side: str = "right",
    max_length: int | None = None,
    pad_to_multiple_of: int | None = None,
) -> dict[str, torch.Tensor]:
    """Lay a batch of trajectories out as padded tensors.

    Args:
        trajectories: ``Trajectory`` objects or their ``to_dict()`` form (what the rollout service returns).
        pad_token_id: the id put in padding positions of ``input_ids`` (masked out everywhere else).
        padding_side: ``"right"`` (default; what most trainers use) or ``"left"``.
        max_length: cut sequences longer than this (the response loses its tail; ``truncated`` is set).
        pad_to_multiple_of: round ``T`` up, for kernels that like aligned shapes.

    Returns:
        A dict of tensors, ``B`` trajectories by ``T`` positions:

        - ``input_ids`` ``[B, T]`` long: ``prompt_ids + response_ids``, padded with ``pad_token_id``.
        - ``attention_mask`` ``[B, T]`` long: 1 on real tokens.
        - ``position_ids`` ``[B, T]`` long: 0, 1, 2... over real tokens (0 on padding), whatever the padding side.
        - ``action_mask`` ``[B, T]`` long: 1 where the model sampled the token (prompt, env and padding are 0).
        - ``loss_mask`` ``[B, T-1]`` float: ``action_mask[:, 1:]``, aligned with :func:`token_logprobs`.
        - ``labels`` ``[B, T]`` long: ``input_ids`` with every non-model token set to -100 (for a
          transformers causal-LM loss that trains on model tokens only).
        - ``logprobs`` ``[B, T]`` float: the rollout's sampling logprobs on model tokens, 0 elsewhere.
        - ``versions`` ``[B, T]`` long, only when the trajectories carry ``response_versions``: the weight version
          that sampled each token, -1 on prompt, env and padding positions (AReaL's ``versions``; slice
          ``[:, 1:]`` like ``logprobs`` for :func:`~envhub.training.loglinear_proximal_logprobs`). A batch mixing
          trajectories with and without versions is refused (the unversioned ones would silently read as
          "sampled by no version"); one with no response token at all needs none.
        - ``rewards`` ``[B]`` float; ``token_rewards`` ``[B, T]`` float: the reward on the last model token.
        - ``passed``, ``truncated`` ``[B]`` bool; ``prompt_lengths``, ``response_lengths`` ``[B]`` long.
    """
    import torch  # lazily: importing envhub.training never loads torch by itself

    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    trajs = [t if isinstance(t, Trajectory) else Trajectory.from_dict(t) for t in trajectories]
    if not trajs:
        raise ValueError("to_tensors needs at least one trajectory")
    for i, t in enumerate(trajs):
        _check(i, t)
    # A trajectory with no response token (a rollout that failed before the model spoke) has nothing to tag.
    with_versions = any(_versions(t) for t in trajs)
    bare = [i for i, t in enumerate(trajs) if t.response_ids and not _versions(t)]
    if with_versions and bare:
        raise ValueError(f"trajectories {bare} have no response_versions while the others do: a batch carries "
                         "versions for every trajectory or for none")

    rows = []
    for t in trajs:
        ids = list(t.prompt_ids) + list(t.response_ids)
        act = [0] * len(t.prompt_ids) + t.loss_mask  # a failed rollout trains on nothing (Trajectory.loss_mask)
        lps = [0.0] * len(t.prompt_ids) + (list(t.response_logprobs) or [0.0] * len(t.response_ids))
        cut = False
        if max_length is not None and len(ids) > max_length:
            ids, act, lps, cut = ids[:max_length], act[:max_length], lps[:max_length], True
        # A logprob is only meaningful where the model sampled; env tokens carry 0.0 by contract, padding too.
        lps = [lp if a else 0.0 for lp, a in zip(lps, act)]
        rows.append((ids, act, lps, cut))

    T = max(1, max(len(r[0]) for r in rows))
    if pad_to_multiple_of:
        T = -(-T // pad_to_multiple_of) * pad_to_multiple_of
    B = len(trajs)
    input_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    action_mask = torch.zeros((B, T), dtype=torch.long)
    logprobs = torch.zeros((B, T), dtype=torch.float32)
    token_rewards = torch.zeros((B, T), dtype=torch.float32)
    versions = torch.full((B, T), -1, dtype=torch.long)
    for b, ((ids, act, lps, _), t) in enumerate(zip(rows, trajs)):
        n = len(ids)
        sl = slice(0, n) if padding_side == "right" else slice(T - n, T)
        input_ids[b, sl] = torch.tensor(ids, dtype=torch.long)
        attention_mask[b, sl] = 1
        action_mask[b, sl] = torch.tensor(act, dtype=torch.long)
        logprobs[b, sl] = torch.tensor(lps, dtype=torch.float32)
        if with_versions:
            versions[b, sl] = torch.tensor(([-1] * len(t.prompt_ids) + _versions(t))[:n], dtype=torch.long)
        model_pos = action_mask[b].nonzero()
        if len(model_pos):  # the outcome reward sits on the last token the model produced
            token_rewards[b, int(model_pos[-1])] = float(t.reward)

    # cumsum - 1 numbers real tokens from 0 whatever the padding side; padding gets 0 (what HF and veRL expect).
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0) * attention_mask
    labels = input_ids.masked_fill(action_mask == 0, IGNORE_INDEX)
    extra = {"versions": versions} if with_versions else {}
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "action_mask": action_mask,
        "loss_mask": action_mask[:, 1:].to(torch.float32),
        "labels": labels,
        "logprobs": logprobs,
        "rewards": torch.tensor([float(t.reward) for t in trajs], dtype=torch.float32),
        "token_rewards": token_rewards,
        "passed": torch.tensor([bool(t.passed) for t in trajs], dtype=torch.bool),
        "truncated": torch.tensor([bool(t.truncated) or r[3] for t, r in zip(trajs, rows)], dtype=torch.bool),
        "prompt_lengths": torch.tensor([min(len(t.prompt_ids), len(r[0])) for t, r in zip(trajs, rows)]),
        "response_lengths": torch.tensor(
            [len(r[0]) - min(len(t.prompt_ids), len(r[0])) for t, r in zip(trajs, rows)]
        ),
        **extra,
    }


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """``log p(input_ids[:, t+1] | input_ids[:, :t+1])`` for every position: ``[B, T-1]``.

    Aligned with ``batch["loss_mask"]`` and with ``batch["logprobs"][:, 1:]`` (the rollout's own logprobs), so a
    ratio ``exp(token_logprobs(...) - batch["logprobs"][:, 1:])`` is the importance weight of every model token.
    Computed as ``logit[target] - logsumexp(logits)`` so no ``[B, T, V]`` log-softmax is materialized twice.
    """
    import torch  # lazily: importing envhub.training never loads torch by itself

    logits = logits[:, :-1].float()
    targets = input_ids[:, 1:].unsqueeze(-1)
    return logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
