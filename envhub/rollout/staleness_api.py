"""What callers of the staleness gate see (:mod:`envhub.rollout.staleness`): its modes and verdicts, its errors, the
:class:`Lease` an admitted rollout holds, the settings it takes, and its HTTP routes (the same on the rollout service
and the gateway). The gate itself, the counters and the waiting, is :class:`envhub.rollout.staleness.StalenessGate`;
both names are importable from there too.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from envhub.rollout.staleness import StalenessGate

MODES = ("pace", "drop", "withhold")
VERDICTS = ("fresh", "withheld", "dropped", "failed")


class GateError(ValueError):
    """A configuration or report the gate cannot take (negative sizes, a version going backwards...)."""


class NoCapacity(RuntimeError):
    """No capacity now: answered as HTTP 429 (AReaL's proxy: "No available capacity to start a new session")."""

    status = 429

    def __init__(self, message: str, status: dict[str, Any] | None = None):
        super().__init__(message)
        self.gate_status = status or {}


@dataclass(eq=False)
class Lease:
    """One admitted rollout (a job, a session). Released exactly once, by :meth:`StalenessGate.finish` or
    :meth:`StalenessGate.cancel`; a second release changes nothing."""

    id: int
    dispatch_version: int
    kind: str = "rollout"
    on_stale: Callable[[Lease], None] | None = None
    stale: bool = False                        # drop mode: the lag passed eta while it ran
    released: bool = False
    verdict: dict[str, Any] = field(default_factory=dict)


def http_route(gate: StalenessGate, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any] | None:
    """The gate's HTTP routes, the same on the rollout service and the gateway (``None``: not one of them):
    ``GET /staleness`` (the status), ``POST /staleness`` (configure: any of :meth:`StalenessGate.configure`'s
    settings), ``POST /staleness/report`` (``{version?, consumed?, discarded?}``). Raises :class:`GateError` on a
    bad body (the servers answer 400), nothing changed."""
    body = body or {}
    if method == "GET" and path == "/staleness":
        return gate.status()
    if method != "POST" or path not in ("/staleness", "/staleness/report"):
        return None
    keys = set(SETTINGS) if path == "/staleness" else {"version", "consumed", "discarded"}
    unknown = sorted(set(body) - keys)
    if unknown:
        raise GateError(f"unknown field(s) {unknown} for POST {path}; expected some of {sorted(keys)}")
    if path == "/staleness":
        return gate.configure(**body)
    return gate.report(**body)


SETTINGS = ("max_staleness", "batch_size", "max_concurrent", "mode", "token_max_staleness", "replicas", "replica",
            "admission_timeout_s")


def _int(d: dict[str, Any], key: str, low: int, *, optional: bool = False) -> None:
    """Check a setting: an integer >= ``low`` (``None`` too when ``optional``), else :class:`GateError`."""
    v = d[key]
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise GateError(f"{key} must be an integer >= {low}{' or null' if optional else ''}, got {v!r}")
