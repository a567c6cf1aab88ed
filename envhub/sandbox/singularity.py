"""Apptainer / SingularityCE runtime: the HPC path, rootless, no daemon, ``.sif`` images.

envhub builds the command lines itself (:func:`instance_start_argv`, :func:`server_exec_argv`,
:func:`instance_stop_argv`) so every isolation flag is explicit and testable:

    apptainer instance start --containall --no-mount home,cwd,bind-paths --pid [--fakeroot]
        [--net --network none] [--overlay DIR] --hostname H --workdir <state>/scratch --bind ... IMAGE NAME
    apptainer exec --cleanenv --pwd WORKDIR instance://NAME python3 -I -S -c <boot> <config>

``--containall`` gives private /tmp, home, IPC and environment; ``--no-mount`` drops the admin's default binds;
``--pid`` a PID namespace; ``--net --network none`` a network namespace with loopback only (unless
``spec.network``). The action server is the same as bwrap's (bound in read-only with ptyprocess); the image must
provide ``python3`` (and IPython for the python tool). ``stop()`` runs ``instance stop`` (SIGTERM, then
``--force`` SIGKILL after the grace period) and confirms the instance is gone from ``instance list``.

spython is used where it helps: :func:`build_image` and :func:`inspect_image` (its quirks are handled: flags only
through ``options=[...]``, ``sys.exit`` on some errors, ``FileNotFoundError`` when the binary is absent).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from typing import Any

from envhub.sandbox import hostfs, lifecycle
from envhub.sandbox.base import Runtime, RuntimeUnavailable, Sandbox, SandboxError, SandboxSpec
from envhub.sandbox.common import (AGENT_DIR, copy_workspace, new_state_dir, package_dir, server_argv,
                                   server_config, wait_ready)

RUN_DIR = "/run/envhub"
LIB_DIR = "/run/envhub-agent"


def find_binary(names: tuple[str, ...] = ("apptainer", "singularity")) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def instance_start_argv(binary: str, spec: SandboxSpec, name: str, state_dir: str) -> list[str]:
    """The ``instance start`` command line for ``spec`` (pure)."""
    if not spec.image:
        raise SandboxError("the singularity runtime needs spec.image: a .sif file or a sandbox directory")
    argv = [binary, "instance", "start", "--containall", "--no-mount", "home,cwd,bind-paths", "--pid"]
    if spec.fakeroot:
        argv.append("--fakeroot")
    if not spec.network:
        argv += ["--net", "--network", "none"]
    if spec.overlay:
        argv += ["--overlay", spec.overlay]
    if os.geteuid() == 0:  # apptainer applies cgroup limits only for root (or with a cgroups v2 systemd delegation)
        if spec.memory_mb:
            argv += ["--memory", f"{int(spec.memory_mb)}M"]
        if spec.max_procs:
            argv += ["--pids-limit", str(int(spec.max_procs) + 3)]
    argv += ["--hostname", spec.hostname, "--workdir", os.path.join(state_dir, "scratch")]
    binds = [(os.path.join(state_dir, "run"), RUN_DIR, "rw"), (AGENT_DIR, f"{LIB_DIR}/envhub_agent", "ro")]
    pty_dir = package_dir("ptyprocess")
    if pty_dir:
        binds.append((os.path.join(pty_dir, "ptyprocess"), f"{LIB_DIR}/ptyprocess", "ro"))
    if not spec.workspace_size_mb:
        binds.append((os.path.join(state_dir, "workspace"), spec.workdir, "rw"))
    binds += spec.parsed_binds()
    for host, dest, mode in binds:
        argv += ["--bind", f"{host}:{dest}:{mode}"]
    return argv + [spec.image, name]


def server_exec_argv(binary: str, spec: SandboxSpec, name: str, cfg: dict) -> list[str]:
    """The ``exec`` command line that runs the action server inside the instance (pure)."""
    python = spec.python or "python3"
    return [binary, "exec", "--cleanenv", "--pwd", spec.workdir, f"instance://{name}"] + \
        server_argv(python, [LIB_DIR], cfg)


def instance_stop_argv(binary: str, name: str, grace_s: float, force: bool = False) -> list[str]:
    argv = [binary, "instance", "stop", "--timeout", str(max(1, int(round(grace_s))))]
    if force:
        argv.append("--force")
    return argv + [name]


class SingularityRuntime(Runtime):
    """Sandboxes as Apptainer/SingularityCE instances (whichever binary is installed; ``apptainer`` first)."""

    name = "singularity"
    binaries: tuple[str, ...] = ("apptainer", "singularity")

    @classmethod
    def available(cls) -> bool:
        return find_binary(cls.binaries) is not None

    def binary(self) -> str:
        path = find_binary(self.binaries)
        if path is None:
            raise RuntimeUnavailable(f"neither of {', '.join(self.binaries)} is installed: install Apptainer "
                                     f"(https://apptainer.org/docs/admin/main/installation.html) or SingularityCE, "
                                     f"or use runtime='bwrap'")
        return path

    def start(self, spec: SandboxSpec) -> SingularitySandbox:
        binary = self.binary()
        if not spec.image:
            raise SandboxError("the singularity runtime needs spec.image: a .sif file or a sandbox directory")
        sid, state = new_state_dir()
        sb = SingularitySandbox(spec, sid, state, binary)

        def prepare() -> None:
            os.makedirs(os.path.join(state, "scratch"))
            if not spec.workspace_size_mb:
                copy_workspace(spec.workspace_from, os.path.join(state, "workspace"))

        sb.boot(prepare)
        return sb

    def capabilities(self, spec: SandboxSpec | None = None) -> dict[str, Any]:
        spec = spec or SandboxSpec()
        root = os.geteuid() == 0
        return {
            "runtime": self.name, "isolated": True,
            "isolation": ["mount", "pid", "ipc"] + ([] if spec.network else ["net"]) + (["user"] if spec.fakeroot
                                                                                        else []),
            "network": bool(spec.network),
            "limits": {"timeout": f"{spec.timeout_s:g} s per command (wall clock)",
                       "output": f"{spec.output_limit} bytes per stream (head + tail)",
                       "memory": f"apptainer --memory {spec.memory_mb}M (cgroup)" if root and spec.memory_mb
                       else f"RLIMIT_AS={spec.memory_mb} MB per process",
                       "processes": "apptainer --pids-limit (cgroup)" if root and spec.max_procs
                       else f"RLIMIT_NPROC={spec.max_procs} (binds only a non-root host uid)",
                       "file_size": f"RLIMIT_FSIZE={spec.max_file_mb} MB" if spec.max_file_mb else "none",
                       "tmp": "apptainer session directory (sized by the admin's 'sessiondir max size')",
                       "workspace": "host directory (no size cap)", "cpu": "per-command cpu_s",
                       "cpu_quota": "none (not implemented for this runtime)"},
            "notes": ["flags built by envhub: --containall --no-mount home,cwd,bind-paths --pid"],
        }


class ApptainerRuntime(SingularityRuntime):
    """Same as :class:`SingularityRuntime`, but only the ``apptainer`` binary will do."""

    name = "apptainer"
    binaries = ("apptainer",)


class SingularitySandbox(Sandbox):
    runtime = "singularity"

    def __init__(self, spec: SandboxSpec, sandbox_id: str, state_dir: str, binary: str):
        super().__init__(spec, sandbox_id, state_dir, os.path.join(state_dir, "run", "server.sock"), spec.workdir)
        self.binary = binary
        self.instance = f"envhub-{sandbox_id}"
        self.proc: subprocess.Popen | None = None
        self.log_path = os.path.join(state_dir, "server.log")  # the host's: outside the sandbox-writable run/
        self.started = False

    def capabilities(self) -> dict[str, Any]:
        return SingularityRuntime().capabilities(self.spec)

    def _launch(self) -> None:
        r = subprocess.run(instance_start_argv(self.binary, self.spec, self.instance, self.state_dir),
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise SandboxError(f"{os.path.basename(self.binary)} instance start failed ({r.returncode}): "
                               f"{(r.stderr or r.stdout).strip()[-2000:]}")
        self.started = True
        cfg = server_config(self.spec, self.id, f"{RUN_DIR}/server.sock", RUN_DIR, self.spec.workdir,
                            child_memory=os.geteuid() != 0, nproc_rlimit=os.geteuid() != 0)
        log = hostfs.open_log(self.log_path)  # never through a symlink
        try:
            self.proc = lifecycle.spawn(server_exec_argv(self.binary, self.spec, self.instance, cfg),
                                        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                        start_new_session=True)
        finally:
            os.close(log)
        wait_ready(self.proc, self.log_path, f"{os.path.basename(self.binary)} instance {self.instance}")

    def instance_running(self) -> bool:
        try:
            r = subprocess.run([self.binary, "instance", "list", "--json", self.instance], capture_output=True,
                               text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
        try:
            found = json.loads(r.stdout or "{}").get("instances") or []
        except ValueError:
            return False
        return any(i.get("instance") == self.instance for i in found)

    def _terminate(self, grace_s: float) -> list[int]:
        left: list[int] = []
        if self.started:
            for force in (False, True):
                try:
                    subprocess.run(instance_stop_argv(self.binary, self.instance, grace_s, force), capture_output=True,
                                   timeout=max(30, grace_s + 30))
                except (OSError, subprocess.TimeoutExpired):
                    pass
                if not self.instance_running():
                    break
            else:
                left = [-1]  # the instance is still listed: reported by stop()
            self.started = bool(left)
        if self.proc is not None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            self.proc = None
        return left

    def _cleanup(self) -> None:
        shutil.rmtree(self.state_dir, ignore_errors=True)


# ---- images (through spython) ------------------------------------------------------------------------------------
def _spython_client():
    try:
        from spython.main import Client
    except ImportError as e:
        raise RuntimeUnavailable("spython is not installed: pip install 'envhub[singularity]'") from e
    return Client


def build_image(source: str, image: str, *, fakeroot: bool = True, force: bool = False) -> str:
    """Build ``image`` (a .sif path) from ``source`` (a definition file, ``docker://...``, a sandbox dir)."""
    client = _spython_client()
    options = (["--fakeroot"] if fakeroot else []) + (["--force"] if force else [])
    try:
        result = client.build(recipe=source, image=image, sudo=False, options=options, return_result=True,
                              quiet=True)
    except FileNotFoundError as e:
        raise RuntimeUnavailable(f"singularity is not installed ({e}); spython needs the `singularity` binary") from e
    except SystemExit as e:  # spython calls sys.exit on some errors
        raise SandboxError(f"building {image} from {source} failed (spython exited with {e.code})") from None
    if isinstance(result, dict) and result.get("return_code", 0) != 0:
        raise SandboxError(f"building {image} from {source} failed: {' '.join(result.get('message') or [])[-2000:]}")
    if not os.path.exists(image):
        raise SandboxError(f"building {image} from {source} produced no image")
    return image


def inspect_image(image: str) -> dict:
    """The labels / runscript / definition of ``image`` as a dict (``singularity inspect --json``)."""
    client = _spython_client()
    try:
        out = client.inspect(image, quiet=True)
    except FileNotFoundError as e:
        raise RuntimeUnavailable(f"singularity is not installed ({e})") from e
    except SystemExit as e:
        raise SandboxError(f"inspecting {image} failed (spython exited with {e.code})") from None
    if isinstance(out, str):
        try:
            return json.loads(out)
        except ValueError:
            raise SandboxError(f"inspecting {image}: unexpected output {out[:500]!r}") from None
    return out if isinstance(out, dict) else {"result": out}
