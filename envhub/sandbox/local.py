"""The ``local`` runtime: the action server as a plain host process. No isolation; for development only.

It is never chosen by ``runtime="auto"``. The workspace is a host directory and ``sandbox.workdir`` is that host
path (``spec.workdir`` cannot be mounted without namespaces). Limits are rlimits on each command; the network is the
host's. ``stop()`` kills the server's process tree and every process still carrying this sandbox's
``ENVHUB_SANDBOX_ID`` in its environment (orphans included, unless they scrubbed their environment).
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from envhub.sandbox import hostfs, lifecycle
from envhub.sandbox.base import Runtime, Sandbox, SandboxSpec
from envhub.sandbox.common import (AGENT_DIR, copy_workspace, new_state_dir, package_dir, server_argv, server_config,
                                   wait_ready)


class LocalRuntime(Runtime):
    """No isolation: commands run as this user on this host. Ask for it by name (``runtime="local"``)."""

    name = "local"

    @classmethod
    def available(cls) -> bool:
        return True

    def start(self, spec: SandboxSpec) -> LocalSandbox:
        sid, state = new_state_dir()
        sb = LocalSandbox(spec, sid, state)
        sb.boot(lambda: copy_workspace(spec.workspace_from, sb.workdir))
        return sb

    def capabilities(self, spec: SandboxSpec | None = None) -> dict[str, Any]:
        spec = spec or SandboxSpec()
        return {
            "runtime": self.name, "isolated": False, "isolation": [], "network": True,
            "limits": {"timeout": f"{spec.timeout_s:g} s per command (wall clock)",
                       "output": f"{spec.output_limit} bytes per stream (head + tail)",
                       "memory": f"RLIMIT_AS={spec.memory_mb} MB per process" if spec.memory_mb else "none",
                       "processes": "none (RLIMIT_NPROC would count every process of this host user)",
                       "file_size": f"RLIMIT_FSIZE={spec.max_file_mb} MB" if spec.max_file_mb else "none",
                       "tmp": "none (the host's /tmp)", "workspace": "host directory (no size cap)",
                       "cpu": "per-command cpu_s", "cpu_quota": "none"},
            "notes": ["no isolation: commands can read and write anything this user can; network is not blocked"],
        }


class LocalSandbox(Sandbox):
    runtime = "local"

    def __init__(self, spec: SandboxSpec, sandbox_id: str, state_dir: str):
        run = os.path.join(state_dir, "run")
        super().__init__(spec, sandbox_id, state_dir, os.path.join(run, "server.sock"),
                         os.path.join(state_dir, "workspace"))
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(state_dir, "server.log")  # the host's: outside the sandbox-writable run/

    def capabilities(self) -> dict[str, Any]:
        return LocalRuntime().capabilities(self.spec)

    def _launch(self) -> None:
        lib = os.path.join(self.state_dir, "lib")
        os.makedirs(lib, exist_ok=True)
        if not os.path.exists(os.path.join(lib, "envhub_agent")):
            os.symlink(AGENT_DIR, os.path.join(lib, "envhub_agent"))
        path = [lib] + [d for d in dict.fromkeys([package_dir("ptyprocess"), package_dir("IPython")]) if d]
        cfg = server_config(self.spec, self.id, self.socket_path, os.path.dirname(self.socket_path), self.workdir,
                            child_memory=True, nproc_rlimit=False, home=self.workdir)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ENVHUB_SANDBOX_ID": self.id, "LANG": "C.UTF-8"}
        log = hostfs.open_log(self.log_path)  # never through a symlink
        try:
            self.proc = lifecycle.spawn(server_argv(sys.executable, path, cfg), cwd=self.workdir, env=env,
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                        start_new_session=True)
        finally:
            os.close(log)
        wait_ready(self.proc, self.log_path, "local action server")

    def _members(self) -> set[int]:
        pids = set(lifecycle.pids_with_env(f"ENVHUB_SANDBOX_ID={self.id}".encode()))
        if self.proc is not None and self.proc.poll() is None:
            pids.add(self.proc.pid)
        return pids

    def _terminate(self, grace_s: float) -> list[int]:
        proc = self.proc
        if proc is None:
            return []
        if grace_s > 0:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
            lifecycle.kill_all(self._members(), signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while self._members() and time.monotonic() < deadline:
                time.sleep(0.01)
        deadline = time.monotonic() + 5.0
        while (left := self._members()) and time.monotonic() < deadline:
            lifecycle.kill_all(left, signal.SIGKILL)
            try:
                proc.wait(timeout=0.01)
            except subprocess.TimeoutExpired:
                pass
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        self.proc = None
        return sorted(left)

    def _cleanup(self) -> None:
        shutil.rmtree(self.state_dir, ignore_errors=True)
