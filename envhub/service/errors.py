"""What a client is told when a job fails, and what the server's log keeps.

A job's error reaches whoever sent ``/process`` (a trainer, possibly a policy's own tooling) and is stored in the
trajectory. It carries the stage and the exception's message, never a traceback: tracebacks hold host paths, source
lines and the layout of the node. Host paths inside a message (a ``FileNotFoundError`` naming the venv, a sandbox
state directory) are replaced by ``<host>``. The full text and traceback go to the ``envhub.service`` logger, one
record per failed job with its job id, stage, env id and task id (:func:`log_job_failure`), so an operator can
find it.
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
    """The one-line text the client gets for ``e`` (``STAGE: [what: ]Type: msg``, host paths scrubbed). ``e`` is
    kept on the job, so the one log record of the job's failure (:func:`log_job_failure`) has its traceback."""
    if getattr(job, "exception", None) is None:
        job.exception = e
    prefix = f"{what}: " if what else ""
    return f"{stage.upper()}: {prefix}{type(e).__name__}: {scrub(str(e))}"


def log_job_failure(job: Any, stage: str, *, level: int = logging.ERROR) -> None:
    """Log the failure of ``job`` once, for the operator: job id, stage, env id, task id and the error in the message
    and as the record's fields (:mod:`envhub.failurelog`), with the traceback when an exception caused it."""
    from envhub.failurelog import log_failure

    ep = job.episode
    exc = getattr(job, "exception", None) or getattr(ep, "exception", None)
    task_id = str((getattr(job, "task", None) or {}).get("task_id", "") or ep.traj.task_id)
    log_failure(log, job.id, stage, job.spec.id, task_id, str(ep.traj.error), level=level,
                exc_info=(type(exc), exc, exc.__traceback__) if exc is not None else None)
