"""``SandboxSpec``: what sandbox to start (a plain dataclass; runtimes read it, env authors build it)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field


@dataclass
class SandboxSpec:
    """What sandbox to start. A plain dataclass: env authors build one per task (``ToolEnv.sandbox_spec_for``).

    Attributes:
        image: the root filesystem. ``None``: the host's system directories (``/usr``, selected ``/etc`` files...),
            bound read-only; never all of ``/``. A directory: a rootfs tree (e.g. an unpacked OCI image), bound
            read-only. A ``.sif`` path: a Singularity/Apptainer image (``runtime="singularity"``).
        workdir: where the workspace appears inside the sandbox; the shell, exec and IPython start there.
        workspace_from: a host directory copied into the workspace at start (e.g. a git checkout for /testbed). The
            copy is private: the sandbox never writes to the source.
        workspace_size_mb: ``None``: the workspace is a host directory (removed by ``stop()``). A number: the
            workspace is a tmpfs of that size inside the sandbox (a flood of files hits ENOSPC, not the host disk).
        disk_mb: a host-directory workspace (``workspace_size_mb=None``) is a tmpfs capped at this size where the
            host lets us mount one (see ``capabilities()["limits"]["workspace"]``); ``None``: no cap.
        disk_inodes: the most files and directories that workspace may hold (same mechanism); ``None``: no cap.
        binds: extra mounts, each ``"host_path"`` or ``"host_path:sandbox_path[:ro|rw]"`` or a
            ``(host, sandbox, "ro"|"rw")`` tuple. Read-only unless ``rw`` is given.
        network: ``False`` (default): a private network namespace with only loopback. ``True``: the host network.
        memory_mb: memory cap for the whole sandbox (a memory cgroup when available) and the address-space cap
            (``RLIMIT_AS``) of the action server; ``None``: no cap.
        tmp_size_mb: size of the private ``/tmp`` (a tmpfs; its pages count towards ``memory_mb``).
        max_procs: process cap (a pids cgroup when available, else ``RLIMIT_NPROC`` for a non-root host uid; see
            ``capabilities()["limits"]["processes"]`` for which one holds).
        max_file_mb: the largest file a command may write (``RLIMIT_FSIZE``: larger writes fail with EFBIG).
        cpu_s: default CPU-time cap per command (``RLIMIT_CPU``), ``None``: none (``timeout_s`` still applies).
        cpu_quota: how many CPUs' worth of time the whole sandbox may use (a cpu cgroup's CFS quota, where this host
            allows one; background processes left running between tool calls count too). ``None``: no quota.
        timeout_s: default wall-clock timeout per command (shell, exec, python).
        output_limit: bytes of output kept per command and stream (head and tail; what was cut is counted).
        env: extra environment variables for commands in the sandbox (on top of PATH, HOME=/tmp, LANG...).
        python_on_path: put the host interpreter's environment (``sys.prefix/bin``) first on ``PATH`` inside the
            sandbox (read-only), so ``python``/``pytest`` of this venv are available to commands.
        stdlib_only: no third-party Python package is visible inside: every ``site-packages`` / ``dist-packages``
            directory of the bound interpreters is covered by an empty read-only directory (a program that adds them
            to ``sys.path`` still finds nothing). The action server keeps what it needs (bound separately); the
            python tool (IPython) is then unavailable. For graders whose rule is "standard library only".
        runtime: ``"auto"`` (bwrap when installed), ``"bwrap"``, ``"singularity"`` or ``"apptainer"``, ``"local"``
            (no isolation: only when asked by name), or a runtime a plugin registered.
        python: the interpreter that runs the action server inside the sandbox (default: this host interpreter,
            bound read-only; for an image, ``/usr/bin/python3`` of the image).
        hostname: the sandbox's hostname (its own UTS namespace).
        stop_grace_s: how long ``stop()`` waits after asking nicely (and after SIGTERM) before SIGKILL.
        fakeroot: Singularity only: ``--fakeroot`` (uid 0 inside through a user namespace).
        overlay: Singularity only: a writable overlay directory or image (``--overlay``).
    """

    image: str | None = None
    workdir: str = "/testbed"
    workspace_from: str | None = None
    workspace_size_mb: int | None = None
    disk_mb: int | None = 4096
    disk_inodes: int | None = 262144
    binds: list = field(default_factory=list)
    network: bool = False
    memory_mb: int | None = 2048
    tmp_size_mb: int = 256
    max_procs: int | None = 256
    max_file_mb: int | None = 1024
    cpu_s: float | None = None
    cpu_quota: float | None = 1.0
    timeout_s: float = 60.0
    output_limit: int = 65536
    env: dict = field(default_factory=dict)
    python_on_path: bool = True
    stdlib_only: bool = False
    runtime: str = "auto"
    python: str | None = None
    hostname: str = "sandbox"
    stop_grace_s: float = 0.5
    fakeroot: bool = False
    overlay: str | None = None

    def key(self) -> str:
        """A stable string identifying this spec (pools keep one queue per key)."""
        return json.dumps(asdict(self), sort_keys=True, default=str)

    def parsed_binds(self) -> list[tuple[str, str, str]]:
        """``binds`` normalized to ``(host, sandbox, "ro"|"rw")``; raises ``ValueError`` naming a bad entry."""
        out = []
        for b in self.binds:
            if isinstance(b, str):
                parts = b.split(":")
                host, dest, mode = parts[0], parts[1] if len(parts) > 1 and parts[1] else parts[0], \
                    parts[2] if len(parts) > 2 else "ro"
            elif isinstance(b, (tuple, list)) and 1 <= len(b) <= 3:
                host, dest, mode = b[0], b[1] if len(b) > 1 else b[0], b[2] if len(b) > 2 else "ro"
            else:
                raise ValueError(f"bad bind {b!r}: use 'host[:sandbox[:ro|rw]]' or a (host, sandbox, mode) tuple")
            if mode not in ("ro", "rw") or not os.path.isabs(str(host)) or not os.path.isabs(str(dest)):
                raise ValueError(f"bad bind {b!r}: paths must be absolute and the mode 'ro' or 'rw'")
            out.append((os.path.abspath(str(host)), os.path.normpath(str(dest)), mode))
        return out
