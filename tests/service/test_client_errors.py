"""What a client sees of a failed job: the stage and the message, never a host traceback or a host path. The full
traceback goes to the server's log (``envhub.service`` / ``envhub.rollout.executor`` loggers) for the operator."""
from __future__ import annotations

import logging
from pathlib import Path

import pytest

from envhub.training.client import RolloutClient
from envhub.service.errors import scrub

HERE = Path(__file__).parent


@pytest.mark.parametrize("env_id,task_id,stage", [("svc-raise-path", "rp-0", "init"),
                                                  ("svc-raise-make", "rm-0", "init"),
                                                  ("svc-raise-run", "rr-0", "run")])
async def test_a_failed_job_tells_the_client_no_traceback_and_no_host_path(serve, caplog, env_id, task_id, stage):
    caplog.set_level(logging.ERROR)
    srv = serve()
    async with RolloutClient(srv.url) as c:
        d = await c.process({"env_id": env_id, "task_id": task_id}, raw=True)
        ok = await c.process({"env_id": "countdown", "task_id": "countdown-2-0001"}, raw=True)
    assert d["finish_reason"] == "error" and d["critical_error"] == stage
    err = d["error"]
    assert "Traceback" not in err and 'File "' not in err and "\n" not in err, err
    assert str(HERE) not in err and str(HERE.parents[1]) not in err, err
    assert err.startswith(stage.upper()), err
    if env_id == "svc-raise-path":
        assert "FileNotFoundError" in err and "<host>/" in err and "no-such-file.json" in err, err
    # the operator still gets everything: the traceback is in the log
    logged = [r for r in caplog.records if r.exc_info]
    assert logged, "the failure was not logged with its traceback"
    assert any(task_id in r.getMessage() or env_id in r.getMessage() for r in logged)
    assert ok["finish_reason"] == "done"  # the server goes on serving


def test_scrub_replaces_host_roots_but_not_sandbox_paths():
    import sys

    text = f"cannot open {sys.prefix}/lib/x.py and {HERE}/a.json; in the sandbox: /testbed/src/app.py"
    out = scrub(text)
    assert sys.prefix not in out and str(HERE) not in out
    assert "<host>/lib/x.py" in out and "/testbed/src/app.py" in out
