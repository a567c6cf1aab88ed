"""Envs for the service tests, registered in-process (``register_all()``) or as a plugin module
(``envhub serve --plugin svc_plugins`` with this directory on PYTHONPATH).

* ``svc-slow``: one task row says how long each stage takes (``init_s``, ``run_s`` per turn, ``eval_s``, ``turns``),
  with asyncio sleeps, so a test can catch a job inside a given stage.
* ``svc-raise-make`` / ``-init`` / ``-run`` / ``-eval`` / ``-aeval``: a plugin whose env or verifier raises in that
  stage (``-aeval``: an async verifier).
* ``svc-crash-text``: a sound verifier that quotes a wrong answer in its details, and a player that answers
  "verifier crashed: fake" (agent-written text that reads like a grader crash).
* ``svc-sandbox``: a ToolEnv with a real bwrap sandbox whose golden player runs ``sleep`` in it (cancel/stop tests);
  its verifier waits ``eval_s`` from the row.
* ``svc-coin``: the golden player solves a task with probability ``p`` (per sample, from the row), so groups have
  reward variance for the DAPO collector; its stages take ``svc-slow``'s times from the row.
"""
from __future__ import annotations

import asyncio
import random
from pathlib import Path

import envhub
from envhub import EnvSpec, Response, Score, TextEnv, ToolEnv, ToolResult, ToolSpec
from envhub.env import FunctionTool, finish_tool
from envhub.policy import call, finish

N_TASKS = 8


def _rows(prefix: str, **extra):
    from envhub.task import to_dataset

    return lambda split: to_dataset([{"task_id": f"{prefix}-{i}", "n": i, **extra} for i in range(N_TASKS)])


# ---- svc-slow ------------------------------------------------------------------------------------------------------
class Slow(TextEnv):
    blocking = False

    async def areset(self, *, seed=None, options=None):
        task = (options or {}).get("task") or {}
        await asyncio.sleep(float(task.get("init_s", 0)))
        return self.reset(seed=seed, options=options)

    async def astep(self, action):
        await asyncio.sleep(float(self.task.get("run_s", 0)))
        return self.step(action)

    def start(self, task):
        return f"Say {task['n']}."

    def respond(self, action):
        done = self.turn >= int(self.task.get("turns", 1))
        return Response(f"again ({self.turn})", done=done, artifacts={"answer": action.text})


class SlowVerifier:
    def verify(self, task, artifacts):
        ok = str(task["n"]) in artifacts.get("answer", "")
        return Score(float(ok), ok)

    async def averify(self, task, artifacts):
        await asyncio.sleep(float(task.get("eval_s", 0)))
        return self.verify(task, artifacts)


# ---- raising plugins -----------------------------------------------------------------------------------------------
class Plain(TextEnv):
    blocking = False

    def start(self, task):
        return f"Say {task['n']}."

    def respond(self, action):
        return Response(done=True, artifacts={"answer": action.text})


class RaiseMake(Plain):
    def __init__(self, *a, **kw):
        raise RuntimeError("plugin bug: the env cannot be constructed")


class RaisePath(Plain):
    """Fails reading a host file: the exception's message names a host path (which must not reach a client)."""

    def start(self, task):
        with open(Path(__file__).with_name("no-such-file.json")) as f:
            return f.read()


class RaiseInit(Plain):
    def start(self, task):
        raise RuntimeError("plugin bug in reset")


class RaiseRun(Plain):
    def respond(self, action):
        raise RuntimeError("plugin bug in step")


def _ok(task, artifacts):
    return str(task["n"]) in artifacts.get("answer", "")


def _raise_verify(task, artifacts):
    raise RuntimeError("plugin bug in the verifier")


class _RaiseAsyncVerify:
    async def averify(self, task, artifacts):
        raise KeyError("plugin bug in averify")

    def verify(self, task, artifacts):
        raise AssertionError("the service grades with averify")


def _echo_verify(task, artifacts):
    """A sound verifier that explains a wrong answer by quoting it: the agent's text lands in its details."""
    answer = artifacts.get("answer", "")
    if answer == str(task["n"]):
        return Score(1.0, True)
    return Score(0.0, False, {"error": answer})


def _say(task, messages):
    return f"{task['n']}"


def _say_crashed(task, messages):
    return "verifier crashed: fake"


# ---- svc-sandbox ---------------------------------------------------------------------------------------------------
def _bash(env, cmd: str = ""):
    r = env.sandbox.shell(cmd, timeout=120)
    return ToolResult(r.output[-2000:] or f"(exit {r.exit_code})")


class SandboxEnv(ToolEnv):
    def sandbox_spec_for(self, task):
        from envhub.sandbox import SandboxSpec

        return SandboxSpec(memory_mb=512, max_procs=64, timeout_s=120)

    def make_tools(self):
        spec = ToolSpec("bash", "Run a shell command.", {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                         "required": ["cmd"]})
        return [FunctionTool(spec, _bash), finish_tool()]

    def start(self, task):
        return f"Run `sleep {task['sleep']}` then finish with {task['n']}."


class LazySandboxEnv(SandboxEnv):
    """Starts its sandbox only when a tool first needs it."""

    lazy_sandbox = True


def _sandbox_golden(task, messages):
    turns = sum(1 for m in messages if m.get("role") == "assistant")
    if turns == 0:
        return call("bash", cmd=f"echo started; sleep {task['sleep']}; echo slept")
    return finish(str(task["n"]))


# ---- svc-coin ------------------------------------------------------------------------------------------------------
def _coin(task, messages):
    """A stochastic player: solves the task with probability task["p"] (fresh randomness per turn)."""
    return f"{task['n']}" if random.random() < float(task["p"]) else "no idea"


def specs() -> list[EnvSpec]:
    return [
        EnvSpec(id="svc-slow", env=Slow, tasks=_rows("slow"), verifier=SlowVerifier(), golden=_say, max_turns=50),
        EnvSpec(id="svc-raise-make", env=RaiseMake, tasks=_rows("rm"), verifier=_ok, golden=_say, max_turns=1),
        EnvSpec(id="svc-raise-init", env=RaiseInit, tasks=_rows("ri"), verifier=_ok, golden=_say, max_turns=1),
        EnvSpec(id="svc-raise-path", env=RaisePath, tasks=_rows("rp"), verifier=_ok, golden=_say, max_turns=1),
        EnvSpec(id="svc-raise-run", env=RaiseRun, tasks=_rows("rr"), verifier=_ok, golden=_say, max_turns=1),
        EnvSpec(id="svc-raise-eval", env=Plain, tasks=_rows("re"), verifier=_raise_verify, golden=_say, max_turns=1),
        EnvSpec(id="svc-raise-aeval", env=Plain, tasks=_rows("ra"), verifier=_RaiseAsyncVerify(), golden=_say,
                max_turns=1),
        EnvSpec(id="svc-crash-text", env=Plain, tasks=_rows("ct"), verifier=_echo_verify, golden=_say_crashed,
                max_turns=1),
        EnvSpec(id="svc-sandbox", env=SandboxEnv, tasks=_rows("sb", sleep=30), verifier=SlowVerifier(),
                golden=_sandbox_golden, max_turns=4),
        EnvSpec(id="svc-hold", env=SandboxEnv, tasks=_rows("hold", sleep=0.5), verifier=SlowVerifier(),
                golden=_sandbox_golden, max_turns=4),
        EnvSpec(id="svc-lazy", env=LazySandboxEnv, tasks=_rows("lazy", sleep=0), verifier=SlowVerifier(),
                golden=_sandbox_golden, max_turns=4),
        EnvSpec(id="svc-coin", env=Slow, tasks=_rows("coin", p=0.5), verifier=SlowVerifier(), golden=_coin,
                max_turns=1),
    ]


def register_all(hub=None) -> None:
    from envhub.plugins import default_hub

    hub = hub or default_hub()
    for spec in specs():
        if spec.id not in hub.specs:
            hub.register(spec, source="tests/service/svc_plugins.py")


@envhub.hookimpl
def envhub_register(registry):
    for spec in specs():
        registry.register(spec)
