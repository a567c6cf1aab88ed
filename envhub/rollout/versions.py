"""Per-token policy versions, reduced to each trainer's form.

A :class:`~envhub.rollout.trajectory.Trajectory` records ``response_versions``: the weight version that sampled
each model token, ``-1`` on env tokens (AReaL's convention). A per-token list reduces to every format a trainer
reads; the reverse is not possible, which is why envhub keeps the per-token list:

==========================  ===============================================================================
trainer                     what it reads                          envhub
==========================  ===============================================================================
AReaL                       ``versions`` over prompt + response    :func:`areal_versions` (``-1`` on prompt)
verl (fully async, V1)      ``extra_fields.min/max_global_steps``  :func:`verl_global_steps`
slime                       ``weight_versions`` (one per call)     :func:`slime_weight_versions`
prime-rl, NeMo RL, ROLL     one version per trajectory / segment   :func:`version_span`, :func:`segments`
==========================  ===============================================================================
"""
from __future__ import annotations

from typing import Any


def _versions(traj: Any) -> list[int]:
    return list(getattr(traj, "response_versions", None) or [])


def segments(traj: Any) -> list[dict[str, int]]:
    """Contiguous runs of model tokens sampled by one version: ``[{start, end, version}]`` (``end`` exclusive,
    positions in ``response_ids``). A turn whose generation spanned a weight update is two segments."""
    out: list[dict[str, int]] = []
    for i, (m, v) in enumerate(zip(traj.response_mask, _versions(traj))):
        if not m:
            continue
        if out and out[-1]["end"] == i and out[-1]["version"] == v:
            out[-1]["end"] = i + 1
        else:
            out.append({"start": i, "end": i + 1, "version": int(v)})
    return out


def version_span(traj: Any) -> tuple[int, int] | None:
    """``(oldest, newest)`` version over the model tokens; ``None`` when none carries a version."""
    sampled = [v for m, v in zip(traj.response_mask, _versions(traj)) if m]
    return (min(sampled), max(sampled)) if sampled else None


def areal_versions(traj: Any) -> list[int]:
    """AReaL's ``versions`` tensor row: ``-1`` on each prompt token, then ``response_versions``."""
    return [-1] * len(traj.prompt_ids) + _versions(traj)


def verl_global_steps(traj: Any) -> dict[str, int]:
    """verl's ``AgentLoopOutput.extra_fields`` staleness keys (``min_global_steps`` / ``max_global_steps``); empty
    when no version was recorded."""
    span = version_span(traj)
    return {} if span is None else {"min_global_steps": span[0], "max_global_steps": span[1]}


def slime_weight_versions(traj: Any) -> list[str]:
    """slime's ``Sample.weight_versions``: one entry per generation chunk (a call split by a weight update is two),
    as strings, in order."""
    return [str(s["version"]) for s in segments(traj)]


def version_problems(traj: Any) -> list[str]:
    """Why ``response_versions`` does not line up with the tokens (empty: it does, or no versions recorded).
    Used by the fidelity check."""
    versions = _versions(traj)
    if not versions:
        return []
    if len(versions) != len(traj.response_ids):
        return [f"{len(versions)} versions for {len(traj.response_ids)} response ids"]
    problems = []
    for i, (m, v) in enumerate(zip(traj.response_mask, versions)):
        if not isinstance(v, int) or isinstance(v, bool):
            problems.append(f"version at position {i} is not an integer: {v!r}")
        elif m and v < 0:
            problems.append(f"sampled token at position {i} has no version ({v}): every model token needs the "
                            "version that sampled it")
        elif not m and v != -1:
            problems.append(f"env token at position {i} has version {v} (must be -1): a shifted version list?")
        if len(problems) > 10:
            break
    return problems
