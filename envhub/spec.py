"""``EnvSpec``: everything the hub knows about one environment, as a plugin registers it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from envhub.env import TextEnv
from envhub.policy import Policy, noop
from envhub.rewards import RewardConfig
from envhub.verifier import Verifier, as_verifier


@dataclass
class EnvSpec:
    """One registered environment.

    Args:
        id: the hub id (``"countdown"``); the Gymnasium id is ``envhub/<id>-v<major>``.
        env: a factory (usually the env class) called as ``env(tasks=..., max_turns=..., **kwargs)``.
        tasks: ``split -> datasets.Dataset`` of task rows.
        verifier: grades ``(task, artifacts)``; a plain function is wrapped in ``FunctionVerifier``.
        golden: the policy that solves every task (admission: must pass).
        noop: the policy that does nothing (admission: must fail). Default: finish at once.
        hack_probes: named policies that try known reward hacks (admission: each must fail).
        sandbox: the ``SandboxSpec`` its episodes run in, if any (informational; the env starts it).
        max_turns: the default turn budget.
        rewards: how the outcome and the env's step rewards compose (``envhub.rewards``: caps, weights, DAPO's
            overlong penalty); None: the defaults (process rewards at most half the outcome).
    """

    id: str
    env: Callable[..., TextEnv]
    tasks: Callable[[str], Any]
    verifier: Verifier | Callable[..., Any]
    golden: Policy
    version: str = "0.1.0"
    noop: Policy = noop
    hack_probes: dict[str, Policy] = field(default_factory=dict)
    sandbox: Any = None
    max_turns: int = 16
    default_split: str = "test"
    summary: str = ""
    tags: list[str] = field(default_factory=list)
    rewards: RewardConfig | None = None
    distribution: str = ""  # filled in by the plugin manager: which installed package provided this spec

    def __post_init__(self):
        if not self.id or not all(c.isalnum() or c in "-_." for c in self.id):
            raise ValueError(f"invalid env id {self.id!r}: use letters, digits, '-', '_' or '.'")
        self.verifier = as_verifier(self.verifier)

    @property
    def major(self) -> int:
        return int(str(self.version).split(".")[0] or 0)

    @property
    def gym_id(self) -> str:
        return f"envhub/{self.id}-v{self.major}"

    def load_tasks(self, split: str | None = None):
        """The task set of ``split`` (default ``default_split``) as a ``datasets.Dataset``."""
        return self.tasks(split or self.default_split)

    def make(self, split: str | None = None, grade: bool = False, **kwargs: Any) -> TextEnv:
        """A new env. Without ``options["task"]``, ``reset`` draws from ``split``. ``grade=True`` attaches the
        verifier so ``step`` returns the final grade as reward (what ``gymnasium.make`` does)."""
        kwargs.setdefault("max_turns", self.max_turns)
        env = self.env(tasks=lambda: self.load_tasks(split), **kwargs)
        if grade:
            env.verifier = as_verifier(self.verifier)  # already one after __post_init__; typed so
        return env
