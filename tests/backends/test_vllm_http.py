"""``envhub.backends.vllm_http`` without vLLM: the span check, and the lifecycle driving servers that misbehave.

The real server is the ``vllm`` tier's (``test_vllm_rl_routes.py``). Here a loopback HTTP server answers vLLM's
RL routes the way a broken or missing one would: a ``/pause`` that never answers, no dev mode (404 on every RL
route), a ``/resume`` that fails. What must hold: each is a clear :class:`LifecycleError` within the timeout, and
the lifecycle is never left stuck (a failed pause is undone, a failed resume can be retried).
"""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envhub.backends import lifecycle as lifecycle_mod
from envhub.backends.lifecycle import LifecycleError, WeightLifecycle
from envhub.backends.vllm_http import VersionMismatch, VLLMServerControl, spans_to_versions

pytestmark = pytest.mark.timeout(60)


def S(v, a, b):  # noqa: N802 - a span, as vLLM writes it
    return {"version": str(v), "start": a, "end": b}


def test_spans_become_one_version_per_token():
    assert spans_to_versions([S(3, 0, 2), S(4, 2, 5)], 5, 3, 4) == [3, 3, 4, 4, 4]
    assert spans_to_versions([], 0, 0, 0) == [] and spans_to_versions(None, 0, 0, 0) == []


@pytest.mark.parametrize("spans, n, match", [
    (None, 3, "no weight_versions"),
    ([S(3, 0, 2)], 3, "cover 2 tokens"),                     # stops short
    ([S(3, 0, 4)], 3, "cover 4 tokens"),                     # runs past
    ([S(3, 0, 1), S(3, 2, 3)], 3, "not contiguous"),         # a gap
    ([S(3, 0, 2), S(3, 1, 3)], 3, "not contiguous"),         # an overlap
    ([S(3, 1, 3)], 2, "not contiguous"),                     # not from 0
    ([S(3, 0, 0), S(3, 0, 3)], 3, "not contiguous"),         # an empty span
    ([{"version": "default", "start": 0, "end": 3}], 3, "not an integer"),
    ([{"start": 0, "end": 3}], 3, "malformed"),
    ([S(5, 0, 3)], 3, "version 5.*disagree"),                # newer than any version declared
    ([S(1, 0, 3)], 3, "version 1.*disagree"),                # older than the version the call entered under
])
def test_spans_that_do_not_fit_are_refused(spans, n, match):
    with pytest.raises(VersionMismatch, match=match):
        spans_to_versions(spans, n, 2, 4)


class FakeRoutes(BaseHTTPRequestHandler):
    """vLLM's RL routes as a misbehaving server answers them (``behaviour`` on the server object)."""

    def _answer(self):
        srv = self.server
        path = self.path.split("?")[0]
        srv.calls.append(self.path)
        if srv.behaviour == "no-dev-mode":
            return self._json(404, {"detail": "Not Found"})
        if path == "/pause" and srv.behaviour == "hang-pause":
            time.sleep(1.5)
        if path == "/resume" and srv.fail_resume:
            return self._json(500, {"error": "engine dead"})
        body = {"is_paused": False} if path == "/is_paused" else {"success": True}
        return self._json(200, body)

    def _json(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except BrokenPipeError:  # the client gave up first (the hanging /pause): what the test wants
            pass

    def do_GET(self):  # noqa: N802
        self._answer()

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer()

    def log_message(self, *args):
        pass


@pytest.fixture
def fake():
    servers = []

    def start(behaviour="ok"):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), FakeRoutes)
        srv.behaviour, srv.calls, srv.fail_resume = behaviour, [], False
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        srv.url = f"http://127.0.0.1:{srv.server_address[1]}"
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def test_a_server_without_dev_mode_is_refused_at_attach(fake):
    srv = fake("no-dev-mode")
    lc = WeightLifecycle()
    with pytest.raises(LifecycleError, match="VLLM_SERVER_DEV_MODE=1"):
        lc.add_engine(VLLMServerControl(srv.url))
    assert lc.engines == []
    lc.pause("abort", timeout_s=1)  # the lifecycle still works: it drains (nothing in flight here)
    lc.resume(version=1)


def test_attach_tells_the_server_the_lifecycle_version(fake):
    srv = fake()
    lc = WeightLifecycle(version=5)
    lc.add_engine(VLLMServerControl(srv.url))
    assert srv.calls == ["/is_paused", "/update_weight_version"]
    lc.pause("hold")
    lc.resume(version=6)
    assert srv.calls[2:] == ["/pause?mode=keep&clear_cache=true", "/update_weight_version",
                             "/reset_prefix_cache?reset_running_requests=true", "/resume"]


def check_failed_pause_is_undone(lc, good, hanging):
    """A pause that times out on one server: a clear error within the timeout, the lifecycle not paused, every
    server resumed, and the next pause / resume cycle works."""
    t0 = time.monotonic()
    with pytest.raises(LifecycleError, match="did not answer within"):
        lc.pause("abort", timeout_s=0.5)
    # bounded by the 0.5 s asked for, not the control's 30 s default: the margin is for a loaded host (5.4 s
    # measured at load average 22), not a speed claim
    assert time.monotonic() - t0 < 15
    assert not lc.paused, "a failed pause left the lifecycle paused"
    assert "/resume" in good.calls, "the server paused before the failure was not resumed"


def test_a_pause_the_server_never_answers_is_bounded_and_undone(fake):
    good, hanging = fake(), fake("hang-pause")
    lc = WeightLifecycle()
    lc.add_engine(VLLMServerControl(good.url, timeout_s=2))
    lc.add_engine(VLLMServerControl(hanging.url, timeout_s=2))
    check_failed_pause_is_undone(lc, good, hanging)
    hanging.behaviour = "ok"
    lc.pause("abort")
    assert lc.resume(version=1) == {"version": 1}


def test_break_it_a_pause_failure_without_undo_is_caught(fake, monkeypatch):
    good, hanging = fake(), fake("hang-pause")
    lc = WeightLifecycle()
    lc.add_engine(VLLMServerControl(good.url, timeout_s=2))
    lc.add_engine(VLLMServerControl(hanging.url, timeout_s=2))

    def no_undo(self, engines, mode, deadline):
        for engine in engines:
            engine.pause(mode, timeout_s=deadline - time.monotonic())

    monkeypatch.setattr(lifecycle_mod.WeightLifecycle, "_pause_engines", no_undo)
    with pytest.raises(AssertionError):
        check_failed_pause_is_undone(lc, good, hanging)


def test_a_failed_resume_leaves_the_lifecycle_paused_and_can_be_retried(fake):
    srv = fake()
    lc = WeightLifecycle()
    lc.add_engine(VLLMServerControl(srv.url))
    lc.pause("abort")
    srv.fail_resume = True
    with pytest.raises(LifecycleError, match="HTTP 500"):
        lc.resume(version=1)
    assert lc.paused and lc.version == 1  # the server was told 1; calls still wait, bounded by max_pause_s
    srv.fail_resume = False
    assert lc.resume(version=1) == {"version": 1} and not lc.paused


def test_set_version_without_a_pause_tells_the_server_first(fake):
    srv = fake()
    lc = WeightLifecycle()
    lc.add_engine(VLLMServerControl(srv.url))
    lc.set_version(3)
    assert lc.version == 3 and srv.calls[-1] == "/update_weight_version"
    srv.behaviour = "no-dev-mode"  # the server lost its routes: refused, the lifecycle's version unchanged
    with pytest.raises(LifecycleError, match="404"):
        lc.set_version(4)
    assert lc.version == 3


def test_the_vllm_rl_spec_attaches_the_server_and_a_pool_pauses_every_one(fake):
    """``make_backend("vllm-rl+http://…")`` is how the CLI, the service and the gateway get a server driven by its own
    routes; in a pool (several addresses, or the service's pool) the pool's one lifecycle must reach every server."""
    from envhub.backends import make_backend
    from envhub.backends.lifecycle import lifecycle_of
    from envhub.backends.vllm_http import VLLMGenerateBackend

    a, b = fake(), fake()
    single = make_backend(f"vllm-rl+{a.url}")
    assert isinstance(single, VLLMGenerateBackend) and len(lifecycle_of(single).engines) == 1
    assert a.calls == ["/is_paused", "/update_weight_version"]
    pool = make_backend(f"vllm-rl+{a.url},vllm-rl+{b.url}")
    lc = lifecycle_of(pool)
    assert len(lc.engines) == 2 and all(lifecycle_of(m) is lc for m in pool.backends.values())
    lc.pause("abort")
    lc.resume(version=2)
    for srv in (a, b):
        assert srv.calls[-4:] == ["/pause?mode=abort&clear_cache=true", "/update_weight_version",
                                  "/reset_prefix_cache?reset_running_requests=true", "/resume"], srv.calls
    no_dev = fake("no-dev-mode")
    with pytest.raises(LifecycleError, match="VLLM_SERVER_DEV_MODE=1"):
        make_backend(f"vllm-rl+{no_dev.url}")
