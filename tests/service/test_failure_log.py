"""A failed job is logged once for the operator: job id, stage, env id, task id and the error, in the message and as
the record's fields (``envhub.failurelog``), with the traceback when an exception caused it."""
from __future__ import annotations

import pytest

from envhub.training.client import RolloutClient


@pytest.mark.parametrize("env_id,task_id,stage,error,traceback", [
    ("svc-raise-make", "rm-1", "init", "making the env failed: RuntimeError: plugin bug: the env cannot be constructed",
     True),
    ("svc-raise-init", "ri-1", "init", "RuntimeError: plugin bug in reset", True),
    ("svc-raise-run", "rr-1", "run", "RuntimeError: plugin bug in step", True),
    ("svc-raise-eval", "re-1", "eval", "verifier crashed: RuntimeError: plugin bug in the verifier", False),
    ("svc-slow", "slow-1", "init", "the job's timeout of 0.3s (time inside stages) ran out during INIT", False),
])
async def test_a_failed_job_is_logged_once_with_its_ids(serve, caplog, env_id, task_id, stage, error, traceback):
    srv = serve()
    job_id = f"log-{env_id}"
    instance = {"env_id": env_id, "task_id": task_id}
    if env_id == "svc-slow":
        instance = {"env_id": env_id, "task": {"task_id": task_id, "n": 1, "init_s": 3}}
    with caplog.at_level("WARNING", logger="envhub"):
        async with RolloutClient(srv.url) as c:
            d = await c.process(instance, job_id=job_id, timeout=0.3 if env_id == "svc-slow" else None, raw=True)
    assert d["finish_reason"] in ("error", "timeout") and d["error"].endswith(error), d["error"]
    records = [r for r in caplog.records if getattr(r, "job_id", None) == job_id]
    assert len(records) == 1, [r.getMessage() for r in caplog.records]
    r = records[0]
    assert (r.stage, r.env_id, r.task_id) == (stage, env_id, task_id) and r.error.endswith(error)
    assert r.getMessage().startswith(f"job {job_id} stage={stage} env={env_id} task={task_id}: ")
    assert r.levelname == ("WARNING" if env_id == "svc-slow" else "ERROR")
    assert bool(r.exc_info) is traceback
    # the executor, which logs on its own outside the service, left this job's failure to the pipeline
    assert not [x for x in caplog.records if x is not r and job_id in x.getMessage()]


async def test_a_job_that_succeeds_logs_no_failure(serve, caplog):
    srv = serve()
    with caplog.at_level("WARNING", logger="envhub"):
        async with RolloutClient(srv.url) as c:
            d = await c.process({"env_id": "svc-crash-text", "task_id": "ct-2"}, job_id="fine", raw=True)
    assert d["finish_reason"] == "done"
    assert not [r for r in caplog.records if getattr(r, "job_id", None) == "fine"]
