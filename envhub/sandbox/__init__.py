"""Sandboxes for agent tools: rootless runtimes, an in-sandbox action server over a Unix socket, a prewarmed pool.

    from envhub.sandbox import SandboxSpec, start
    sb = start(SandboxSpec(workspace_from="/path/to/repo"))     # bwrap where installed
    sb.shell("cd /testbed && git status")                       # persistent pty bash
    sb.exec(["python3", "sol.py"], input="1 2\\n", timeout=2, memory_mb=256)
    sb.stop()                                                   # TERM, grace, KILL, confirm, remove workspace

Runtimes: ``bwrap`` (default where available), ``singularity`` / ``apptainer``, ``local`` (no isolation; only when
asked by name), plus any a plugin returns from the ``envhub_sandbox_runtimes`` hook. See ``base.py`` for the spec's
fields and ``docs/sandbox.md`` for the design.
"""
from __future__ import annotations

from envhub.sandbox.base import (ExecResult, Runtime, RuntimeUnavailable, Sandbox, SandboxError, SandboxSpec,
                                 ServerError, ServerHung, ServerRestarted)
from envhub.sandbox.pool import SandboxPool
from envhub.sandbox.runtimes import available_runtimes, get_runtime, live_sandboxes, start

__all__ = ["ExecResult", "Runtime", "RuntimeUnavailable", "Sandbox", "SandboxError", "SandboxPool",
           "SandboxSpec", "ServerError", "ServerHung", "ServerRestarted", "available_runtimes", "get_runtime",
           "live_sandboxes", "start"]
