"""The preflight (issue #26 point 4): each refusal reason triggered for real -- a lowered descriptor or process
limit in a subprocess, a runtime that does not exist, an unreachable backend, a backend whose context is too short,
more memory or disk than the node has -- refuses with one line naming it, through ``envhub serve --preflight`` and
at server start; the same node with a request it can hold passes."""
from __future__ import annotations

import http.server
import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from envhub.service import preflight as pf

pytestmark = pytest.mark.timeout(120)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def envhub(*args: str, limits: str = "", patch: str = "") -> subprocess.CompletedProcess:
    """``envhub ARGS`` in a subprocess that first applies ``limits`` (Python run before the CLI) and ``patch``."""
    code = f"import resource, sys\n{limits}\n{patch}\nfrom envhub.cli import main\nsys.argv[0] = 'envhub'\nmain()"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=90, env=env,
                          cwd=ROOT)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the with block ends: nothing listens there


NOFILE_300 = "resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))"


def descriptor_refusal(patch: str = "") -> None:
    r = envhub("serve", "--preflight", "--concurrency", "64", limits=NOFILE_300, patch=patch)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "descriptors: REFUSED: RLIMIT_NOFILE is 300 (hard 300)" in r.stdout + r.stderr, r.stdout + r.stderr
    assert "lower the concurrency to 5" in r.stderr  # (300 - 256) // 8


def test_a_low_descriptor_limit_is_refused_by_name():
    descriptor_refusal()
    r = envhub("serve", "--preflight", "--concurrency", "4", limits=NOFILE_300)  # what 300 descriptors can hold
    assert r.returncode == 0, r.stdout + r.stderr
    assert "descriptors: ok" in r.stdout


def test_the_descriptor_test_fails_without_the_descriptor_check():
    with pytest.raises(AssertionError):
        descriptor_refusal(patch="import envhub.service.preflight as p; p.FDS_PER_SANDBOX = p.RESERVE_FDS = 0")


def test_a_low_process_limit_is_refused_by_name():
    r = envhub("serve", "--preflight", "--concurrency", "64",
               limits="resource.setrlimit(resource.RLIMIT_NPROC, (200, 200))")
    assert r.returncode == 1 and "processes: REFUSED: RLIMIT_NPROC is 200" in r.stderr, r.stdout + r.stderr


def test_an_unavailable_runtime_and_an_unreachable_backend_are_refused_by_name():
    url = f"http://127.0.0.1:{closed_port()}"
    r = envhub("serve", "--preflight", "--sandbox-runtime", "no-such-runtime", "--backend", url)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "sandbox runtime: unknown sandbox runtime 'no-such-runtime'" in r.stderr
    assert f"backend {url}: unreachable" in r.stderr
    assert "descriptors: ok" in r.stdout  # the others still pass


@pytest.mark.slow
def test_the_server_refuses_to_start_instead_of_failing_late():
    url = f"http://127.0.0.1:{closed_port()}"
    r = envhub("serve", "--port", "0", "--tokenizer", "tiny", "--backend", url)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "preflight refused to start" in r.stderr and "unreachable" in r.stderr
    assert "listening on" not in r.stdout
    from svc_helpers import spawn_server

    proc, _, _ = spawn_server("--backend", url, "--no-preflight")  # told to skip it: it starts
    proc.terminate()
    proc.wait(30)


class _Models(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802  (http.server's name)
        body = json.dumps({"object": "list", "data": [{"id": "m", "max_model_len": 128}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_a_backend_context_shorter_than_the_request_is_refused():
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{srv.server_address[1]}"
    try:
        short = pf.check_backend(url, max_length=4096)
        assert not short.ok and "context length 128 < the requested max_length 4096" in short.detail
        assert pf.check_backend(url + "/v1", max_length=100).ok
        with pytest.raises(pf.PreflightError, match="context length 128"):
            pf.require(2, backends=[url], runtime=None, max_length=4096)
    finally:
        srv.shutdown()


def test_more_memory_or_disk_than_the_node_has_is_refused():
    checks = {c.name: c for c in pf.preflight(4, runtime=None, memory_mb_per_sandbox=1e12, disk_mb_per_sandbox=1e12)}
    assert not checks["memory"].ok and "lower the concurrency to 0" in checks["memory"].detail
    assert not checks["disk"].ok and "MB free under" in checks["disk"].detail
    ok = {c.name: c for c in pf.preflight(4, runtime="auto", max_sandboxes=2)}
    assert all(c.ok for n, c in ok.items() if n != "sandbox limit"), ok
    assert not ok["sandbox limit"].ok and not ok["sandbox limit"].fatal  # a warning: the service queues at its limit
    with pytest.raises(ValueError):
        pf.preflight(0)
