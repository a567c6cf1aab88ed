"""What the conformance tier's test backend reports (shared by its conftest and tests)."""
from __future__ import annotations


def logprob_of(position: int, token: int) -> float:
    """The logprob the test backend reports for ``token`` sampled at ``position`` of a turn: distinct per place."""
    return -((token % 89) + 1) / 100.0 - position / 1000.0
