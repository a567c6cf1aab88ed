"""What a client is told when a job fails, and what the server's log keeps.

A job's error reaches whoever sent ``/process`` (a trainer, possibly a policy's own tooling) and is stored in the
trajectory. It carries the stage and the exception's message, never a traceback: tracebacks hold host paths, source
lines and the layout of the node. Host paths inside a message (a ``FileNotFoundError`` naming the venv, a sandbox
state directory) are replaced by ``<host>``. The full traceback goes to the ``envhub.service`` logger with the job
id, stage and env id, so an operator can find it.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

log = logging.getLogger("envhub.service")


@functools.lru_cache(maxsize=1)
def _host_roots() -> tuple[str, ...]:
    """Host directories whose paths must not reach a client, longest first (so a nested root wins)."""
    from envhub.sandbox.common import sandbox_root

    import envhub

    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.dirname(envhub.__file__)),
             os.path.expanduser("~"), os.getcwd(), sandbox_root()}
    return tuple(sorted((r.rstrip("/") for r in roots if r and r not in ("/", "")), key=len, reverse=True))


def scrub(text: str) -> str:
    """``text`` with every host path prefix replaced by ``<host>``."""
    for root in _host_roots():
        if root in text:
            text = text.replace(root + "/", "<host>/").replace(root, "<host>")
    return text


def job_failure(job: Any, stage: str, e: BaseException, what: str = "") -> str:
    """Log ``e`` in full for the operator; return the one-line text the client gets (``STAGE: [what: ]Type: msg``)."""
    env_id = getattr(getattr(job, "spec", None), "id", None)
    log.error("job %s (env %s) failed in %s: %s%s: %s", getattr(job, "id", "?"), env_id, stage.upper(), what,
              type(e).__name__, e, exc_info=(type(e), e, e.__traceback__))
    prefix = f"{what}: " if what else ""
    return f"{stage.upper()}: {prefix}{type(e).__name__}: {scrub(str(e))}"
