"""``envhub serve`` (prints where it listens; a token off loopback) and ``envhub status URL``."""
from __future__ import annotations

import re

import pytest

from svc_helpers import spawn_server
from helpers import run_cli


@pytest.mark.slow
def test_status_shows_stages_jobs_and_backends(serve):
    srv = serve(init_workers=3, run_workers=5, eval_workers=2)
    r = run_cli("status", srv.url, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "running" in out and "INIT" in out and "RUN" in out and "EVAL" in out and "golden" in out
    assert re.search(r"RUN\s*│\s*5", out), out
    raw = run_cli("status", srv.url, "--json", timeout=120)
    assert '"active_run": 0' in raw.stdout
    down = run_cli("status", "http://127.0.0.1:9", timeout=120)
    assert down.returncode != 0 and "cannot reach" in down.stderr


@pytest.mark.slow
def test_serve_prints_where_it_listens_and_requires_a_token_off_loopback():
    proc, url, lines = spawn_server("--host", "0.0.0.0", "--backend", "golden", "--run-workers", "3")
    try:
        text = "".join(lines)
        while "API schema" not in text:
            text += proc.stdout.readline()
        token = re.search(r"\(generated\): (\S+)", text)
        assert token, text
        refused = run_cli("status", url, timeout=120)
        assert refused.returncode != 0 and "401" in refused.stderr
        ok = run_cli("status", url, "--token", token.group(1), timeout=120)
        assert ok.returncode == 0 and "RUN" in ok.stdout, ok.stderr
    finally:
        proc.terminate()
        proc.wait(60)


def test_serve_rejects_bad_pool_sizes():
    r = run_cli("serve", "--run-workers", "0", "--tokenizer", "tiny", timeout=120)
    assert r.returncode == 2 and "--run-workers" in r.stderr and ">= 1" in r.stderr


@pytest.mark.slow
def test_serve_max_body_mb_is_the_flag_the_413_names():
    """The 413 reply tells the operator which flag raises the cap; that flag exists and sets it."""
    import urllib.error
    import urllib.request

    proc, url, _ = spawn_server("--backend", "golden", "--max-body-mb", "0.01")  # 10,485 bytes
    try:
        body = b'{"job_id": "' + b"x" * 20_000 + b'"}'
        request = urllib.request.Request(url + "/cancel", data=body, headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=60)
            raise AssertionError("a 20 KB body passed a 10 KB cap")
        except urllib.error.HTTPError as e:
            assert e.code == 413
            message = e.read().decode()
        assert "10485 bytes" in message and "envhub serve --max-body-mb" in message, message
        small = urllib.request.Request(url + "/cancel", data=b'{"job_id": "none"}',
                                       headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(small, timeout=60)
        except urllib.error.HTTPError as e:
            assert e.code != 413, "a small body is under the cap"
    finally:
        proc.terminate()
        proc.wait(60)
    r = run_cli("serve", "--max-body-mb", "0", "--tokenizer", "tiny", timeout=120)
    assert r.returncode == 2 and "--max-body-mb" in r.stderr
