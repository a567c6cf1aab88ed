"""The default runtime: bubblewrap (``bwrap``), rootless, no daemon (``benchmarks/sandbox_start.py`` times a start).

What a sandbox gets (see :func:`bwrap_argv`):

* its own user (uid 1000 "agent"), PID, IPC, UTS, cgroup and network namespaces (``--unshare-all --unshare-user``;
  ``--share-net`` only when ``spec.network``); ``--die-with-parent`` and ``--new-session`` (no TIOCSTI escape);
* a root made of read-only binds: the host's ``/usr`` (plus the merged-usr symlinks), a short list of ``/etc``
  files (never ``/etc/shadow``), this interpreter's prefix and venv; or a rootfs directory (``spec.image``);
* private ``/proc``, ``/dev``, a size-capped tmpfs ``/tmp``, the workspace (a host directory bound read-write, or a
  size-capped tmpfs), and ``/run/envhub`` (the socket);
* a pids cgroup and a memory cgroup when this host lets us create them. They are joined before the sandbox runs
  anything: bwrap waits on ``--block-fd`` while we move its two processes in, learned from ``--info-fd``.

Its action server is the sandbox's main process: when it exits, bwrap's PID-1 exits and the kernel kills every
process left in the PID namespace (orphaned background jobs included).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

from envhub.sandbox import cgroups, hostfs, lifecycle, quota
from envhub.sandbox.base import Runtime, Sandbox, SandboxError, SandboxSpec
from envhub.sandbox.common import (AGENT_DIR, SANDBOX_USER, copy_workspace, new_state_dir, package_dir,
                                   plugin_package_dirs, read_log, sandbox_root, server_argv, server_config, wait_ready)

RUN_DIR = "/run/envhub"            # the socket (read-write bind of <state>/run; the log stays outside)
LIB_DIR = "/run/envhub-agent"      # the action server's code and ptyprocess (read-only binds)
CMD_DIR = "/run/envhub-cmd"        # an 8 MB tmpfs for the shell's command file
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "timezone", "nsswitch.conf",
             "hosts", "host.conf", "gai.conf", "ssl", "ca-certificates", "ca-certificates.conf", "mime.types",
             "protocols", "services", "os-release", "debian_version", "lsb-release", "gitconfig", "inputrc",
             "magic", "bash.bashrc", "python3", "python3.11", "fonts", "resolv.conf", "environment", "login.defs")
HOST_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")


def _shared_etc() -> str:
    """A host directory that becomes the sandbox's read-only /etc: copies of the ``ETC_FILES`` that exist here plus a
    generated passwd/group (uid 1000 must have a name: git, pip and ``getpass`` ask for it).

    One bind instead of ~25 (each mount costs bwrap time at every start). Built once per interpreter into a
    directory named after the sources' sizes and mtimes, so a changed host /etc gets a fresh copy and concurrent
    interpreters share an identical one (built in a temporary directory, then renamed into place).
    """
    global _etc_dir
    if _etc_dir and os.path.isdir(_etc_dir):
        return _etc_dir
    names = [n for n in ETC_FILES if os.path.lexists(os.path.join("/etc", n))]
    stamp = hashlib.sha256()
    for n in names:
        st = os.lstat(os.path.join("/etc", n))
        stamp.update(f"{n}:{st.st_size}:{st.st_mtime_ns};".encode())
    stamp.update(repr(SANDBOX_USER).encode())
    d = os.path.join(sandbox_root(), f".etc-{stamp.hexdigest()[:12]}")
    if not os.path.isdir(d):
        tmp = tempfile.mkdtemp(prefix=".etc-tmp-", dir=sandbox_root())
        if names:
            subprocess.run(["cp", "-a"] + [os.path.join("/etc", n) for n in names] + [tmp], capture_output=True)
        _drop_private(tmp)
        name, uid, gid = SANDBOX_USER
        with open(os.path.join(tmp, "passwd"), "w") as f:
            f.write(f"root:x:0:0:root:/root:/bin/bash\n{name}:x:{uid}:{gid}:{name}:/tmp:/bin/bash\n"
                    f"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n")
        with open(os.path.join(tmp, "group"), "w") as f:
            f.write(f"root:x:0:\n{name}:x:{gid}:\nnogroup:x:65534:\n")
        os.chmod(tmp, 0o755)
        try:
            os.rename(tmp, d)
        except OSError:  # another interpreter won the race: theirs is identical
            shutil.rmtree(tmp, ignore_errors=True)
    _etc_dir = d
    return d


_etc_dir: str | None = None


def _drop_private(root: str) -> None:
    """Delete what is not world-readable (``/etc/ssl/private``...): the sandbox's uid maps to the host uid that owns
    these copies, so owner-only permissions would not keep the agent out."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=True):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            st = os.lstat(path)
            if not (st.st_mode & 0o004) and not os.path.islink(path):
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                    dirnames.remove(name)
                else:
                    os.remove(path)


def _root_binds(image: str | None) -> list[str]:
    """Arguments that build the read-only root: host system dirs, or a rootfs directory's top-level entries."""
    args: list[str] = []
    base = image or "/"
    names = HOST_DIRS if image is None else sorted(os.listdir(image))
    for name in names:
        if name in ("proc", "dev", "sys", "tmp", "run"):  # made fresh for the sandbox below
            continue
        src = os.path.join(base, name)
        if os.path.islink(src):
            args += ["--symlink", os.readlink(src), "/" + name]
        elif os.path.isdir(src):
            args += ["--ro-bind", src, "/" + name]
    if image is None:
        args += ["--ro-bind", _shared_etc(), "/etc"]
    else:  # the image's own /etc, with our passwd/group over it
        etc = _shared_etc()
        args += ["--ro-bind", os.path.join(etc, "passwd"), "/etc/passwd", "--ro-bind", os.path.join(etc, "group"),
                 "/etc/group"]
    return args


def third_party_dirs(prefixes: list[str]) -> list[str]:
    """Every existing ``site-packages`` / ``dist-packages`` directory of these interpreter prefixes and the system
    Python (what ``SandboxSpec.stdlib_only`` covers up)."""
    import glob

    found = []
    for root in [*prefixes, "/usr", "/usr/local"]:
        for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages", "lib/python3/dist-packages",
                        "lib64/python3*/site-packages"):
            found += [os.path.realpath(d) for d in glob.glob(os.path.join(root, pattern)) if os.path.isdir(d)]
    return sorted(set(found))


def _python_binds(spec: SandboxSpec) -> tuple[str, list[str], list[str]]:
    """``(python, bind args, sys.path entries)`` for running the action server inside the sandbox."""
    binds: list[str] = ["--ro-bind", AGENT_DIR, f"{LIB_DIR}/envhub_agent"]
    pty_dir = package_dir("ptyprocess")
    if pty_dir is None:
        raise SandboxError("ptyprocess is not installed: pip install ptyprocess")
    binds += ["--ro-bind", os.path.join(pty_dir, "ptyprocess"), f"{LIB_DIR}/ptyprocess"]
    path = [LIB_DIR]
    if spec.image is not None:  # a foreign rootfs brings its own python3 (IPython must be installed there)
        return spec.python or "/usr/bin/python3", binds, path
    prefixes = [p for p in dict.fromkeys([os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)])
                if not p.startswith("/usr/")]
    for prefix in prefixes:
        binds += ["--ro-bind", prefix, prefix]
    hide = list(plugin_package_dirs())  # an empty, read-only dir over every plugin's code and data
    if spec.stdlib_only:
        hide += third_party_dirs(prefixes)
    for hidden in dict.fromkeys(hide):
        if any(hidden.startswith(p + os.sep) for p in prefixes + ["/usr"]):
            binds += ["--perms", "0555", "--size", "4096", "--tmpfs", hidden]
    ipy_dir = None if spec.stdlib_only else package_dir("IPython")
    if ipy_dir:
        path.append(ipy_dir)
    return spec.python or os.path.realpath(sys.executable), binds, path


def bwrap_argv(spec: SandboxSpec, state_dir: str, cfg: dict, python: str, lib_path: list[str], py_binds: list[str],
               info_fd: int | None = None, block_fd: int | None = None) -> list[str]:
    """The full bwrap command line for ``spec`` (pure: no side effects, so tests can read it)."""
    uid, gid = SANDBOX_USER[1], SANDBOX_USER[2]
    argv = ["bwrap", "--unshare-all", "--unshare-user", "--uid", str(uid), "--gid", str(gid),
            "--hostname", spec.hostname, "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "ENVHUB_SANDBOX_ID", cfg["env"]["ENVHUB_SANDBOX_ID"]]
    if spec.network:
        argv.append("--share-net")
    argv += _root_binds(spec.image)
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", str(int(spec.tmp_size_mb) << 20), "--tmpfs", "/tmp",
             "--bind", os.path.join(state_dir, "run"), RUN_DIR,
             # the shell's command file lives on a small tmpfs of its own: no disk I/O per command, and a full /tmp
             # cannot stop the shell from taking commands
             "--size", str(8 << 20), "--tmpfs", CMD_DIR]
    argv += py_binds
    if spec.workspace_size_mb:
        argv += ["--size", str(int(spec.workspace_size_mb) << 20), "--perms", "0755", "--tmpfs", spec.workdir]
        if spec.workspace_from:
            argv += ["--ro-bind", os.path.abspath(spec.workspace_from), "/run/envhub-src"]
    else:
        argv += ["--bind", os.path.join(state_dir, "workspace"), spec.workdir]
    for host, dest, mode in spec.parsed_binds():
        if not os.path.exists(host):
            raise SandboxError(f"bind source {host!r} does not exist")
        argv += ["--bind" if mode == "rw" else "--ro-bind", host, dest]
    # the root itself (a tmpfs holding the mount points) becomes read-only: writes land only in the workspace,
    # /tmp and /run/envhub, which are mounts of their own
    argv += ["--remount-ro", "/", "--chdir", spec.workdir]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    if block_fd is not None:
        argv += ["--block-fd", str(block_fd)]
    return argv + server_argv(python, lib_path, cfg)


class BwrapRuntime(Runtime):
    """Rootless sandboxes with bubblewrap. The default wherever ``bwrap`` is installed."""

    name = "bwrap"

    @classmethod
    def available(cls) -> bool:
        return shutil.which("bwrap") is not None

    def start(self, spec: SandboxSpec) -> BwrapSandbox:
        if not self.available():
            raise SandboxError("bwrap is not installed: apt-get install bubblewrap (or choose runtime='local')")
        if spec.image and (spec.image.endswith(".sif") or not os.path.isdir(spec.image)):
            raise SandboxError(f"bwrap needs image=None or a rootfs directory, got {spec.image!r}; "
                               f"use runtime='singularity' for .sif images")
        sid, state = new_state_dir()
        sb = BwrapSandbox(spec, sid, state)
        workspace = None if spec.workspace_size_mb else os.path.join(state, "workspace")

        def prepare() -> None:
            if workspace is None:
                return
            os.makedirs(workspace)
            if spec.disk_mb and quota.available():  # capped before anything is copied in
                sb.disk_capped = quota.mount_tmpfs(workspace, spec.disk_mb, spec.disk_inodes)
            copy_workspace(spec.workspace_from, workspace)

        sb.boot(prepare)
        return sb

    def capabilities(self, spec: SandboxSpec | None = None) -> dict[str, Any]:
        spec = spec or SandboxSpec()
        have = cgroups.available()
        if "pids" in have:
            procs = f"pids cgroup (pids.max={spec.max_procs})"
        elif os.geteuid() != 0:
            procs = f"RLIMIT_NPROC={spec.max_procs} in the sandbox's user namespace (host uid {os.geteuid()})"
        else:
            procs = "none: no pids cgroup here and RLIMIT_NPROC does not bind host uid 0"
        memory = (f"memory cgroup ({spec.memory_mb} MB for the sandbox)" if "memory" in have
                  else f"RLIMIT_AS={spec.memory_mb} MB per process") if spec.memory_mb else "none"
        return {
            "runtime": self.name, "isolated": True,
            "isolation": ["mount", "user", "pid", "ipc", "uts", "cgroup"] + ([] if spec.network else ["net"]),
            "network": bool(spec.network),
            "limits": {"timeout": f"{spec.timeout_s:g} s per command (wall clock)",
                       "output": f"{spec.output_limit} bytes per stream (head + tail)",
                       "memory": memory, "processes": procs,
                       "file_size": f"RLIMIT_FSIZE={spec.max_file_mb} MB" if spec.max_file_mb else "none",
                       "tmp": f"tmpfs {spec.tmp_size_mb} MB",
                       "workspace": f"tmpfs {spec.workspace_size_mb} MB" if spec.workspace_size_mb
                       else (f"host directory on a tmpfs of {spec.disk_mb} MB"
                             + (f", {spec.disk_inodes} inodes" if spec.disk_inodes else ""))
                       if spec.disk_mb and quota.available() else "host directory (no size cap)",
                       "cpu": f"RLIMIT_CPU={spec.cpu_s:g} s per command" if spec.cpu_s else "per-command cpu_s",
                       "cpu_quota": (f"cpu cgroup ({spec.cpu_quota:g} CPUs for the whole sandbox)"
                                     if spec.cpu_quota and "cpu" in have else "none"
                                     + (": no cpu cgroup can be made here" if spec.cpu_quota else ""))},
            "notes": [f"commands run as uid {SANDBOX_USER[1]} in a user namespace"],
        }


class BwrapSandbox(Sandbox):
    runtime = "bwrap"

    def __init__(self, spec: SandboxSpec, sandbox_id: str, state_dir: str):
        super().__init__(spec, sandbox_id, state_dir, os.path.join(state_dir, "run", "server.sock"), spec.workdir)
        self.proc: subprocess.Popen | None = None
        self.pidns: int | None = None
        self.init_pid: int | None = None  # host pid of bwrap's PID 1 in the sandbox
        self.cg: cgroups.SandboxCgroups | None = None
        # the log is the host's: in the state dir, which no sandbox sees (run/ is bound read-write inside)
        self.log_path = os.path.join(state_dir, "server.log")
        self.disk_capped = False  # the host-directory workspace is a capped tmpfs (see quota.py)

    def capabilities(self) -> dict[str, Any]:
        caps = BwrapRuntime().capabilities(self.spec)
        if self.cg is not None and "pids" not in self.cg.controllers and "pids cgroup" in caps["limits"]["processes"]:
            caps["limits"]["processes"] = "none: the pids cgroup could not be created for this sandbox"
        if not self.spec.workspace_size_mb and self.spec.disk_mb and not self.disk_capped:
            caps["limits"]["workspace"] = "host directory (no size cap): the capped tmpfs could not be mounted"
        if self.cg is not None and "cpu" not in self.cg.controllers and "cpu cgroup" in caps["limits"]["cpu_quota"]:
            caps["limits"]["cpu_quota"] = "none: the cpu cgroup could not be created for this sandbox"
        return caps

    def _launch(self) -> None:
        spec = self.spec
        have = cgroups.available()
        python, py_binds, lib_path = _python_binds(spec)
        copy_from = "/run/envhub-src" if spec.workspace_size_mb and spec.workspace_from else None
        cfg = server_config(spec, self.id, f"{RUN_DIR}/server.sock", RUN_DIR, spec.workdir,
                            child_memory="memory" not in have, nproc_rlimit="pids" not in have, copy_from=copy_from)
        cfg["cmd_file"] = f"{CMD_DIR}/cmd"
        use_cg = bool(have) and bool(spec.max_procs or spec.memory_mb or spec.cpu_quota)
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe() if use_cg else (None, None)
        argv = bwrap_argv(spec, self.state_dir, cfg, python, lib_path, py_binds, info_w, block_r)
        log = hostfs.open_log(self.log_path)
        try:
            # the marker in the environment tags bwrap's own two processes too (see lifecycle.sandbox_pids)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "ENVHUB_SANDBOX_ID": self.id}
            self.proc = lifecycle.spawn(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log,
                                        pass_fds=[fd for fd in (info_w, block_r) if fd is not None],
                                        close_fds=True)
        finally:
            os.close(log)
            os.close(info_w)
            if block_r is not None:
                os.close(block_r)
        try:
            info = _read_all(info_r)
        finally:
            os.close(info_r)
        try:
            if info:
                meta = json.loads(info)
                self.pidns = meta.get("pid-namespace")
                child = self.init_pid = meta.get("child-pid")
                if use_cg:
                    # +3: bwrap's monitor, its PID 1, the action server itself
                    self.cg = cgroups.SandboxCgroups(f"sb-{self.id}", (spec.max_procs or 0) + 3 or None,
                                                     spec.memory_mb, spec.cpu_quota)
                    for pid in (self.proc.pid, child):
                        self.cg.add(pid)
        finally:
            if block_w is not None:
                os.write(block_w, b"1")
                os.close(block_w)
        if not info:
            self.proc.wait(timeout=5)
            raise SandboxError(f"bwrap failed to start (exit {self.proc.returncode}): {read_log(self.log_path)}")
        wait_ready(self.proc, self.log_path, "bwrap sandbox")

    def _ns_alive(self) -> bool:
        """Whether our PID namespace still exists: its PID 1 is alive (not a zombie) and still in it. The kernel
        empties a PID namespace before its PID 1 can die, and reuses a namespace's inode number only after."""
        return (self.init_pid is not None and self.pidns is not None
                and lifecycle.pid_ns(self.init_pid) == self.pidns and not lifecycle._is_zombie(self.init_pid))

    def _members(self) -> set[int]:
        """Host pids of every process of this sandbox still alive (exact: never a pid of another sandbox)."""
        pids: set[int] = set(self.cg.pids()) if self.cg else set()
        if self._ns_alive():
            found = lifecycle.pids_in_pidns(self.pidns)
            if self._ns_alive():  # alive before and after the scan: the inode was ours throughout
                pids.update(found)
        if self.proc is not None and self.proc.poll() is None:
            pids.add(self.proc.pid)
        return pids

    def _terminate(self, grace_s: float) -> list[int]:
        proc = self.proc
        if proc is None:
            return []
        if grace_s > 0 and _wait(proc, grace_s) is None:  # the server was asked to exit: give it the grace period
            lifecycle.kill_all(self._members(), signal.SIGTERM)
            _wait(proc, grace_s)
        # SIGKILL bwrap: its PID 1 dies with it (PDEATHSIG), and with PID 1 the whole PID namespace
        lifecycle.kill_all(self._members(), signal.SIGKILL)
        _wait(proc, 5.0)
        deadline = time.monotonic() + KILL_SETTLE_S
        while (left := self._members()) and time.monotonic() < deadline:
            lifecycle.kill_all(left, signal.SIGKILL)
            time.sleep(0.005)
        if proc.stdout is not None:
            proc.stdout.close()
        self.proc = None
        if self.cg is not None and not left:
            for _ in range(400):  # a cgroup empties a moment after its last process is reaped
                if self.cg.remove():
                    break
                time.sleep(0.005)
            self.cg = None
        return sorted(left)

    def _cleanup(self) -> None:
        if self.disk_capped:
            quota.unmount(os.path.join(self.state_dir, "workspace"))
        shutil.rmtree(self.state_dir, ignore_errors=True)


# How long a SIGKILLed sandbox may take to be gone (its processes reaped, its cgroup empty) before a survivor is
# reported. Only the failure path waits it out. 5 s was too short on a loaded node: with a thousand sandboxes
# stopping on 2 cores, one process still counted after 5 s once in a CI run and failed a rollout that was fine.
KILL_SETTLE_S = 30.0


def _read_all(fd: int) -> bytes:
    out = b""
    while chunk := os.read(fd, 4096):
        out += chunk
    return out


def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
