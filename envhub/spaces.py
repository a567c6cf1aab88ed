"""Gymnasium spaces for text envs: observations are lists of chat messages, actions are text.

``gymnasium.utils.env_checker.check_env`` samples from these spaces and checks every observation is contained in
``observation_space``; ``ActionSpace.sample()`` yields random printable text, so the checker also feeds every env
malformed input.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envhub.types import Message

import gymnasium
import numpy as np


class MessagesSpace(gymnasium.Space):
    """The observation space: lists of chat messages (dicts with a ``role`` and string ``content``)."""

    ROLES = ("system", "user", "assistant", "tool")

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        n = int(self.np_random.integers(1, 3))
        return [{"role": "user", "content": _random_text(self.np_random)} for _ in range(n)]

    def contains(self, x: Any) -> bool:
        return isinstance(x, list) and all(
            isinstance(m, dict) and m.get("role") in self.ROLES and isinstance(m.get("content", ""), str) for m in x
        )

    def __repr__(self) -> str:
        return "MessagesSpace()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, MessagesSpace)


class ActionSpace(gymnasium.Space):
    """The action space: free text (``str``) or an :class:`Action`. ``sample()`` yields random printable text."""

    def __init__(self, seed: int | None = None):
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return _random_text(self.np_random)

    def contains(self, x: Any) -> bool:
        from envhub.types import Action

        return isinstance(x, (str, Action))

    def __repr__(self) -> str:
        return "ActionSpace()"

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, ActionSpace)


def _random_text(rng: np.random.Generator) -> str:
    return "".join(chr(int(c)) for c in rng.integers(32, 127, size=int(rng.integers(0, 40))))
