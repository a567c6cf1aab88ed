"""The gateway serves on uvloop when it is installed (:func:`envhub.gateway.server.event_loop`, #28 item 10) and a
client sees the same server on either loop: the body cap (413, announced and streamed), the body deadline (408), the
request-head deadline, the connection cap, a streamed reply, and the same bytes for the same calls."""
from __future__ import annotations

import socket
import time

import httpx
import pytest
from gw_helpers import TOOLS, agent_policy

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread
from envhub.gateway.server import event_loop
from envhub.http import limits
from envhub.http.guarded_httptools import GuardedHttpToolsProtocol

pytestmark = pytest.mark.timeout(180)
uvloop = pytest.importorskip("uvloop")  # the serve extra installs it
LOOPS = ["uvloop", "asyncio"]


def test_uvloop_is_the_default_and_can_be_turned_off(monkeypatch, tiny_tokenizer):
    import asyncio

    assert event_loop() == (uvloop.run, uvloop.new_event_loop)
    monkeypatch.setenv("ENVHUB_GATEWAY_LOOP", "asyncio")
    assert event_loop() == (asyncio.run, asyncio.new_event_loop)
    monkeypatch.setenv("ENVHUB_GATEWAY_LOOP", "libuv")
    with pytest.raises(ValueError, match="auto, uvloop or asyncio"):
        event_loop()
    monkeypatch.delenv("ENVHUB_GATEWAY_LOOP")
    with GatewayThread(Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)) as srv:
        assert isinstance(srv.loop, uvloop.Loop)


@pytest.fixture
def serve(tiny_tokenizer):
    made = []

    def start(loop: str, **kw):
        gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
        srv = GatewayThread(gw, loop_factory=event_loop(loop)[1], **kw).start()
        made.append(srv)
        return gw, srv

    yield start
    for srv in made:
        srv.stop()


def _healthy(srv) -> None:
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200


def _closed(s: socket.socket) -> bool:
    """Whether the server closed ``s`` (within its timeout)."""
    try:
        return s.recv(100) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def _limits(srv) -> list:
    """What the limits answer: the status of an announced and a streamed oversized body, of a slow body, whether a
    slow head and a connection past the cap are cut off."""
    seen = []
    big = b'{"messages": [{"role": "user", "content": "' + b"a" * (2 << 20) + b'"}]}'
    seen.append(httpx.post(srv.url + "/v1/chat/completions", content=big, timeout=30).status_code)
    seen.append(httpx.post(srv.url + "/v1/chat/completions", content=(b"a" * 65536 for _ in range(32)),
                           headers={"Content-Type": "application/json"}, timeout=30).status_code)
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /rl/set_reward HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n{")
    s.settimeout(10)
    seen.append(s.recv(1000).split(b"\r\n")[0])
    s.close()
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finishes the head
    s.settimeout(6)
    t0 = time.monotonic()
    seen.append(("head cut off", _closed(s) and time.monotonic() - t0 < 6))
    s.close()
    held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(4)]
    extra = socket.create_connection(("127.0.0.1", srv.port))
    extra.settimeout(10)
    seen.append(("past the cap cut off", _closed(extra)))
    for s in held + [extra]:
        s.close()
    time.sleep(0.2)
    _healthy(srv)
    return seen


@pytest.mark.parametrize("loop", LOOPS)
def test_the_limits_hold_on_either_loop(serve, loop):
    _, srv = serve(loop, max_body_bytes=1 << 20, body_timeout_s=1.0, header_timeout_s=1.0, max_connections=4)
    assert _limits(srv) == [413, 413, b"HTTP/1.1 408 Request Timeout", ("head cut off", True),
                            ("past the cap cut off", True)]


@pytest.mark.slow
def test_break_it_without_the_head_deadline_the_check_fails(serve, monkeypatch):
    monkeypatch.setattr(limits.GuardedH11Protocol, "_arm_head_deadline", lambda self: None)
    monkeypatch.setattr(GuardedHttpToolsProtocol, "_arm_head_deadline", lambda self: None)  # the gateway's default
    _, srv = serve("uvloop", max_body_bytes=1 << 20, body_timeout_s=1.0, header_timeout_s=1.0, max_connections=4)
    assert ("head cut off", False) in _limits(srv)


def _session_bytes(gw, srv) -> list[bytes]:
    """A plain and a streamed chat call with tools, then the session's AReaL export, as raw bytes."""
    s = gw.start_session("t")
    h = {"Authorization": f"Bearer {s.api_key}"}
    msgs = [{"role": "user", "content": "list the files"}]
    out = [httpx.post(srv.url + "/v1/chat/completions", json={"messages": msgs, "tools": TOOLS}, headers=h).content]
    with httpx.stream("POST", srv.url + "/v1/chat/completions", headers=h,
                      json={"messages": msgs, "tools": TOOLS, "stream": True}) as r:
        out.append(b"".join(r.iter_raw()))
    httpx.post(srv.url + "/rl/set_reward", json={"reward": 1.0}, headers=h)
    httpx.post(srv.url + "/rl/end_session", json={}, headers=h)
    out.append(httpx.post(srv.url + "/export_trajectories", json={"session_id": s.session_id}).content)
    return out


def test_a_client_gets_the_same_bytes_on_either_loop(serve):
    import re

    got = [_session_bytes(*serve(loop)) for loop in LOOPS]
    ids = re.compile(rb'"(chatcmpl|call)[-_][0-9A-Za-z_-]+"|"created":\d+|"id":"[^"]+"|[0-9a-f]{32}')  # per-call ids
    assert [ids.sub(b"ID", b) for b in got[0]] == [ids.sub(b"ID", b) for b in got[1]]
    assert b"data: [DONE]" in got[0][1] and b'"interactions"' in got[0][2]
