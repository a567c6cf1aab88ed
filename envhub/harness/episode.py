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
answers 403, which clients do not retry) runs out. The workspace's artifacts (swe-gym: the diff) are taken as the env takes them on ``finish``.
EVAL: the task set's verifier, in fresh sandboxes as always. The reward is set on the session and the session's
trajectories built (``prefix_merging`` by default), each marked with the harness, its exit status and the grade.

Every way it can go wrong ends in marked trajectories and nothing left running: the harness not installed (the error
names ``make harness-tools``), crashing (its exit status and output tail in ``details``), never calling the model
(one ``error`` trajectory saying so), looping (the call budget), running past its time (killed with the sandbox).
"""
from __future__ import annotations

import logging
import os
import secrets
import shlex
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any

from envhub.gateway.builders import build
from envhub.gateway.core import Gateway
from envhub.harness.presets import HARNESS_DIR, HOME, Preset, get_preset
from envhub.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)
GATEWAY_DIR = "/run/envhub-gateway"
PORT = 18080
FORWARDER = Path(__file__).with_name("forwarder.py")


class HarnessRunner:
    """Serves ``gateway`` to sandboxes over a Unix socket (model routes only: a sandboxed agent cannot set rewards,
    start sessions or read other sessions) and runs harness episodes against it."""

    def __init__(self, gateway: Gateway, *, builder: str = "prefix_merging"):
        from envhub.gateway.server import GatewayThread

        self.gateway, self.builder = gateway, builder
        self.dir = tempfile.mkdtemp(prefix="envhub-gw-")
        os.chmod(self.dir, 0o755)
        self.server = GatewayThread(gateway, uds=os.path.join(self.dir, "gw.sock"), model_only=True).start()

    def close(self) -> None:
        self.server.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> HarnessRunner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def run(self, spec: Any, harness: str | Preset, task: dict, *, timeout_s: float = 600.0, max_calls: int = 60,
            env_kwargs: dict | None = None) -> list[Trajectory]:
        preset = get_preset(harness) if isinstance(harness, str) else harness
        preset.check_installed()
        task_id = str(task.get("task_id") or task.get("instance_id") or "")
        env = spec.env(**(env_kwargs or {}))
        base_spec_for = env.sandbox_spec_for

        def spec_for(t: Any) -> Any:
            s = base_spec_for(t)
            s.binds = list(s.binds) + [(str(HARNESS_DIR), str(HARNESS_DIR), "ro"), (self.dir, GATEWAY_DIR, "ro")]
            s.memory_mb = None  # node and the harness binaries reserve far more address space than RLIMIT_AS allows
            s.max_procs = max(s.max_procs or 0, 512)
            return s

        env.sandbox_spec_for = spec_for
        session = self.gateway.start_session(task_id, task=task)
        session.max_calls = max_calls
        exit_info: dict[str, Any] = {}
        t0 = time.perf_counter()
        try:
            obs, _ = env.reset(options={"task": task})
            instructions = next((m["content"] for m in obs if m.get("role") == "user"), "")
            exit_info = self._run_harness(env, preset, session, instructions, timeout_s)
            artifacts = env.finish_artifacts(None)
        except Exception as e:
            log.warning("harness episode %s/%s failed", preset.name, task_id, exc_info=True)
            exit_info = {**exit_info, "error": f"{type(e).__name__}: {e}"}
            artifacts = {}
        finally:
            env.close()  # the sandbox and every process the harness left behind
        from envhub.verifier import safe_verify

        run_s = time.perf_counter() - t0
        score = safe_verify(spec.verifier, task, artifacts)
        eval_s = time.perf_counter() - t0 - run_s
        if any(c.ok for c in session.calls):
            self.gateway.set_reward(session, score.reward)
        self.gateway.end_session(session)
        trajs = build(session, self.builder)
        self.gateway.drop_session(session)
        details = {"harness": preset.name, "harness_exit": exit_info, "score": score.details}
        metrics = {"run_s": round(run_s, 3), "eval_s": round(eval_s, 3)}
        if not trajs:
            why = exit_info.get("error") or (f"the {preset.name} harness made no model call (exit "
                                             f"{exit_info.get('exit_code')}): {exit_info.get('output_tail', '')[-500:]}")
            return [Trajectory.failed(spec.id, task_id, "error", why, reward=score.reward, passed=score.passed,
                                      details=details, metrics=metrics)]
        for t in trajs:
            t.env_id, t.task_id, t.passed = spec.id, task_id, score.passed
            t.details.update(details)
            t.metrics.update(metrics)
            if exit_info.get("error") and t.finish_reason not in ("error", "cancelled"):
                t.finish_reason, t.error = "error", exit_info["error"]
        return trajs

    def _run_harness(self, env: Any, preset: Preset, session: Any, instructions: str, timeout_s: float) -> dict:
        sb, key = env.sandbox, session.api_key
        url = f"http://127.0.0.1:{PORT}"
        for path, text in preset.files(url, key).items():
            sb.write_file(path, text)
        sb.write_file("/tmp/envhub-forwarder.py", FORWARDER.read_text())
        python = os.path.realpath(sys.executable)
        argv = [str(preset.path())] + preset.argv(instructions)
        workdir = sb.spec.workdir
        stop_name = f"stop-{secrets.token_hex(8)}"  # the host creates it (in the bound gateway dir) to stop the harness
        script = (f"{shlex.quote(python)} /tmp/envhub-forwarder.py {PORT} {GATEWAY_DIR}/gw.sock >/tmp/fwd.log 2>&1 &\n"
                  f"for i in $(seq 250); do grep -q ready /tmp/fwd.log 2>/dev/null && break; sleep 0.02; done\n"
                  f"cd {shlex.quote(workdir)} || exit 97\n"
                  f"setsid {shlex.join(argv)} </dev/null & H=$!\n"
                  # a watcher stops the harness's whole process group when the host asks; the shell itself waits
                  # on the harness, so its exit is seen at once
                  f"(while [ ! -e {GATEWAY_DIR}/{stop_name} ]; do sleep 0.2; done; "
                  f"echo 'envhub: harness stopped by the host'; kill -TERM -- -$H; sleep 1; kill -KILL -- -$H) & W=$!\n"
                  f"wait $H; S=$?; kill $W 2>/dev/null; exit $S")
        environ = {"HOME": HOME, "PATH": f"{HARNESS_DIR}/npm/node_modules/.bin:{HARNESS_DIR}/venv/bin:/usr/bin:/bin",
                   "NO_COLOR": "1", "TERM": "dumb", **preset.env(url, key)}
        sb.exec(["mkdir", "-p", HOME])
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(sb.exec, ["bash", "-c", script], timeout=timeout_s, env=environ,
                                  output_limit=1 << 16)
            stopped = None
            while not running.done():  # past the call budget the harness is stopped here, whatever it does with
                try:                    # the gateway's refusal (litellm retries even a 403 for minutes)
                    running.result(timeout=0.25)
                except FutureTimeout:
                    if stopped is None and "call_budget_exhausted" in session.flags:
                        stopped = f"stopped: its budget of {session.max_calls} model calls was spent"
                        Path(self.dir, stop_name).touch()
            r = running.result()
        info = {"exit_code": r.exit_code, "timed_out": r.timed_out, "duration_s": round(r.duration_s, 2),
                "output_tail": (r.stdout + r.stderr)[-2000:]}
        if stopped:
            info["stopped"] = stopped
            Path(self.dir, stop_name).unlink(missing_ok=True)
        if r.timed_out:
            info["error"] = f"the {preset.name} harness ran past its {timeout_s:g} s budget and was killed"
        return info
