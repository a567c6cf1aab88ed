"""The gateway's HTTP/1.1 protocol under attack (#28 item 10): the gateway serves on httptools
(:mod:`envhub.http.guarded_httptools`) where it served on h11; every limit and every malformed-request answer must
hold on it as on h11 -- each attack is sent to both, raw bytes on a socket, and the outcomes compared.

An outcome is the reply's status line (or none) and whether the server closed the connection; after each attack
the server must still answer a plain request.
"""
from __future__ import annotations

import socket
import time

import httpx
import pytest
from gw_helpers import TOOLS, agent_policy
from test_event_loop import _limits

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread
from envhub.gateway.server import http_protocol
from envhub.http import guarded_httptools

pytest.importorskip("httptools")  # the serve extra installs it (uvicorn[standard])
PROTOCOLS = ["h11", "httptools"]
HEAD = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"


@pytest.fixture
def serve(tiny_tokenizer, monkeypatch):
    made = []

    def start(protocol: str, **kw):
        monkeypatch.setenv("ENVHUB_GATEWAY_HTTP", protocol)
        srv = GatewayThread(Gateway(ScriptedBackend(agent_policy), tiny_tokenizer), **kw).start()
        made.append(srv)
        return srv

    yield start
    for srv in made:
        srv.stop()


def _outcome(srv, packets: list[bytes], pause: float = 0.0) -> tuple[bytes | None, bool]:
    """Send ``packets`` (``pause`` s apart, stopping when the server closes), then read: the reply's status line and
    whether the connection was closed."""
    s = socket.create_connection(("127.0.0.1", srv.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.settimeout(5)
    try:
        for p in packets:
            s.sendall(p)
            if pause:
                time.sleep(pause)
    except (BrokenPipeError, ConnectionResetError):
        pass
    got, closed = b"", False
    try:
        while True:
            chunk = s.recv(65536)
            if not chunk:
                closed = True
                break
            got += chunk
    except ConnectionResetError:
        closed = True
    except TimeoutError:
        pass
    s.close()
    assert httpx.get(srv.url + "/health", timeout=10).status_code == 200  # the server still serves
    return (got.split(b"\r\n")[0] or None), closed


def _outcomes(srv, cases: dict[str, list[bytes]]) -> dict[str, tuple[bytes | None, bool]]:
    """:func:`_outcome` of every case at once, each on its own connection (a kept connection waits out the read
    timeout: one after another, the cases cost 5 s each)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(cases)) as pool:
        futures = {name: pool.submit(_outcome, srv, packets) for name, packets in cases.items()}
        return {name: f.result() for name, f in futures.items()}


def _split(data: bytes, size: int) -> list[bytes]:
    return [data[i:i + size] for i in range(0, len(data), size)]


REFUSED = (b"HTTP/1.1 400 Bad Request", True)
ATTACKS = {
    # a head that never ends, one header's value growing packet by packet: httptools would accumulate it forever
    "endless header value, 1 KB packets": (_split(HEAD + b"X-Big: " + b"a" * 40_000, 1024), 0.002),
    "many headers, 1 KB packets": (_split(HEAD + b"".join(b"X-H%d: v\r\n" % i for i in range(3000)), 1024), 0.002),
    "a huge header, then the head's end": (_split(HEAD + b"X-Big: " + b"a" * 40_000 + b"\r\n\r\n", 4096), 0.002),
    "garbage request line": ([b"\x16\x03\x01\x02\x00garbage\r\n\r\n"], 0.0),
    "space in the target": ([b"GET /he alth HTTP/1.1\r\nHost: x\r\n\r\n"], 0.0),
    "bad header name": ([b"GET /health HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n"], 0.0),
    "bad chunk size": ([b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                        b"Transfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"], 0.0),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(ATTACKS))
def test_each_attack_is_refused_alike_on_both_protocols(serve, name):
    packets, pause = ATTACKS[name]
    seen = {p: _outcome(serve(p, header_timeout_s=5.0), packets, pause) for p in PROTOCOLS}
    assert seen["httptools"] == seen["h11"] == REFUSED, seen


OK, KEPT, CLOSED = b"HTTP/1.1 200 OK", False, True
# where the two parsers differ, each outcome pinned (h11's, httptools'): llhttp stricter on what no client library
# sends, and two valid requests it serves where h11 refused or routed elsewhere (guarded_httptools' docstring)
DIFFERENCES = {
    "Content-Length with Transfer-Encoding": (
        b"POST /v1/none HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", (b"HTTP/1.1 404 Not Found", KEPT), REFUSED),
    "obs-fold": (HEAD + b"X-A: a\r\n b\r\n\r\n", (OK, KEPT), REFUSED),
    "bare LF": (b"GET /health HTTP/1.1\nHost: x\n\n", (OK, KEPT), REFUSED),
    "control byte in a value": (HEAD + b"X-A: a\x01b\r\n\r\n", (OK, KEPT), REFUSED),
    "lower-case method": (b"get /health HTTP/1.1\r\nHost: x\r\n\r\n",
                          (b"HTTP/1.1 405 Method Not Allowed", KEPT), REFUSED),
    "CONNECT": (b"CONNECT x:443 HTTP/1.1\r\nHost: x\r\n\r\n", (b"HTTP/1.1 405 Method Not Allowed", KEPT), REFUSED),
    "empty line first": (b"\r\n" + HEAD + b"\r\n", REFUSED, (OK, KEPT)),
    "absolute-form target": (b"GET http://x/health HTTP/1.1\r\nHost: x\r\n\r\n",
                             (b"HTTP/1.1 404 Not Found", KEPT), (OK, KEPT)),
    "HTTP/2.0 request line": (b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", (OK, KEPT), (OK, CLOSED)),
}
# where llhttp alone would be laxer, the guard refuses as h11 does (and the rest of the malformed cases alike)
ALIKE = {
    "no HTTP version (0.9)": b"GET /health\r\n\r\n",
    "no Host": b"GET /health HTTP/1.1\r\n\r\n",
    "two Hosts": HEAD + b"Host: y\r\n\r\n",
    "two different Content-Lengths": b"POST /v1/none HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                     b"Content-Length: 3\r\n\r\n{}",
    "Content-Length not a number": b"POST /v1/none HTTP/1.1\r\nHost: x\r\nContent-Length: 2x\r\n\r\n{}",
    "Transfer-Encoding gzip": b"POST /v1/none HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
    "NUL in a value": HEAD + b"X-A: a\x00b\r\n\r\n",
    "space before the colon": b"GET /health HTTP/1.1\r\nHost : x\r\n\r\n",
}


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_where_the_parsers_differ_each_outcome_is_pinned(serve):
    seen = {p: _outcomes(serve(p, header_timeout_s=2.0), {k: [v[0]] for k, v in DIFFERENCES.items()})
            for p in PROTOCOLS}
    for name, (_, h11, httptools) in DIFFERENCES.items():
        assert (seen["h11"][name], seen["httptools"][name]) == (h11, httptools), name


@pytest.mark.timeout(180)
def test_what_llhttp_lets_through_is_refused_as_h11_refuses_it(serve):
    seen = {p: _outcomes(serve(p, header_timeout_s=2.0), {k: [v] for k, v in ALIKE.items()}) for p in PROTOCOLS}
    assert seen["httptools"] == seen["h11"] == {k: REFUSED for k in ALIKE}


@pytest.mark.timeout(120)
def test_break_it_without_the_host_and_version_checks_llhttp_serves_them(serve, monkeypatch):
    monkeypatch.setattr(guarded_httptools.GuardedHttpToolsProtocol, "on_headers_complete",
                        guarded_httptools.HttpToolsProtocol.on_headers_complete)
    srv = serve("httptools", header_timeout_s=2.0)
    assert _outcome(srv, [ALIKE["no Host"]])[0] == OK and _outcome(srv, [ALIKE["no HTTP version (0.9)"]])[0] == OK


@pytest.mark.timeout(120)
def test_a_huge_head_in_one_packet_is_refused_on_httptools(serve):
    """h11 refuses more than 16 KB of head only while it is incomplete in its buffer; one packet holding a whole
    40 KB head gets through it. The httptools guard counts the head's fields and refuses it however it arrives."""
    head = HEAD + b"X-Big: " + b"a" * 40_000 + b"\r\n\r\n"
    assert _outcome(serve("httptools"), [head]) == REFUSED
    many = HEAD + b"".join(b"X-H%d: v\r\n" % i for i in range(3000)) + b"\r\n"
    assert _outcome(serve("httptools"), [many]) == REFUSED


@pytest.mark.timeout(120)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_normal_head_in_many_tiny_packets_is_served(serve, protocol):
    """No false refusal: a 4 KB head (long URL, 40 headers) trickled two bytes at a time is answered 200."""
    head = (b"GET /health?" + b"q" * 2000 + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            + b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 40) for i in range(40)) + b"Connection: close\r\n\r\n")
    assert _outcome(serve(protocol, header_timeout_s=30.0), _split(head, 2)) == (b"HTTP/1.1 200 OK", True)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_limits_hold_on_both_protocols(serve, protocol):
    srv = serve(protocol, max_body_bytes=1 << 20, body_timeout_s=1.0, header_timeout_s=1.0, max_connections=4)
    assert _limits(srv) == [413, 413, b"HTTP/1.1 408 Request Timeout", ("head cut off", True),
                            ("past the cap cut off", True)]


@pytest.mark.timeout(120)
def test_httptools_is_the_default_and_h11_can_be_chosen(monkeypatch):
    monkeypatch.delenv("ENVHUB_GATEWAY_HTTP", raising=False)
    assert http_protocol() == "httptools"
    monkeypatch.setenv("ENVHUB_GATEWAY_HTTP", "h11")
    assert http_protocol() == "h11"
    with pytest.raises(ValueError, match="ENVHUB_GATEWAY_HTTP"):
        http_protocol("http3")


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_break_it_without_the_head_limit_an_endless_header_is_held(serve, monkeypatch):
    monkeypatch.setattr(guarded_httptools.GuardedHttpToolsProtocol, "max_head_bytes", 1 << 30)
    packets, pause = ATTACKS["endless header value, 1 KB packets"]
    assert _outcome(serve("httptools", header_timeout_s=30.0), packets, pause) == (None, False)
    head = HEAD + b"X-Big: " + b"a" * 40_000 + b"\r\n\r\n"
    assert _outcome(serve("httptools"), [head])[0] == b"HTTP/1.1 200 OK"


@pytest.mark.timeout(120)
@pytest.mark.slow
def test_break_it_without_the_head_deadline_a_slow_head_is_kept(serve, monkeypatch):
    monkeypatch.setattr(guarded_httptools.GuardedHttpToolsProtocol, "_arm_head_deadline", lambda self: None)
    srv = serve("httptools", max_body_bytes=1 << 20, body_timeout_s=1.0, header_timeout_s=1.0, max_connections=4)
    assert ("head cut off", False) in _limits(srv)


def _raw(conn: socket.socket, port: int, path: str, body: bytes, key: str | None = None) -> bytes:
    """A POST on a keep-alive connection as an HTTP client library sends it, and the reply as it came (head and the
    body read by its Content-Length)."""
    auth = b"Authorization: Bearer %s\r\n" % key.encode() if key else b""
    conn.sendall(b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n%s"
                 b"Content-Length: %d\r\n\r\n%s" % (path.encode(), port, auth, len(body), body))
    got = b""
    while b"\r\n\r\n" not in got:
        got += conn.recv(1 << 20)
    head, rest = got.split(b"\r\n\r\n", 1)
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    while len(rest) < length:
        rest += conn.recv(1 << 20)
    return head + b"\r\n\r\n" + rest


@pytest.mark.timeout(120)
def test_an_areal_client_gets_the_same_bytes_on_both_protocols(serve):
    """An AReaL episode on one keep-alive connection -- capacity, start, a chat call with tools, reward, end, export -- answered with the same
    bytes, status lines and headers included, on h11 and httptools (the date and per-call ids masked)."""
    import json
    import re

    def episode(srv) -> list[bytes]:
        c = socket.create_connection(("127.0.0.1", srv.port))
        c.settimeout(10)
        out = [_raw(c, srv.port, "/grant_capacity", b"{}"), _raw(c, srv.port, "/rl/start_session", b'{"task_id": "t"}')]
        s = json.loads(out[1].split(b"\r\n\r\n", 1)[1])
        body = json.dumps({"messages": [{"role": "user", "content": "list the files"}], "tools": TOOLS}).encode()
        out.append(_raw(c, srv.port, "/v1/chat/completions", body, s["api_key"]))
        out.append(_raw(c, srv.port, "/rl/set_reward", b'{"reward": 1.0}', s["api_key"]))
        out.append(_raw(c, srv.port, "/rl/end_session", b"{}", s["api_key"]))
        out.append(_raw(c, srv.port, "/export_trajectories", json.dumps({"session_id": s["session_id"]}).encode()))
        c.close()
        return out

    got = {p: episode(serve(p)) for p in PROTOCOLS}
    mask = re.compile(rb'date: [^\r]+|"(chatcmpl|call)[-_][0-9A-Za-z_-]+"|"created":\d+|"id":"[^"]+"|[0-9a-f]{32}'
                      rb'|"api_key":"[^"]+"|"session_id":"[^"]+"')
    assert [mask.sub(b"X", b) for b in got["h11"]] == [mask.sub(b"X", b) for b in got["httptools"]]
    assert got["h11"][2].startswith(b"HTTP/1.1 200 OK\r\n") and b'"interactions"' in got["h11"][5]
