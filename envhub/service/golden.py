"""``GoldenBackend``: every env's golden policy, played through the real tokenizer, behind one backend.

A rollout server serves many envs through one backend pool, but a :class:`~envhub.backends.scripted.ScriptedBackend`
plays one policy. This backend picks the policy per session: it is given ``spec_of(session_id) -> EnvSpec``, and
when a session opens it plays that env's ``spec.golden`` for the whole session. The rollout service gives it
``spec_of`` when the backend joins its pool (a job's rollout session id is its job id, so the service looks the
job up); nothing is read from ambient state, so concurrent jobs of different envs cannot see each other's env.

It is what ``envhub serve --backend golden`` serves: the whole service (HTTP, pipeline, sandboxes, verifiers) runs
end to end with a player known to pass, which is how the service's tests and benchmarks exercise it without a GPU.
Outside the service, play one env's golden with ``ScriptedBackend(spec.golden)``.
"""
from __future__ import annotations

from typing import Any, Callable

from envhub.backends.scripted import ScriptedBackend


class GoldenBackend(ScriptedBackend):
    """A :class:`ScriptedBackend` that plays, in each session, ``policy_of(spec)`` (default: ``spec.golden``) of
    the env ``spec_of(session_id)`` names (see the module docstring)."""

    name = "golden"

    def __init__(self, spec_of: Callable[[str], Any] | None = None, *, policy_of: Callable[[Any], Any] | None = None):
        self.spec_of = spec_of
        self.policy_of = policy_of or (lambda spec: spec.golden)
        super().__init__(_per_session)

    def open_session(self, session_id: str, *, task: Any = None, messages: list | None = None, codec: Any = None) -> None:
        if self.spec_of is None:  # refused at once, before any turn is played
            raise RuntimeError("GoldenBackend plays the env of each rollout-service job and was given no spec_of "
                               "(the service gives it one when it joins its pool); outside the service use "
                               "ScriptedBackend(spec.golden)")
        self._open(session_id, self.policy_of(self.spec_of(session_id)), task, messages, codec)


def _per_session(task: Any, messages: list) -> Any:
    raise AssertionError("GoldenBackend has no policy of its own: each session plays its env's golden")
