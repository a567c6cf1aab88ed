"""One log record per failed rollout, the same shape wherever it is written (the executor, the rollout service).

The message reads ``job <id> stage=<stage> env=<env id> task=<task id>: <error>`` and the record carries the same
values as fields (``record.job_id``, ``stage``, ``env_id``, ``task_id``, ``error``), so an operator can grep the
text or filter a structured log handler on the fields. ``job_id`` is the rollout's session id: the job id in the
rollout service, a fresh id for an in-process rollout.
"""
from __future__ import annotations

import logging
from typing import Any

FIELDS = ("job_id", "stage", "env_id", "task_id", "error")


def log_failure(logger: logging.Logger, job_id: str, stage: str, env_id: str, task_id: str, error: str, *,
                level: int = logging.ERROR, exc_info: Any = None) -> None:
    """Write the one record of a failed rollout (``exc_info``: the exception, when there is one)."""
    logger.log(level, "job %s stage=%s env=%s task=%s: %s", job_id, stage, env_id, task_id, error,
               extra={"job_id": job_id, "stage": stage, "env_id": env_id, "task_id": task_id, "error": error},
               exc_info=exc_info)
