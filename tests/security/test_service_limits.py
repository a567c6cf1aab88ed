"""Class 4 attacks on a real rollout server on loopback: oversized, slow and cross-site requests, connection floods,
missing tokens. Each asserts the attack is refused and that the server still answers the next request."""
from __future__ import annotations

import socket
import time

import httpx
import pytest

from envhub.http.server import is_loopback as is_loopback_name


@pytest.fixture
def serve(tiny_tokenizer):
    from envhub.service import RolloutService, ServerThread

    made = []

    def start(**kw):
        token = kw.pop("token", None)
        srv = ServerThread(RolloutService(tiny_tokenizer, backends=["golden"]), token=token, **kw).start()
        made.append(srv)
        return srv

    yield start
    for srv in made:
        srv.stop()


def _healthy(srv, token=None) -> None:
    h = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(srv.url + "/healthz", headers=h, timeout=10)
    assert r.status_code == 200 and r.json()["ok"], r.text


def test_oversized_body_gets_413(serve):
    srv = serve(max_body_bytes=1 << 20)
    big = b'{"instance": {"env_id": "countdown", "task": {"x": "' + b"a" * (3 << 20) + b'"}}}'
    r = httpx.post(srv.url + "/process", content=big, headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 413 and "limit" in r.json()["detail"], r.text

    def chunks():  # no Content-Length: counted while it streams
        for _ in range(48):
            yield b"a" * 65536

    r = httpx.post(srv.url + "/process", content=chunks(), headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 413, r.text
    _healthy(srv)


def test_slow_request_head_is_cut_off(serve):
    srv = serve(header_timeout_s=1.0)
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finishes the head
    s.settimeout(10)
    t0 = time.monotonic()
    assert s.recv(100) == b"", "the server kept a connection that never sent its request head"
    assert time.monotonic() - t0 < 8
    s.close()
    _healthy(srv)


def test_slow_body_gets_408(serve):
    srv = serve(body_timeout_s=1.0)
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.sendall(b"POST /cancel HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
              b"Content-Length: 100\r\n\r\n{")
    s.settimeout(10)
    assert b" 408 " in s.recv(1000).split(b"\r\n")[0]
    s.close()
    _healthy(srv)


def test_connection_flood_is_capped(serve):
    srv = serve(max_connections=8)
    held = [socket.create_connection(("127.0.0.1", srv.port)) for _ in range(8)]
    extra = socket.create_connection(("127.0.0.1", srv.port))
    extra.settimeout(10)
    try:
        assert extra.recv(10) == b"", "a connection past the cap was kept open"
    except ConnectionResetError:
        pass
    for s in held + [extra]:
        s.close()
    time.sleep(0.2)
    _healthy(srv)


@pytest.mark.parametrize("headers", [
    {"Content-Type": "text/plain"},                                        # a "simple" request: no preflight
    {"Content-Type": "application/json", "Origin": "https://evil.example"},
    {"Origin": "https://evil.example"},
    {"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"},
])
def test_cross_site_post_cannot_clear_backends(serve, headers):
    srv = serve()
    r = httpx.post(srv.url + "/clear_llm_server", content=b"{}" if "Content-Type" in headers else b"",
                   headers=headers, timeout=10)
    assert r.status_code in (403, 415), (r.status_code, r.text)
    st = httpx.get(srv.url + "/status", timeout=10).json()
    assert st["backends"], "a cross-site request removed the LLM servers"
    ok = httpx.post(srv.url + "/clear_llm_server", json={}, headers={"Origin": srv.url}, timeout=10)
    assert ok.status_code == 200, ok.text  # a same-origin JSON request still works


def test_token_required_on_every_endpoint(serve):
    srv = serve(token="s3cret")
    for method, path in [("GET", "/healthz"), ("GET", "/status"), ("GET", "/openapi.json"), ("GET", "/docs"),
                         ("POST", "/clear_llm_server"), ("POST", "/cancel"), ("GET", "/nonexistent")]:
        r = httpx.request(method, srv.url + path, json={} if method == "POST" else None, timeout=10)
        assert r.status_code == 401, (path, r.status_code)
    _healthy(srv, "s3cret")


@pytest.mark.parametrize("host", ["127.1", "::ffff:127.0.0.1", "LOCALHOST", "127.0.0.1", "::1", "[::1]"])
def test_loopback_spellings(host):
    assert is_loopback_name(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.1", "example.com", "::ffff:10.0.0.1", "localhost.evil.com"])
def test_not_loopback(host):
    assert not is_loopback_name(host)
