"""The staleness rule's arithmetic, pure: AReaL's capacity formula, when a lag is stale, the restart floor, a
replica's share, the stale tokens of a rollout. No clock, no lock, no state: :class:`~envhub.rollout.staleness.
StalenessGate` applies them under its lock, and simulations and tests call them directly (the module docstring of
:mod:`envhub.rollout.staleness` explains the rule and the failures each part prevents)."""
from __future__ import annotations


def capacity(max_concurrent: int | None, running: int, max_staleness: int | None, version: int, batch_size: int,
             accepted: int) -> int | None:
    """AReaL's rule: ``min(max_concurrent - running, (eta + v + 1) * B - (accepted + running))``; a bound that is
    ``None`` does not limit (``None`` when neither does)."""
    bounds = []
    if max_concurrent is not None:
        bounds.append(max_concurrent - running)
    if max_staleness is not None:
        bounds.append((max_staleness + version + 1) * batch_size - (accepted + running))
    return min(bounds) if bounds else None


def is_stale(lag: int, max_staleness: int | None) -> bool:
    """A rollout dispatched ``lag`` versions ago is stale when the lag passes ``eta`` (``None``: never)."""
    return max_staleness is not None and lag > max_staleness


def accepted_floor(version: int, batch_size: int) -> int:
    """The fewest samples a trainer at ``version`` has taken: ``version * B`` (AReaL's ``on_version_recovered``)."""
    return version * batch_size


def share(total: int, replicas: int, index: int) -> int:
    """Replica ``index``'s part of ``total`` over ``replicas``: the parts add up to ``total`` (or more, when there
    are more replicas than units), and none is 0 -- a replica with no share would never admit anything (AReaL#1396)."""
    return max(1, total // replicas + (index < total % replicas))


def stale_tokens(versions: list[int], version: int, k: int | None) -> list[int]:
    """Indices of model tokens (``versions[i] >= 0``; ``-1`` marks env and prompt tokens) more than ``k`` versions
    older than ``version``. ``k=None``: none."""
    if k is None:
        return []
    return [i for i, ver in enumerate(versions) if ver >= 0 and version - ver > k]
