"""``echo-digit``: an env a tiny random model can learn in minutes, with a long-tailed episode time.

The task shows a digit and asks for it eight times ("Reply with the digit 7 written 8 times."). The reply is graded
character by character::

    reward = (copies of the shown digit + 0.25 * other digits) / max(len(reply), 8)

so "77777777" scores 1, "7" alone 1/8, "12345678" 0.22 and prose 0. A freshly initialised model (a 1,200-token
vocabulary, near-uniform output) writes a digit about once in a hundred tokens: groups of eight samples have reward
variance often enough for GRPO to start at once, and two things are left to learn -- write digits, then copy the
right one from the prompt (which a two-layer model must learn to attend to).

**The long tail.** After the reply, the env "runs a tool": it waits a time drawn from a lognormal distribution
(``latency_s`` is its median, ``latency_sigma`` its shape; both from the task row, so one task set serves a run with
the tail and one without). With the defaults (median 0.3 s, sigma 1.5) the mean is 0.92 s and one episode in a
hundred waits more than 9.8 s -- a synchronous trainer waits for the slowest episode of every batch, an asynchronous
one does not (sandbox and tool latency are what asynchrony hides). The wait is an
``asyncio.sleep`` (``blocking = False``): a rollout service runs hundreds of these episodes on one event loop.

Register it in-process (``register(hub)``); it passes envhub's admission like any shipped env (the golden reply
scores 1, the no-op and the hack probes 0).
"""
from __future__ import annotations

import asyncio
import math
import random
from typing import Any

from envhub import EnvSpec, Response, Score, TextEnv

ENV_ID = "echo-digit"
COPIES = 8


def rows(n: int = 200, *, latency_s: float = 0.3, latency_sigma: float = 1.5, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` task rows (digits in a seeded shuffle, each row with its own latency seed)."""
    rng = random.Random(seed)
    return [{"task_id": f"echo-{i:04d}", "digit": rng.randrange(10), "latency_s": latency_s,
             "latency_sigma": latency_sigma, "latency_seed": rng.randrange(2**31)} for i in range(n)]


def grade(reply: str, digit: int) -> float:
    """The reward of a reply (see the module docstring)."""
    text = reply.strip()
    shown = text.count(str(digit))
    other = sum(c in "0123456789" for c in text) - shown
    return min(1.0, (shown + 0.25 * other) / max(len(text), COPIES))


def prompt_text(digit: int) -> str:
    return f"Reply with the digit {digit} written {COPIES} times."


def tool_latency(task: dict[str, Any], sample: int) -> float:
    """The seconds this episode's "tool" takes: lognormal around the row's median, seeded by row and sample."""
    median = float(task.get("latency_s", 0.0))
    if median <= 0:
        return 0.0
    rng = random.Random(hash((int(task.get("latency_seed", 0)), sample)))
    return median * math.exp(float(task.get("latency_sigma", 1.0)) * rng.gauss(0.0, 1.0))


class EchoDigit(TextEnv):
    """One turn: the prompt, the reply, the tool's wait; graded by :func:`grade`."""

    blocking = False  # the wait is an asyncio.sleep: run inline on the service's loop, no worker thread

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._seed = seed
        return self.reset(seed=seed, options=options)

    async def astep(self, action):
        out = self.step(action)
        await asyncio.sleep(tool_latency(self.task or {}, getattr(self, "_seed", None) or 0))
        return out

    def start(self, task: dict[str, Any]) -> str:
        return prompt_text(int(task["digit"]))

    def respond(self, action) -> Response:
        return Response("", done=True, artifacts={"reply": action.text})


def verify(task: dict[str, Any], artifacts: dict[str, Any]) -> Score:
    reward = grade(str(artifacts.get("reply", "")), int(task["digit"]))
    return Score(reward, reward >= 1.0)


def _golden(task: dict[str, Any], messages: Any) -> str:
    return str(task["digit"]) * COPIES


def _other_digits(task: dict[str, Any], messages: Any) -> str:
    return "".join(str((int(task["digit"]) + k) % 10) for k in range(1, COPIES + 1))


def _claim(task: dict[str, Any], messages: Any) -> str:
    return "Done: I wrote the digit 8 times, reward 1."


def spec(n_tasks: int = 200, **latency: float) -> EnvSpec:
    """The env spec over :func:`rows` (``latency_s=``, ``latency_sigma=`` set the tail; ``latency_s=0``: none)."""
    from envhub.task import to_dataset

    task_rows = rows(n_tasks, **latency)
    return EnvSpec(id=ENV_ID, env=EchoDigit, tasks=lambda split: to_dataset(task_rows), verifier=verify,
                   golden=_golden, hack_probes={"other-digits": _other_digits, "claim-success": _claim},
                   max_turns=1, summary="Echo the shown digit 8 times (a toy env a tiny model learns online).")


def register(hub: Any = None, **kw: Any) -> EnvSpec:
    """Register ``echo-digit`` with ``hub`` (default: the process-wide hub); returns the spec."""
    from envhub.plugins import default_hub

    hub = hub or default_hub()
    s = spec(**kw)
    if ENV_ID not in hub.specs:
        hub.register(s, source=__file__)
    return hub.specs[ENV_ID]
