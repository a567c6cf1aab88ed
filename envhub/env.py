"""The environment contract: text and tool environments on top of ``gymnasium.Env``.

An envhub environment is a Gymnasium environment whose observations are chat messages and whose actions are what an
LLM said. It follows Gymnasium's API exactly::

    messages, info = env.reset(options={"task": row})
    messages, reward, terminated, truncated, info = env.step("my answer")

Observations are lists of OpenAI chat messages (``{"role": ..., "content": ...}``). An action is an :class:`Action`
(the decoded assistant text plus parsed tool calls); a plain ``str`` is accepted so a person can drive an env by hand.

Authors do not override ``reset``/``step``. They write two small methods and let the base class do the Gym plumbing
(seeding, task selection, turn budget, malformed input)::

    class Echo(TextEnv):
        def start(self, task):                 # -> str | list[Message]: the opening prompt
            return f"Say {task['word']!r}."
        def respond(self, action):             # -> Response: what the env answers to one action
            return Response(done=True, artifacts={"answer": action.text})

When an episode ends the env puts ``info["artifacts"]``: what the verifier grades (a final answer, a diff...).
The env itself does not grade: grading is the verifier's job (``envhub.verifier``), run by whoever drives the env
(the executor's EVAL stage, admission, or the Gymnasium wrapper that ``gymnasium.make("envhub/<id>-v0")`` returns),
so that it can run after the env's sandbox is gone, and the agent never holds what grades it.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence, Union

import gymnasium

from envhub.arguments import check_arguments
from envhub.spaces import ActionSpace, MessagesSpace
from envhub.types import Action, Message, Response, Task, ToolCall, ToolSpec, as_messages

if TYPE_CHECKING:  # annotations only: plain text envs never load the sandbox layer, the env never imports a verifier
    from envhub.sandbox.base import Sandbox
    from envhub.sandbox.spec import SandboxSpec
    from envhub.verifier import Verifier

TaskSource = Union[Sequence[Task], Callable[[], Sequence[Task]], None]
"""The task rows an env draws from at ``reset`` without ``options['task']``: rows, or a function loading them."""

class TextEnv(gymnasium.Env):
    """A multi-turn text environment. Subclass it and implement :meth:`start` and :meth:`respond`.

    Args:
        tasks: where ``reset()`` without ``options["task"]`` draws a task from (a sequence of rows, a
            ``datasets.Dataset``, or a zero-argument callable returning one, called lazily).
        max_turns: the episode is truncated after this many actions.
        render_mode: ``"ansi"`` renders the conversation as text.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}  # ansi text; fps is meaningless but the checker wants > 0
    tools: list[ToolSpec] = []
    blocking: bool = True
    """Whether ``reset``/``step`` may block (sandboxes, subprocesses, I/O). A pure-Python env whose step takes
    microseconds sets ``False``: its async forms then run inline instead of paying for a worker thread."""
    observation_space = MessagesSpace()
    action_space = ActionSpace()

    def __init__(self, tasks: TaskSource = None, max_turns: int = 16, render_mode: str | None = None):
        self._tasks = tasks
        self.max_turns = max_turns
        self.render_mode = render_mode
        self.observation_space = MessagesSpace()
        self.action_space = ActionSpace()
        self.task: Task | None = None
        self.turn = 0
        self.history: list[Message] = []
        self.done = False
        # set by gymnasium.make("envhub/..."): grade in step() at the end of an episode
        self.verifier: Verifier | None = None

    # ---- what authors implement -------------------------------------------------------------------------------
    def start(self, task: Task) -> str | list[Message]:
        """Prepare the episode for ``task`` and return the opening messages (a ``str`` is one user message)."""
        raise NotImplementedError

    def respond(self, action: Action) -> Response:
        """Answer one action. Must not raise on malformed input: answer it with a message (or end the episode)."""
        raise NotImplementedError

    def begin_episode(self, task: Task) -> None:
        """Called by ``reset`` before :meth:`start`; ``ToolEnv`` starts the episode's sandbox here."""

    def timeout_artifacts(self) -> dict[str, Any]:
        """Artifacts to grade when the episode is cut (turn budget, token budget). Default: nothing to grade."""
        return {}

    # ---- the Gymnasium API ------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode: choose the task, prepare it (:meth:`begin_episode`, :meth:`start`).

        Args:
            seed: seeds ``self.np_random`` (Gymnasium's rule), and so the task chosen when ``options`` names none.
            options: ``{"task": row}`` plays that task row; without one, a task is drawn from the env's tasks with
                ``np_random`` (``ValueError`` when the env was made without tasks).

        Returns:
            ``(messages, info)``: the opening messages (OpenAI chat dicts; what :meth:`start` returned, a string as
            one user message) and ``{"task_id": ...}``.
        """
        super().reset(seed=seed)
        self.task = self._choose_task(options)
        self.turn = 0
        self.done = False
        self.begin_episode(self.task)
        messages = as_messages(self.start(self.task))
        self.history = list(messages)
        return messages, {"task_id": str(self.task.get("task_id", ""))}

    def step(self, action: Action | str):
        """Play one action of the agent.

        Args:
            action: the model's reply: an :class:`Action` (text and parsed tool calls), or a ``str`` (its text, for a
                person driving the env by hand).

        Returns:
            ``(messages, reward, terminated, truncated, info)``: the env's new messages; this step's reward (plus
            the verifier's at the end of an episode when the env grades itself, as ``gymnasium.make`` sets up);
            ``terminated`` when the episode ended (the env said done), ``truncated`` when ``max_turns`` cut it; at
            either, ``info["artifacts"]`` is what the verifier grades (and ``info["score"]`` its score when the env
            grades itself).

        Raises:
            RuntimeError: ``step`` before ``reset``, or after the episode ended.
        """
        if self.task is None:
            raise RuntimeError("step() before reset(): call env.reset(options={'task': row}) first")
        if self.done:
            raise RuntimeError("step() after the episode ended: call reset() to start a new one")
        action = Action.coerce(action)
        self.turn += 1
        self.history.append(action.to_message())
        r = self.respond(action)
        messages = as_messages(r.messages)
        self.history.extend(messages)
        info = dict(r.info)
        terminated, truncated = bool(r.done), False
        if terminated:
            info["artifacts"] = r.artifacts if r.artifacts is not None else {"answer": action.text}
        elif self.turn >= self.max_turns:
            truncated = True
            info["artifacts"] = self.timeout_artifacts()
        self.done = terminated or truncated
        reward = float(r.reward)
        if self.done and self.verifier is not None:
            from envhub.verifier import safe_verify

            score = safe_verify(self.verifier, self.task, info["artifacts"])
            reward += score.reward
            info["score"] = score.to_dict()
        return messages, reward, terminated, truncated, info

    async def areset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Async ``reset``. The default runs the sync form in a worker thread so the event loop never blocks."""
        if not self.blocking:
            return self.reset(seed=seed, options=options)
        return await asyncio.to_thread(self.reset, seed=seed, options=options)

    async def astep(self, action: Action | str):
        """Async ``step``. The default runs the sync form in a worker thread so the event loop never blocks."""
        if not self.blocking:
            return self.step(action)
        return await asyncio.to_thread(self.step, action)

    def render(self) -> str | None:
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m.get('role')}] {m.get('content', '')}" for m in self.history)

    # ---- helpers ----------------------------------------------------------------------------------------------
    def _choose_task(self, options: dict[str, Any] | None) -> Task:
        if options and options.get("task") is not None:
            task = dict(options["task"])
        else:
            tasks = self._tasks() if callable(self._tasks) else self._tasks
            if tasks is None or len(tasks) == 0:
                raise ValueError("reset() needs options={'task': row}: this env was made without a task set")
            self._tasks = tasks  # load once
            task = dict(tasks[int(self.np_random.integers(len(tasks)))])
        task.setdefault("task_id", "")
        return task


class Tool(Protocol):
    """A tool a :class:`ToolEnv` can run: its spec plus ``run(env, arguments) -> ToolResult | str``."""

    spec: ToolSpec

    def run(self, env: ToolEnv, arguments: dict[str, Any]) -> ToolResult | str: ...


@dataclass(slots=True)  # no per-instance dict: one is made for every call
class ToolResult:
    """What one tool call produced. ``done`` ends the episode (the ``finish`` tool); ``error`` marks a failed call."""

    content: str
    done: bool = False
    error: bool = False
    artifacts: dict[str, Any] | None = None


@dataclass
class FunctionTool:
    """A tool made from a plain function ``fn(env, **arguments) -> ToolResult | str``."""

    spec: ToolSpec
    fn: Callable[..., ToolResult | str]

    def run(self, env: ToolEnv, arguments: dict[str, Any]) -> ToolResult | str:
        return self.fn(env, **arguments)


def finish_tool(description: str = "Call when you are done. Give your final answer, if the task asks for one.") -> FunctionTool:
    """The standard ``finish(answer)`` tool: ends the episode; ``env.finish_artifacts(answer)`` is what gets graded."""

    def _finish(env: ToolEnv, answer: Any = "") -> ToolResult:
        return ToolResult("Finished.", done=True, artifacts=env.finish_artifacts(answer))

    spec = ToolSpec("finish", description, {"type": "object", "properties": {"answer": {"type": "string"}}})
    return FunctionTool(spec, _finish)


class ToolEnv(TextEnv):
    """A :class:`TextEnv` whose model acts through tools (function calling).

    Implement :meth:`start` and :meth:`make_tools`; ``respond`` is done for you: each tool call is checked against
    its JSON schema and run (several in parallel, up to ``max_parallel_tools``); each result comes back as a
    ``tool`` message. A ``ToolResult(done=True)`` (the ``finish`` tool) ends the episode. An action with no tool call
    gets a reminder, not an exception.
    """

    max_parallel_tools = 4
    sandbox_spec: SandboxSpec | None = None
    """A ``SandboxSpec``: when set, every ``reset`` starts a fresh sandbox (``self.sandbox``) and ``close`` stops it."""
    sandbox_factory: Callable[[SandboxSpec], Sandbox] | None = None
    """``spec -> Sandbox``; default ``envhub.sandbox.start``. The rollout service passes its prewarmed pool here."""
    lazy_sandbox = False
    """Start the episode's sandbox on the first use of ``self.sandbox`` (a tool call, or ``start`` writing files)
    instead of at ``reset``: an episode that never touches it costs no sandbox. For envs whose tools are optional
    (a math env with a python tool). Then a sandbox start, and its failure, happen in RUN rather than INIT."""

    def __init__(self, tasks: TaskSource = None, max_turns: int = 16, render_mode: str | None = None):
        super().__init__(tasks=tasks, max_turns=max_turns, render_mode=render_mode)
        self._tools: dict[str, Tool] = {t.spec.name: t for t in self.make_tools()}
        self.tools = [t.spec for t in self._tools.values()]
        self._sandbox: Sandbox | None = None
        self._pending_spec: SandboxSpec | None = None  # lazy_sandbox: the spec to start on first use
        self._sandbox_lock = threading.Lock()  # parallel tool calls must not start two

    @property
    def sandbox(self) -> Sandbox | None:
        """This episode's sandbox (``None`` without a ``sandbox_spec``). With :attr:`lazy_sandbox`, started here."""
        if self._sandbox is None and self._pending_spec is not None:
            with self._sandbox_lock:
                if self._sandbox is None and self._pending_spec is not None:
                    self._sandbox = self._start_sandbox(self._pending_spec)
                    self._pending_spec = None
        return self._sandbox

    @sandbox.setter
    def sandbox(self, value: Sandbox | None) -> None:
        self._sandbox, self._pending_spec = value, None

    @property
    def sandbox_started(self) -> bool:
        """Whether this episode has a running sandbox (never starts one)."""
        return self._sandbox is not None

    def sandbox_spec_for(self, task: Task) -> SandboxSpec | None:
        """The sandbox this task runs in (``None``: no sandbox). Default: the class's ``sandbox_spec``."""
        return self.sandbox_spec

    def begin_episode(self, task: Task) -> None:
        self.release_sandbox()
        spec = self.sandbox_spec_for(task)
        if spec is not None:
            if self.lazy_sandbox:
                self._pending_spec = spec
            else:
                self._sandbox = self._start_sandbox(spec)

    def _start_sandbox(self, spec: SandboxSpec) -> Sandbox:
        factory = self.sandbox_factory
        if factory is None:
            from envhub.sandbox import start  # lazy: plain text envs never load the sandbox layer

            factory = start
        return factory(spec)

    def release_sandbox(self) -> None:
        """Stop this episode's sandbox now (the RUN stage frees it before EVAL); a lazy one never started stays so."""
        with self._sandbox_lock:
            sandbox, self._sandbox, self._pending_spec = self._sandbox, None, None
        if sandbox is not None:
            sandbox.stop()

    def close(self) -> None:
        self.release_sandbox()
        super().close()

    def make_tools(self) -> list[Tool]:
        """The tools this env offers. Default: only ``finish``."""
        return [finish_tool()]

    def finish_artifacts(self, answer: Any) -> dict[str, Any]:
        """What gets graded when the model calls ``finish(answer)``. Default: ``{"answer": answer}``."""
        return {"answer": "" if answer is None else str(answer)}

    def respond(self, action: Action) -> Response:
        if action.parse_error and not action.tool_calls:
            return Response(f"Your tool call could not be parsed: {action.parse_error}. Call a tool with valid JSON.")
        if not action.tool_calls:
            names = ", ".join(self._tools)
            return Response(f"No tool call found. Call one of the tools ({names}); call finish when you are done.")
        calls = action.tool_calls
        if len(calls) == 1 or self.max_parallel_tools <= 1:
            results = [self._run_tool(c) for c in calls]
        else:
            with ThreadPoolExecutor(min(len(calls), self.max_parallel_tools)) as pool:
                results = list(pool.map(self._run_tool, calls))
        messages: list[Message] = []
        done, artifacts = False, None
        for call, res in zip(calls, results):
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": res.content})
            if res.done and not done:
                done, artifacts = True, res.artifacts
        return Response(messages, done=done, artifacts=artifacts)

    def _run_tool(self, call: ToolCall) -> ToolResult:
        tool = self._tools.get(call.name)
        if tool is None:
            return ToolResult(f"Error: unknown tool {call.name!r}. Available: {', '.join(self._tools)}.", error=True)
        problem = check_arguments(tool.spec, call.arguments)
        if problem:
            return ToolResult(f"Error: invalid arguments for {call.name}: {problem}", error=True)
        try:
            res = tool.run(self, dict(call.arguments))
        except Exception as e:  # a tool bug must reach the model as a message, not kill the episode
            return ToolResult(f"Error: {call.name} failed: {type(e).__name__}: {e}", error=True)
        return res if isinstance(res, ToolResult) else ToolResult(str(res))
