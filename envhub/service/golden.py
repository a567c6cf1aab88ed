"""``GoldenBackend``: every env's golden policy, played through the real tokenizer, behind one backend.

A rollout server serves many envs through one backend pool, but a :class:`~envhub.backends.scripted.ScriptedBackend`
plays one policy. This backend picks the policy per rollout: the pipeline sets :data:`CURRENT_SPEC` (a context
variable) around each stage of a job, and the backend's policy reads it, so each turn plays that env's
``spec.golden``. Context variables follow the asyncio task, so concurrent jobs never see each other's env.

It is what ``envhub serve --backend golden`` serves: the whole service (HTTP, pipeline, sandboxes, verifiers) runs
end to end with a player known to pass, which is how the service's tests and benchmarks exercise it without a GPU.
"""
from __future__ import annotations

import contextvars
from typing import Any

from envhub.backends.scripted import ScriptedBackend

CURRENT_SPEC: contextvars.ContextVar[Any] = contextvars.ContextVar("envhub_service_current_spec", default=None)
"""The ``EnvSpec`` of the job whose stage is running in this asyncio task (set by the pipeline)."""


class GoldenBackend(ScriptedBackend):
    """A :class:`ScriptedBackend` whose policy is ``policy_of(spec)`` (default: ``spec.golden``) for the job's env,
    read from :data:`CURRENT_SPEC`."""

    name = "golden"

    def __init__(self, policy_of: Any = None):
        self.policy_of = policy_of or (lambda spec: spec.golden)
        super().__init__(self._play_current_env)

    def open_session(self, session_id: str, **kwargs: Any) -> None:
        _current_spec()  # refuse at once outside the service's pipeline, before any turn is played
        super().open_session(session_id, **kwargs)

    def _play_current_env(self, task: Any, messages: list) -> Any:
        return self.policy_of(_current_spec())(task, messages)


def _current_spec() -> Any:
    spec = CURRENT_SPEC.get()
    if spec is None:
        raise RuntimeError("GoldenBackend needs the rollout service's pipeline (CURRENT_SPEC is not set); "
                           "outside the service use ScriptedBackend(spec.golden)")
    return spec
