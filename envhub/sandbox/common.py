"""Pieces every runtime shares: state directories, the action server's command line and config, readiness."""
from __future__ import annotations

import functools
import importlib.util
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from envhub.sandbox.base import SandboxError, SandboxSpec

AGENT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "agent")
READY_TIMEOUT_S = 30.0
SANDBOX_USER = ("agent", 1000, 1000)  # the non-root identity commands run as (inside a user namespace)
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def sandbox_root() -> str:
    """Where state directories live: ``$ENVHUB_SANDBOX_DIR``, else ``<tmp>/envhub-sandboxes``.

    Kept short on purpose: a Unix socket path must fit in 107 bytes.
    """
    root = os.environ.get("ENVHUB_SANDBOX_DIR") or os.path.join(tempfile.gettempdir(), "envhub-sandboxes")
    os.makedirs(root, exist_ok=True)
    return root


def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (with the pid, a process identity that survives pid reuse)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rindex(b")") + 2:].split()[19].decode()


_swept = False


def sweep_stale(max_age_s: float = 600.0) -> list[str]:
    """Remove state directories whose owner process is gone and which no process of theirs outlives (an owner
    killed by SIGKILL cannot clean up; ``--die-with-parent`` already took its processes). Runs once per
    interpreter, at the first sandbox start. A directory without an owner stamp goes only once ``max_age_s`` old."""
    root = sandbox_root()
    stale = []
    for name in os.listdir(root):
        d = os.path.join(root, name)
        if name.startswith(".") or not os.path.isdir(d):
            continue
        try:
            with open(os.path.join(d, "owner")) as f:
                pid, started = f.read().split()
            if _start_time(int(pid)) == started:
                continue
        except (OSError, ValueError):
            try:
                if time.time() - os.stat(d).st_mtime < max_age_s:
                    continue
            except OSError:
                continue
        stale.append(name)
    if stale:
        from envhub.sandbox import cgroups, lifecycle, quota

        tagged = lifecycle.sandbox_pids()
        for name in stale:
            if name in tagged:
                continue
            quota.unmount_under(os.path.join(root, name))  # a capped workspace its dead owner left mounted
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
            for parent, _ in cgroups.parents().values():
                try:
                    os.rmdir(os.path.join(parent, f"sb-{name}"))
                except OSError:
                    pass
    return stale


def new_state_dir() -> tuple[str, str]:
    """A fresh ``(sandbox_id, state_dir)`` with ``run/`` (socket, log, command file) and an owner stamp inside."""
    global _swept
    if not _swept:
        _swept = True
        try:
            sweep_stale()
        except OSError:
            pass
    sid = uuid.uuid4().hex[:12]
    state = os.path.join(sandbox_root(), sid)
    os.makedirs(os.path.join(state, "run"))
    with open(os.path.join(state, "owner"), "w") as f:
        f.write(f"{os.getpid()} {_start_time(os.getpid())}")
    sock = os.path.join(state, "run", "server.sock")
    if len(sock.encode()) > 107:
        shutil.rmtree(state, ignore_errors=True)
        raise SandboxError(f"socket path {sock!r} is too long for a Unix socket: set ENVHUB_SANDBOX_DIR to a short "
                           f"directory such as /tmp/envhub")
    return sid, state


def copy_workspace(src: str | None, dest: str) -> None:
    """Copy ``src`` (a host directory) into ``dest``; ``cp -a`` keeps modes, symlinks and timestamps (git needs it)."""
    os.makedirs(dest, exist_ok=True)
    if not src:
        return
    if not os.path.isdir(src):
        raise SandboxError(f"workspace_from={src!r} is not a directory")
    r = subprocess.run(["cp", "-a", "--reflink=auto", os.path.join(src, "."), dest], capture_output=True, text=True)
    if r.returncode != 0:
        raise SandboxError(f"copying workspace_from={src!r} failed: {r.stderr.strip()}")


def package_dir(name: str) -> str | None:
    """The site directory holding top-level package ``name`` on the host, or None if it is not installed."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.origin:
        return None
    return os.path.dirname(os.path.dirname(os.path.abspath(spec.origin)))


@functools.lru_cache(maxsize=1)
def plugin_package_dirs() -> tuple[str, ...]:
    """Directories of every installed envhub plugin package (located, not imported).

    A sandbox that binds the host's Python would otherwise expose them: a plugin installed normally (not editable)
    sits in ``site-packages`` with its data -- answers, hidden tests, golden patches -- where the agent could read it.
    """
    import importlib.metadata as md

    dirs: list[str] = []
    for ep in md.entry_points(group="envhub"):
        top = ep.value.split(":")[0].split(".")[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            continue
        for loc in (spec.submodule_search_locations or []) if spec else []:
            dirs.append(os.path.realpath(loc))
    return tuple(dict.fromkeys(dirs))


def command_env(spec: SandboxSpec, sandbox_id: str, home: str = "/tmp") -> dict[str, str]:
    """The environment commands in the sandbox get (the action server itself runs with a minimal one)."""
    path = BASE_PATH
    if spec.python_on_path and spec.image is None:  # an image has its own Python; ours is not mounted there
        path = os.path.join(sys.prefix, "bin") + ":" + path
    env = {"PATH": path, "HOME": home, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "USER": SANDBOX_USER[0],
           "TERM": "dumb", "PYTHONUNBUFFERED": "1", "ENVHUB_SANDBOX_ID": sandbox_id}
    env.update({str(k): str(v) for k, v in spec.env.items()})
    return env


def server_config(spec: SandboxSpec, sandbox_id: str, socket_path: str, rundir: str, workdir: str, *,
                  child_memory: bool, nproc_rlimit: bool, copy_from: str | None = None, home: str = "/tmp") -> dict:
    """The JSON config the action server receives (see ``agent/server.py``)."""
    child = {"max_file_mb": spec.max_file_mb}
    if child_memory:
        child["memory_mb"] = spec.memory_mb
    own = {"memory_mb": max(spec.memory_mb, 768) if spec.memory_mb else None,
           "max_procs": spec.max_procs if nproc_rlimit else None}
    return {"socket": socket_path, "rundir": rundir, "workdir": workdir, "env": command_env(spec, sandbox_id, home),
            "timeout_s": spec.timeout_s, "output_limit": spec.output_limit, "child_limits": child, "self_limits": own,
            "copy_from": copy_from}


_compiled = False


def ensure_bytecode() -> None:
    """Compile the action server's modules once per interpreter. The sandbox sees them read-only: a stale or missing
    ``.pyc`` would be recompiled at every sandbox start (tens of milliseconds) and never saved."""
    global _compiled
    if not _compiled:
        _compiled = True
        import py_compile

        # beside the sources (``__pycache__``), where the sandbox's ``python -I -S`` looks, whatever
        # ``sys.pycache_prefix`` this process has (a lazily compiled venv sets one: ``scripts/lazy-bytecode.sh``)
        for root, _dirs, files in os.walk(AGENT_DIR):
            for name in files:
                if name.endswith(".py"):
                    source = os.path.join(root, name)
                    pyc = os.path.join(root, "__pycache__", f"{name[:-3]}.{sys.implementation.cache_tag}.pyc")
                    if os.path.exists(pyc) and os.stat(pyc).st_mtime >= os.stat(source).st_mtime:
                        continue
                    try:
                        py_compile.compile(source, cfile=pyc, doraise=True)
                    except (OSError, py_compile.PyCompileError):  # a read-only install: its .pyc files came with it
                        pass


def server_argv(python: str, lib_dirs: list[str], cfg: dict) -> list[str]:
    """``python -I -S -c ...``: isolated mode keeps the workspace (cwd) and PYTHON* variables off ``sys.path`` (a
    ``socket.py`` in the repo must not shadow the stdlib); ``-S`` skips site processing (faster start)."""
    ensure_bytecode()
    boot = (f"import sys; sys.path[:0] = {lib_dirs!r}; from envhub_agent.server import main; "
            f"sys.exit(main(sys.argv))")
    return [python, "-I", "-S", "-c", boot, json.dumps(cfg)]


def wait_ready(proc: subprocess.Popen, log_path: str, what: str, timeout: float = READY_TIMEOUT_S) -> int:
    """Block until the server prints ``READY <pid>`` on stdout; returns that pid (as the server sees itself)."""
    deadline = time.monotonic() + timeout
    buf = b""
    fd = proc.stdout.fileno()
    waiter = select.poll()  # not select(): it cannot watch a descriptor numbered 1024 or above
    waiter.register(fd, select.POLLIN)
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SandboxError(f"{what}: the action server was not ready after {timeout:g} s; log:\n"
                               f"{read_log(log_path)}")
        if waiter.poll(left * 1000):
            chunk = os.read(fd, 256)
            if not chunk:
                proc.wait(timeout=5)
                raise SandboxError(f"{what} exited with code {proc.returncode} before its action server was "
                                   f"ready; log:\n{read_log(log_path)}")
            buf += chunk
    line = buf.split(b"\n", 1)[0].decode(errors="replace")
    if not line.startswith("READY "):
        raise SandboxError(f"{what}: unexpected first line from the action server: {line!r}")
    return int(line.split()[1])


def read_log(path: str, limit: int = 4000) -> str:
    """The tail of the action server's log, for an error message. Never through a symlink (see ``hostfs``)."""
    from envhub.sandbox.hostfs import read_tail

    data = read_tail(path, limit)
    if data is None:
        return "(no log)"
    return data.decode(errors="replace").strip() or "(empty log)"
