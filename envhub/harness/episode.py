"""One harness episode: an unmodified agent CLI in the task's sandbox, its model calls through a gateway session,
its workspace graded by the task set's own verifier, its trajectories from the gateway's builders.

::

    runner = HarnessRunner(Gateway(backend, tokenizer))       # one gateway per backend, served to sandboxes
    trajs = runner.run(envhub.get_spec("swe-gym"), "codex", task)
    runner.close()

RUN: the task env's ``reset`` starts its sandbox (the repository at ``/testbed``); the gateway's Unix socket and the
pinned harness install are bound in read-only; the preset's config files are written; a small forwarder inside
listens on ``127.0.0.1:PORT`` (the sandbox has no other network) and the harness runs with the task's instructions
until it exits, or until the time budget (then the sandbox's processes are killed) or the call budget (the gateway
answers 403, which clients do not retry) runs out. The workspace's artifacts (swe-gym: the diff) are taken as the
env takes them on ``finish``.
EVAL: the task set's verifier, in fresh sandboxes as always. The reward is set on the session and the session's
trajectories built (``prefix_merging`` by default), each marked with the harness, its exit status and the grade.

Every way it can go wrong ends in marked trajectories and nothing left running: the harness not installed (the error
names ``make harness-tools``), crashing (its exit status and output tail in ``details``), never calling the model
(one ``error`` trajectory saying so), looping (the call budget), running past its time (killed with the sandbox).
"""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
from typing import Any

from envhub.gateway.builders import build
from envhub.gateway.core import Gateway
from envhub.failurelog import log_failure
# how the harness process runs in the sandbox is launch.py's; its names stay importable from here
from envhub.harness.launch import FORWARDER, GATEWAY_DIR, PORT, run_harness  # noqa: F401
from envhub.harness.presets import HARNESS_DIR, Preset, get_preset
from envhub.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)


class HarnessRunner:
    """Serves ``gateway`` to sandboxes over a Unix socket (model routes only: a sandboxed agent cannot set rewards,
    start sessions or read other sessions) and runs harness episodes against it.

    ``HarnessRunner(gw)`` serves from a thread (the CLI, tests); ``await HarnessRunner.in_loop(gw)`` serves on the
    running event loop (the rollout service, whose backends' connections belong to its loop).

    ``cpu_quota``: the CPUs' worth of time each harness sandbox may use, at least (a task set's larger quota stands;
    None: uncapped). An agent CLI is a Node.js or Bun program whose start keeps more than one core busy (JIT, GC
    threads): under the 1-CPU default of a task set's sandbox, opencode took 10.3 s to its first model call instead
    of 7.1 s outside, codex 1.16x its bare time instead of 1.05x (``benchmarks/harness.py``).

    Args:
        gateway: the gateway whose model routes the sandboxes reach (its sessions, gate and backend).
        builder: the trajectory builder every episode uses: ``"prefix_merging"`` or ``"per_request"``
            (:func:`~envhub.gateway.builders.build`).
        thread: serve from a :class:`~envhub.gateway.server.GatewayThread` started here (:meth:`in_loop` passes
            ``False`` and serves on its loop instead).
        cpu_quota: see above.

    Raises:
        RuntimeError: the server thread failed to start (``TimeoutError``: not within 30 s).
    """

    def __init__(self, gateway: Gateway, *, builder: str = "prefix_merging", thread: bool = True,
                 cpu_quota: float | None = 2.0):
        from envhub.gateway.server import GatewayThread

        self.gateway, self.builder, self.cpu_quota = gateway, builder, cpu_quota
        self.dir = tempfile.mkdtemp(prefix="envhub-gw-")
        os.chmod(self.dir, 0o755)
        self.sock_path = os.path.join(self.dir, "gw.sock")
        self.server: Any = GatewayThread(gateway, uds=self.sock_path, model_only=True).start() if thread else None
        self._task: Any = None

    @classmethod
    async def in_loop(cls, gateway: Gateway, **kw: Any) -> HarnessRunner:
        """A runner serving ``gateway`` on the running event loop (the rollout service: its backends' connections
        belong to that loop). Close it with :meth:`aclose`.

        Args:
            gateway: the gateway to serve.
            **kw: ``builder`` and ``cpu_quota``, as for the constructor.

        Returns:
            The runner, once its server listens on the Unix socket, or once the serving task has ended: a server
            that failed to start is not raised here (:meth:`aclose` raises its error).
        """
        import asyncio

        from envhub.gateway.server import make_server
        from envhub.http.server import bind_unix

        runner = cls(gateway, thread=False, **kw)
        runner.server = make_server(gateway, model_only=True)
        runner.server.config.install_signal_handlers = False
        runner._task = asyncio.ensure_future(runner.server.serve(sockets=[bind_unix(runner.sock_path)]))
        while not runner.server.started and not runner._task.done():
            await asyncio.sleep(0.01)
        return runner

    async def aclose(self) -> None:
        """Stop the server of a runner from :meth:`in_loop` and remove the socket's directory.

        Raises:
            Exception: what the serving task raised, if it failed.
        """
        if self._task is not None:
            self.server.should_exit = True
            await self._task
        shutil.rmtree(self.dir, ignore_errors=True)

    def close(self) -> None:
        """Stop the server thread and remove the socket's directory (a runner from :meth:`in_loop` is closed with
        :meth:`aclose`: this only removes the directory).

        Raises:
            TimeoutError: the server thread did not stop within 60 s.
        """
        if self._task is None and self.server is not None:
            self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> HarnessRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def episode(self, spec: Any, harness: str | Preset, task: dict, **kw: Any) -> HarnessEpisode:
        """A harness episode to drive in stages (as the rollout service's INIT/RUN/EVAL pools do).

        Args:
            spec: the task set's env spec (``envhub.get_spec(...)``: its ``id``, ``make`` and ``verifier`` are used).
            harness: a preset's name (:data:`~envhub.harness.presets.PRESETS`) or a :class:`Preset`.
            task: the task row.
            **kw: :class:`HarnessEpisode`'s keyword arguments (``timeout_s``, ``max_calls``, ``env_kwargs``...).

        Returns:
            The :class:`HarnessEpisode`, not started.

        Raises:
            ValueError: an unknown preset name.
            HarnessNotInstalled: the harness's pinned install is missing (``make harness-tools``).
        """
        preset = get_preset(harness) if isinstance(harness, str) else harness
        preset.check_installed()
        return HarnessEpisode(self, spec, preset, task, **kw)

    def run(self, spec: Any, harness: str | Preset, task: dict, *, timeout_s: float = 600.0, max_calls: int = 60,
            env_kwargs: dict | None = None) -> list[Trajectory]:
        """One whole episode (INIT, RUN, EVAL), blocking; its env, sandbox and session are released however it ends.

        Args:
            spec: the task set's env spec, as for :meth:`episode`.
            harness: a preset's name or a :class:`Preset`.
            task: the task row.
            timeout_s: the harness's wall-time budget in the sandbox (past it, its processes are killed).
            max_calls: the session's budget of model calls (past it the gateway answers 403 and the harness is
                stopped).
            env_kwargs: keyword arguments for ``spec.make``.

        Returns:
            The session's trajectories, main chain first. A failure in any stage is not raised: it is marked on them
            (``finish_reason="error"``, reward 0, the error's text) and its traceback logged.

        Raises:
            ValueError: an unknown preset name (before anything starts).
            HarnessNotInstalled: the harness's pinned install is missing (before anything starts).
        """
        ep = self.episode(spec, harness, task, timeout_s=timeout_s, max_calls=max_calls, env_kwargs=env_kwargs)
        stage = "init"
        try:
            ep.init_sync()
            stage = "run"
            ep.run_sync()
            stage = "eval"
            ep.evaluate_sync()
        except Exception as e:  # the trajectory is marked; the traceback goes to the log, once
            error = f"{type(e).__name__}: {e}"
            ep.fail("error", error)
            log_failure(log, str(getattr(ep.session, "session_id", "") or "-"), stage, spec.id, ep.task_id, error,
                        exc_info=True)
        finally:
            ep.close_sync()
        return ep.trajectories

    def _run_harness(self, env: Any, preset: Preset, session: Any, instructions: str, timeout_s: float) -> dict:
        return run_harness(env.sandbox, self.dir, preset, session, instructions, timeout_s, harness_dir=HARNESS_DIR)


class HarnessEpisode:
    """One harness episode in stages, with the interface of the executor's ``Episode`` (``init``, ``run``,
    ``evaluate``, ``close``, ``traj``, ``fail``), so the rollout service's INIT/RUN/EVAL pools drive it unchanged.
    ``traj`` is the main chain once evaluated; ``trajectories`` all of the session's.

    Args:
        runner: the runner serving the gateway.
        spec: the task set's env spec (its ``id``, ``make`` and ``verifier`` are used).
        preset: the harness (its install is not checked here: :meth:`HarnessRunner.episode` checks it).
        task: the task row (copied); its ``task_id`` (else ``instance_id``) names the episode.
        timeout_s: the harness's wall-time budget in the sandbox.
        max_calls: the session's budget of model calls.
        env_kwargs: keyword arguments for ``spec.make`` (not read when ``config`` is given).
        config: a :class:`~envhub.rollout.request.RolloutConfig` (its ``env_kwargs`` are read).
        env: an env already made for ``spec`` (default: made by :meth:`init_sync`).
        session_backend: the gateway session's own backend (e.g. a scripted player; default: the gateway's).
        lease: the staleness gate's admission it runs under (a rollout service job's); ``None``: the session is
            admitted by the gateway's gate on its own.
    """

    def __init__(self, runner: HarnessRunner, spec: Any, preset: Preset, task: dict, *, timeout_s: float = 600.0,
                 max_calls: int = 60, env_kwargs: dict | None = None, config: Any = None, env: Any = None,
                 session_backend: Any = None, lease: Any = None):
        from envhub.rollout.request import RolloutConfig

        self.runner, self.spec, self.preset, self.task = runner, spec, preset, dict(task)
        self.timeout_s, self.max_calls, self.session_backend = timeout_s, max_calls, session_backend
        self.lease = lease  # the staleness gate's admission it runs under (a rollout service job's); None: its own
        self.config = config or RolloutConfig(env_kwargs=dict(env_kwargs or {}))
        self.env, self.codec = env, None
        self.task_id = str(task.get("task_id") or task.get("instance_id") or "")
        self.traj = Trajectory(env_id=spec.id, task_id=self.task_id)
        self.trajectories: list[Trajectory] = []
        self.session: Any = None
        self.instructions, self.exit_info, self.artifacts = "", {}, {}
        self.score: Any = None  # the verifier's Score, after EVAL
        self.metrics: dict[str, float] = {}
        self._t0 = time.perf_counter()

    # ---- the executor Episode's bookkeeping --------------------------------------------------------------------
    @property
    def failed(self) -> bool:
        """Whether the episode is marked failed (``traj.finish_reason`` is error, timeout or cancelled)."""
        return self.traj.finish_reason in ("error", "timeout", "cancelled")

    def fail(self, reason: str, error: str) -> None:
        """Mark the episode failed: its trajectories get ``reason`` and ``error``, reward 0, not passed. The first
        failure stands: on an episode already failed this changes nothing.

        Args:
            reason: the finish reason (``"error"``, ``"timeout"``, ``"cancelled"``).
            error: what went wrong.
        """
        if not self.failed:
            self.traj.finish_reason, self.traj.error = reason, error
            self.traj.reward, self.traj.passed = 0.0, False
            for t in self.trajectories:
                t.finish_reason, t.error, t.reward, t.passed = reason, error, 0.0, False

    def trajectory(self) -> Trajectory:
        """The main trajectory, ``traj`` (the executor ``Episode``'s accessor)."""
        return self.traj

    @property
    def turns(self) -> list[tuple[int, int, int]]:
        """The main chain's model calls as the executor's ``Episode.turns`` (see ``envhub.gateway.builders``)."""
        return [tuple(t) for t in self.traj.details.get("turns", [])]

    # ---- stages --------------------------------------------------------------------------------------------------
    def init_sync(self) -> None:
        """INIT: make the env (unless one was given) and reset it on the task, then start the gateway session.

        The task's sandbox gets the harness install and the gateway's socket directory bound in read-only, no
        memory limit, at least 512 processes and at least the runner's ``cpu_quota``. The instructions are the
        first user message of the reset; the session carries ``max_calls`` and ``session_backend``.

        Raises:
            NoCapacity: the gateway's gate has no room for the session (without a ``lease``).
            Exception: whatever the env's ``make`` or ``reset`` raises (a sandbox that cannot start, a bad task).
        """
        if self.env is None:
            self.env = self.spec.make(**self.config.env_kwargs)
        base_spec_for, gateway_dir, cpu_quota = self.env.sandbox_spec_for, self.runner.dir, self.runner.cpu_quota

        def spec_for(t: Any) -> Any:
            s = base_spec_for(t)
            s.binds = list(s.binds) + [(str(HARNESS_DIR), str(HARNESS_DIR), "ro"), (gateway_dir, GATEWAY_DIR, "ro")]
            s.memory_mb = None  # node and the harness binaries reserve far more address space than RLIMIT_AS allows
            s.max_procs = max(s.max_procs or 0, 512)
            if s.cpu_quota is not None:  # an uncapped task set stays uncapped
                s.cpu_quota = None if cpu_quota is None else max(s.cpu_quota, cpu_quota)
            return s

        self.env.sandbox_spec_for = spec_for
        obs, _ = self.env.reset(options={"task": self.task})
        self.instructions = next((m["content"] for m in obs if m.get("role") == "user"), "")
        # admitted by the gateway's staleness gate: under the job's lease, or a lease of its own (429 when full)
        self.session = self.runner.gateway.start_session(self.task_id, task=self.task, lease=self.lease)
        self.session.max_calls, self.session.backend = self.max_calls, self.session_backend

    def run_sync(self) -> None:
        """RUN: run the harness in the sandbox until it exits or a budget runs out, take the workspace's artifacts
        (``env.finish_artifacts``), then release the sandbox. A failure of the run is not raised: it is kept in
        ``exit_info["error"]``."""
        try:
            self.exit_info = self.runner._run_harness(self.env, self.preset, self.session, self.instructions,
                                                      self.timeout_s)
            self.artifacts = self.env.finish_artifacts(None)
        except Exception as e:
            log.warning("harness episode %s/%s failed", self.preset.name, self.task_id, exc_info=True)
            self.exit_info = {**self.exit_info, "error": f"{type(e).__name__}: {e}"}
        finally:
            release = getattr(self.env, "release_sandbox", None)
            if release is not None:
                release()  # the sandbox and every process the harness left behind; EVAL grades in fresh ones
        self.metrics["run_s"] = round(time.perf_counter() - self._t0, 3)

    def evaluate_sync(self) -> None:
        """EVAL: grade the artifacts with the task set's verifier, set the reward on the session (when a call
        finished), end it, build its trajectories and drop it; each trajectory is marked with the harness, its exit
        and the grade.

        A harness that made no model call gives one ``error`` trajectory saying why; a harness error marks every
        trajectory ``error``, and so does a crashed verifier (reward 0); a failure marked before EVAL (the service's
        timeout) still stands.
        """
        from envhub.verifier import safe_verify

        t0 = time.perf_counter()
        self.score = score = safe_verify(self.spec.verifier, self.task, self.artifacts)
        self.metrics["eval_s"] = round(time.perf_counter() - t0, 3)
        gw, session = self.runner.gateway, self.session
        if any(c.ok for c in session.calls):
            gw.set_reward(session, score.reward)
        gw.end_session(session)
        trajs = build(session, self.runner.builder)
        gw.drop_session(session)
        self.session = None
        details = {"harness": self.preset.name, "harness_exit": self.exit_info, "score": score.details}
        if not trajs:
            ex = self.exit_info
            why = ex.get("error") or (f"the {self.preset.name} harness made no model call (exit "
                                      f"{ex.get('exit_code')}): {ex.get('output_tail', '')[-500:]}")
            trajs = [Trajectory.failed(self.spec.id, self.task_id, "error", why, reward=score.reward,
                                       passed=score.passed)]
        for t in trajs:
            t.env_id, t.task_id, t.passed = self.spec.id, self.task_id, score.passed
            t.details.update(details, chains=len(trajs))
            t.metrics.update(self.metrics)
            if self.exit_info.get("error") and t.finish_reason not in ("error", "cancelled"):
                t.finish_reason, t.error = "error", self.exit_info["error"]
            if score.crashed and t.finish_reason not in ("error", "cancelled"):  # no verdict: trained on by no one
                t.finish_reason, t.reward = "error", 0.0
                t.error = f"EVAL: {score.details.get('error') or 'the verifier crashed'}"
        before = (self.traj.finish_reason, self.traj.error) if self.failed else None
        self.trajectories, self.traj = trajs, trajs[0]
        if before is not None:  # a failure marked before EVAL (the service's timeout) stands, with its own message
            reason, error = before
            for t in trajs:  # not fail(): a trajectory EVAL already marked "error" must not keep its own verdict
                t.finish_reason, t.error, t.reward, t.passed = reason, error or reason, 0.0, False

    def close_sync(self) -> None:
        """Close the env (its sandboxes) and drop the gateway session if EVAL did not (the episode was cut short);
        ``trajectories`` holds at least ``traj`` afterwards."""
        env, self.env = self.env, None
        if env is not None:
            env.close()
        if self.session is not None:  # cut short before EVAL: nothing more will be recorded for it
            self.runner.gateway.drop_session(self.session)
            self.session = None
        if not self.trajectories:
            self.trajectories = [self.traj]

    async def init(self) -> None:
        """:meth:`init_sync` in a worker thread."""
        import asyncio

        await asyncio.to_thread(self.init_sync)

    async def run(self) -> None:
        """:meth:`run_sync` in a worker thread."""
        import asyncio

        await asyncio.to_thread(self.run_sync)

    async def evaluate(self) -> None:
        """:meth:`evaluate_sync` in a worker thread."""
        import asyncio

        await asyncio.to_thread(self.evaluate_sync)

    async def close(self) -> None:
        """:meth:`close_sync` in a worker thread."""
        import asyncio

        await asyncio.to_thread(self.close_sync)
