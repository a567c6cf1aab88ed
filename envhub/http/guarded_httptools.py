"""uvicorn's httptools protocol under the same guards as :class:`envhub.http.limits.GuardedH11Protocol`, plus the
request-head size limit h11 has and httptools lacks (the gateway serves on it: #28 item 10).

Why a second protocol: on the gateway's 64 KB agent requests uvicorn's h11 protocol (pure Python) cost ~0.5 ms of
server CPU per request more than its httptools one (llhttp, C). But uvicorn's httptools protocol has no limit on a
request head: llhttp streams the head to callbacks and httptools accumulates a header's value across packets, so a
client sending an endless header holds memory and a connection forever, where h11 answers 400 once more than
16 KB of head is buffered. So this class adds, to what the h11 one has:

* **a head size limit**: more than :data:`MAX_HEAD_BYTES` received while a request head is incomplete, or a
  complete head whose URL and fields (each counted with its separators) add up to more, is answered as h11
  answers a head over its limit -- ``400 Invalid HTTP request received.`` and the connection closed -- whatever
  the packets' sizes;
* **the connection cap** and **the head deadline** of the h11 class: a connection that has not sent a complete head
  within ``header_timeout_s`` of opening or of the first byte of a new head is closed.

It also writes through :class:`~envhub.http.corked.CorkedTransport`: the writes of one event-loop step (a
response's head and body messages) leave in one ``writelines``, not a syscall each.

Malformed heads (a garbage request line, a bad header name, a bad chunk size, conflicting lengths) get uvicorn's
``400 Invalid HTTP request received.`` and a close on either protocol. Where llhttp is laxer than h11 this class
refuses as h11 does: no HTTP version (HTTP/0.9), an HTTP/1.1 request without exactly one ``Host``. Where llhttp is
stricter it is left stricter (400 and a close where h11 went on): ``Content-Length`` together with
``Transfer-Encoding`` (request smuggling's tool), obs-folded header lines, bare-LF line ends, control characters in
a header value, a lower-case or ``CONNECT`` method -- none of which an HTTP client library sends. Two remaining
differences answer a valid request: an empty line before the request line is skipped (RFC 9112 2.2 allows it; h11
says 400), and an absolute-form target (``GET http://host/path``) is routed by its path (h11 hands the whole URL
on, which matches no route); an ``HTTP/2.0`` request line is answered and the connection closed (h11 keeps it). ``tests/gateway/test_http_attacks.py`` sends each case to both protocols and pins
every outcome.
"""
from __future__ import annotations

from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from envhub.http.corked import CorkedTransport
from envhub.http.limits import DEFAULT_HEADER_TIMEOUT_S, DEFAULT_MAX_CONNECTIONS

MAX_HEAD_BYTES = 16 * 1024  # h11's max_incomplete_event_size, uvicorn's h11 default: the same limit on both


class HeadRefused(Exception):
    """Raised in a parser callback: httptools turns it into ``HttpParserCallbackError``, which uvicorn answers 400."""


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a head size limit, a connection cap and a head deadline (module docstring)."""

    max_connections = DEFAULT_MAX_CONNECTIONS
    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S
    max_head_bytes = MAX_HEAD_BYTES

    _head_timer: Any = None
    _in_head = True  # between a request's end (or the connection's start) and its next head's end
    _head_bytes = 0  # bytes received since the current head began (head and, in the last packet, maybe body)
    _head_size = 0  # the head's URL and fields as counted at its end

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        # a response's writes (head, body messages) leave in one writelines per step (envhub.http.corked)
        transport = CorkedTransport(transport, self.loop)
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.close()
            return
        self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_deadline()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self._in_head:
            return super().data_received(data)
        if self._head_timer is None:  # the first byte of a new head (the connection's first is armed at opening)
            self._arm_head_deadline()
        self._head_bytes += len(data)
        super().data_received(data)
        # still inside the head after this packet, with more than the limit received: what h11 refuses as a buffered
        # incomplete event over 16 KB (without this, httptools keeps accumulating a header value across packets)
        if self._in_head and self._head_bytes > self.max_head_bytes and not self.transport.is_closing():
            self.send_400_response("Invalid HTTP request received.")

    # parser callbacks: the head's size counted as it streams past, exact whatever the packets
    def on_message_begin(self) -> None:
        self._in_head, self._head_size = True, 16  # the method, the version and the line's separators, generously
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:  # called once per packet the URL spans
        self._head_size += len(url)
        self._check_head_size()
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_size += len(name) + len(value) + 4  # ": " and CRLF
        self._check_head_size()
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        self._cancel_head_deadline()
        # what h11 refuses and llhttp lets through: a request line without a version (HTTP/0.9), and an HTTP/1.1
        # request without exactly one Host (RFC 9112 3.2: a server must answer 400)
        version = self.parser.get_http_version()
        if version == "0.9" or version == "1.1" and sum(name == b"host" for name, _ in self.headers) != 1:
            raise HeadRefused("no HTTP version, or not exactly one Host header")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_head = True
        super().on_message_complete()

    def _check_head_size(self) -> None:
        if self._head_size > self.max_head_bytes:
            raise HeadRefused(f"request head over {self.max_head_bytes} bytes")

    def _arm_head_deadline(self) -> None:
        def expire() -> None:
            self._head_timer = None
            if self._in_head and not self.transport.is_closing():
                self.transport.close()

        self._head_timer = self.loop.call_later(self.header_timeout_s, expire)

    def _cancel_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None


def protocol_class(max_connections: int, header_timeout_s: float) -> type:
    """A :class:`GuardedHttpToolsProtocol` subclass with these settings (uvicorn takes a class, not an instance)."""
    return type("ConfiguredGuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,),
                {"max_connections": int(max_connections), "header_timeout_s": float(header_timeout_s)})
