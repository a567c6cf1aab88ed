"""Reward composition: the outcome and process rewards, with caps that keep the outcome dominant by construction.

An env may reward steps (credit for a checkpoint, a penalty for a broken tool call): each ``step`` returns a reward,
and ``info["reward_components"] = {"name": value}`` names its parts (unnamed, it is the component ``"step"``). A
single uncapped shaping term can swallow the outcome: a policy learns to farm it. :func:`compose` therefore bounds
every part:

1. each component's steps are summed (``raw``), weighted (``weight``) and clipped to ``[-cap, cap]`` (``capped``);
2. the components' sum is clipped to ``[-penalty_cap * w, process_cap * w]`` (``w``: the outcome weight);
3. DAPO's soft overlong penalty (Yu et al. 2025, eq. 13: 0 up to ``max_length - buffer`` tokens, then falling
   linearly to ``-factor`` at ``max_length`` and below), when configured, is the component ``"overlong"``: it
   counts inside the caps like any penalty;
4. ``total = w * outcome + process``, then the optional ``clip``.

**The guarantee.** Defaults: outcome weight 1, bonuses at most 0.5 of it, penalties at most 0.25 of it.
:class:`RewardConfig` refuses ``process_cap + penalty_cap >= 1``, so an episode that passed with outcome reward 1
(total at least ``w * (1 - penalty_cap)``) always outranks one that failed with outcome reward 0 (total at most
``w * process_cap``), whatever the process rewards of either (``tests/core/test_rewards.py`` checks it on random
components). An outcome reward ``r`` between 0 and 1 is lifted at most ``process_cap * w`` by shaping.

**Per step.** ``step_rewards`` gives each step its share of the capped process reward (each component's steps
scaled by its cap's factor, then all by the total cap's), so they sum to ``process``; trainers read them per turn
(veRL ``turn_scores``, AReaL per-interaction rewards); :func:`token_rewards` puts them on token positions for a
trainer that takes a reward per token. Raw and capped values are both recorded (:meth:`Composed.to_dict`).
Group normalisation of rewards is an advantage estimator's job (``envhub.training.advantages``), not composition's.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

DEFAULT_COMPONENT = "step"


@dataclass(frozen=True)
class Component:
    """One process-reward component: ``weight`` times its summed steps, clipped to ``[-cap, cap]`` (None: only the
    total's caps apply)."""

    weight: float = 1.0
    cap: float | None = None

    def __post_init__(self) -> None:
        if self.weight < 0:
            raise ValueError(f"a component weight must be >= 0 (a penalty is a negative reward), got {self.weight}")
        if self.cap is not None and self.cap < 0:
            raise ValueError(f"a component cap must be >= 0, got {self.cap}")


@dataclass(frozen=True)
class Overlong:
    """DAPO's soft overlong punishment over the response's model tokens."""

    max_length: int
    buffer: int
    factor: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.buffer <= self.max_length:
            raise ValueError(f"Overlong needs 0 < buffer <= max_length, got {self.buffer} and {self.max_length}")

    def penalty(self, length: int) -> float:
        free = self.max_length - self.buffer
        if length <= free:
            return 0.0
        if length >= self.max_length:
            return -self.factor
        return -self.factor * (length - free) / self.buffer


@dataclass(frozen=True)
class RewardConfig:
    """How rewards are composed (see the module docstring); an ``EnvSpec`` carries one as ``rewards``."""

    outcome_weight: float = 1.0
    process_cap: float = 0.5
    penalty_cap: float = 0.25
    components: dict[str, Component] = field(default_factory=dict)
    default: Component = Component()
    overlong: Overlong | None = None
    clip: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        if self.outcome_weight <= 0:
            raise ValueError(f"outcome_weight must be > 0, got {self.outcome_weight}")
        if self.process_cap < 0 or self.penalty_cap < 0:
            raise ValueError("process_cap and penalty_cap must be >= 0")
        if self.process_cap + self.penalty_cap >= 1:
            raise ValueError(f"process_cap {self.process_cap} + penalty_cap {self.penalty_cap} >= 1: process rewards "
                             "could then outweigh the outcome (a failed episode could outrank a passed one)")
        if self.clip is not None and not self.clip[0] < self.clip[1]:
            raise ValueError(f"clip must be (low, high) with low < high, got {self.clip}")

    def component(self, name: str) -> Component:
        return self.components.get(name, self.default)


@dataclass
class Composed:
    """A composed reward: ``total`` and how it was made."""

    total: float
    outcome: float
    process: float
    process_raw: float
    step_rewards: list[float]
    components: dict[str, dict[str, float]]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _clip(x: float, lo: float, hi: float) -> float:
    return min(hi, max(lo, x))


def step_components(reward: float, info: dict[str, Any] | None) -> dict[str, float]:
    """One step's components: ``info["reward_components"]`` when the env names them, else ``{"step": reward}``."""
    named = (info or {}).get("reward_components")
    if isinstance(named, dict) and named:
        return {str(k): float(v) for k, v in named.items()}
    return {DEFAULT_COMPONENT: float(reward)} if reward else {}


def compose(outcome: float, steps: list[dict[str, float]], config: RewardConfig | None = None, *,
            response_length: int | None = None) -> Composed:
    """Compose ``outcome`` (the verifier's reward) with the per-step components ``steps`` (see the module doc)."""
    cfg = config or RewardConfig()
    steps = [dict(s) for s in steps]
    if cfg.overlong is not None and response_length is not None:
        pen = cfg.overlong.penalty(response_length)
        if pen:
            if not steps:
                steps.append({})
            steps[-1]["overlong"] = steps[-1].get("overlong", 0.0) + pen
    names = sorted({n for s in steps for n in s})
    comps: dict[str, dict[str, float]] = {}
    scale: dict[str, float] = {}
    for n in names:
        c = cfg.component(n)
        raw = sum(s.get(n, 0.0) for s in steps)
        weighted = c.weight * raw
        capped = weighted if c.cap is None else _clip(weighted, -c.cap, c.cap)
        comps[n] = {"raw": raw, "weight": c.weight, "weighted": weighted, "capped": capped}
        scale[n] = capped / weighted if weighted else 0.0
    w = cfg.outcome_weight
    summed = sum(v["capped"] for v in comps.values())
    process = _clip(summed, -cfg.penalty_cap * w, cfg.process_cap * w)
    factor = process / summed if summed else 0.0
    per_step = [factor * sum(cfg.component(n).weight * v * scale[n] for n, v in s.items()) for s in steps]
    total = w * float(outcome) + process
    if cfg.clip is not None:
        total = _clip(total, *cfg.clip)
    raw_total = sum(v["weighted"] for v in comps.values())
    return Composed(total, float(outcome), process, raw_total, per_step, comps)


def token_rewards(step_rewards: list[float], action_ranges: list[tuple[int, int]], n_tokens: int,
                  total: float) -> list[float]:
    """Rewards on token positions (``len == n_tokens``, the trajectory's ``response_ids``): step ``i``'s reward on
    the last token of the ``i``-th model span (``Trajectory.action_ranges``), and the rest of ``total`` (the
    weighted outcome) on the last model token, so the list sums to ``total``. Steps beyond the spans (a model turn
    with no env reply between it and the next merges two spans) go on the last span. No model token: all zeros."""
    out = [0.0] * n_tokens
    if not action_ranges or n_tokens == 0:
        return out
    last = len(action_ranges) - 1
    for i, r in enumerate(step_rewards):
        out[action_ranges[min(i, last)][1] - 1] += r
    out[action_ranges[last][1] - 1] += total - sum(step_rewards)
    return out
