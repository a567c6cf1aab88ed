"""#28 item 8: `envhub rollout ENV --harness NAME --out D` writes the run directory every other rollout writes
(run.json, trajectories.jsonl appended per finished episode), which `--resume` finishes, `envhub show` reads and an
existing run refuses without --resume/--overwrite; it used to be a `datasets` dump with none of that. The real Codex
CLI in bwrap, the golden played through it."""
from __future__ import annotations

import json

import pytest

from envhub.harness.presets import PRESETS
from helpers import run_cli


def lines(run) -> list[dict]:
    return [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]


@pytest.mark.timeout(600)
def test_harness_rollout_writes_a_run_directory_that_resumes(swe_gym, tmp_path):
    if not PRESETS["codex"].installed():
        pytest.fail("codex is not installed: the harness tier needs `make harness-tools` (make test runs it)")
    run = tmp_path / "run"
    args = ["rollout", "swe-gym", "--harness", "codex", "--model", "golden", "--out", str(run)]
    r = run_cli(*args, "-n", "1", timeout=300)
    assert r.returncode == 0 and "1/1 tasks solved" in r.stdout, r.stdout + r.stderr
    meta = json.loads((run / "run.json").read_text())
    assert meta["harness"] == "codex" and meta["env_id"] == "swe-gym" and meta["tokenizer"], meta
    assert meta["summary"] == {"tasks": 1, "solved": 1, "trajectories": 1} and meta["interrupted"] is False, meta
    (first,) = lines(run)
    assert first["reward"] == 1.0 and first["details"]["chain_role"] == "main" and any(first["response_mask"])

    r = run_cli("show", str(run))
    assert r.returncode == 0 and "1 trajectories" in r.stdout and "codex" not in r.stderr, r.stdout + r.stderr

    r = run_cli(*args, "-n", "1", timeout=120)
    assert r.returncode == 2 and "already holds a run" in r.stderr, r.stdout + r.stderr

    r = run_cli(*args, "-n", "2", "--resume", timeout=300)
    assert r.returncode == 0 and "(1 tasks already there)" in r.stdout and "1/1 tasks solved" in r.stdout, r.stdout
    got = lines(run)
    assert got[0] == first and len({d["task_id"] for d in got}) == 2 == len(got)  # appended, the done one skipped
    assert json.loads((run / "run.json").read_text())["summary"]["solved"] == 2
