"""What an envhub server (the rollout service, the gateway) accepts from a client: request size, time to send it,
connections, and where from.

Three parts, all outside the endpoints (so every endpoint gets them, and endpoint code stays about its work):

* :func:`read_body`, the one reading of a request body both servers use: **415** for a body that is not JSON,
  **413** past the cap (announced or counted, naming the flag that raises it), **408** past the body deadline.
* :class:`RequestGuard`, ASGI middleware. A body larger than ``max_body_bytes`` gets **413** (announced by
  ``Content-Length`` or counted while streaming); a body not complete within ``body_timeout_s`` gets **408**. A
  state-changing request (any method but GET/HEAD/OPTIONS) with a body must say ``Content-Type: application/json``
  (**415** otherwise; a body-less POST may carry any content type, aiohttp sends ``application/octet-stream``), and
  is refused with **403** when its ``Origin`` (or ``Sec-Fetch-Site: cross-site``) says a web page of another site
  sent it. Why on loopback too: a page open in the browser of the machine's user can POST to ``127.0.0.1``; a
  "simple" cross-site request (``text/plain``, no preflight) reaches the server, and a JSON content type cannot be
  sent cross-site without a preflight we never answer.
* :class:`GuardedH11Protocol`, uvicorn's HTTP/1.1 protocol with a connection cap (connections past
  ``max_connections`` are closed at once) and a header deadline (a connection that has not sent a complete request
  head within ``header_timeout_s`` of its first byte -- or of opening -- is closed: slowloris).
"""
from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import urlsplit

from uvicorn.protocols.http.h11_impl import H11Protocol

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_BODY_TIMEOUT_S = 30.0
DEFAULT_MAX_CONNECTIONS = 4096


def is_loopback_name(host: str) -> bool:
    """``localhost`` (any case), ``127.0.0.0/8`` in any spelling (``127.1``), ``::1``, ``::ffff:127.0.0.1``."""
    import ipaddress
    import socket

    host = host.strip().strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        try:  # inet_aton spellings: "127.1", "0x7f.1", "2130706433"
            addr = ipaddress.ip_address(socket.inet_aton(host))
        except OSError:
            return False
    if getattr(addr, "ipv4_mapped", None) is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


async def _reply(send: Any, status: int, detail: str) -> None:
    import json

    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BodyRefused(Exception):
    """A request refused while its body was read: the HTTP ``status`` and a message a person can act on."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def check_length(headers: dict, max_body: int, flag: str) -> None:
    """Refuse (413, naming ``flag``) a request whose ``Content-Length`` announces more than ``max_body`` bytes."""
    length = headers.get(b"content-length")
    if length is not None and length.isdigit() and int(length) > max_body:
        raise BodyRefused(413, f"request body of {int(length)} bytes is larger than this server's limit of "
                               f"{max_body} bytes ({flag})")


async def read_body(headers: dict, receive: Any, *, max_body: int, body_timeout: float, flag: str,
                    assume_json: bool = False) -> bytes | None:
    """The request body, read the way every envhub server reads it (``headers``: lower-cased names to values).

    Args:
        receive: the ASGI ``receive`` of the request.
        max_body: the cap in bytes: a ``Content-Length`` over it is refused before reading, a stream when it passes.
        body_timeout: seconds the whole body may take to arrive.
        flag: the command-line flag that raises the cap, named in the 413 message.
        assume_json: a request without ``Content-Type`` is taken as JSON (the gateway's clients); otherwise a body
            must say ``application/json``.

    Returns:
        The body's bytes, or None when the client went away while sending it.

    Raises:
        BodyRefused: 415 (not JSON), 413 (over the cap), 408 (too slow).
    """
    ctype = headers.get(b"content-type", b"application/json" if assume_json else b"").split(b";")[0].strip().lower()
    has_body = headers.get(b"content-length", b"0") not in (b"0", b"") or b"transfer-encoding" in headers
    if (has_body or assume_json) and ctype != b"application/json":
        raise BodyRefused(415, f"the body must be JSON: send 'Content-Type: application/json' (got "
                               f"{ctype.decode(errors='replace')!r})")
    check_length(headers, max_body, flag)
    body, more = bytearray(), True
    while more:
        try:
            msg = await _receive_within(receive, body_timeout)
        except asyncio.TimeoutError:
            raise BodyRefused(408, f"the request body was not complete within {body_timeout:g} s") from None
        if msg["type"] == "http.disconnect":
            return None
        chunk = msg.get("body", b"")
        more = msg.get("more_body", False)
        if not more and not body and type(chunk) is bytes:  # the whole body in one message (the usual case):
            if len(chunk) > max_body:  # returned as it came, not copied twice (#28 item 10)
                raise BodyRefused(413, f"request body is larger than this server's limit of {max_body} bytes "
                                       f"({flag})")
            return chunk
        body += chunk
        if len(body) > max_body:
            raise BodyRefused(413, f"request body is larger than this server's limit of {max_body} bytes ({flag})")
    return bytes(body)


_timeout = getattr(asyncio, "timeout", None)  # Python 3.11+


async def _receive_within(receive: Any, seconds: float) -> Any:
    """``await receive()``, or ``asyncio.TimeoutError`` after ``seconds``. ``asyncio.timeout`` where there is one: it
    times the await in place, where ``wait_for`` wraps ``receive()`` in a task of its own (~11 against ~17 µs per
    message under uvloop, #28 item 10); ``wait_for`` on Python 3.10."""
    if _timeout is None:
        return await asyncio.wait_for(receive(), seconds)
    async with _timeout(seconds):
        return await receive()


class RequestGuard:
    """ASGI middleware enforcing the body cap, the body deadline, JSON content type and same-origin (see module)."""

    def __init__(self, app: Any, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S, flag: str = "envhub serve --max-body-mb"):
        self.app, self.max_body, self.body_timeout = app, int(max_body_bytes), float(body_timeout_s)
        self.flag = flag

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        try:
            if scope["method"] in SAFE_METHODS:
                check_length(headers, self.max_body, self.flag)
                return await self.app(scope, receive, send)
            refused = self.cross_site(headers, scope)
            if refused:
                return await _reply(send, 403, refused)
            body = await read_body(headers, receive, max_body=self.max_body, body_timeout=self.body_timeout,
                                   flag=self.flag)
        except BodyRefused as e:
            return await _reply(send, e.status, f"{scope['method']} {scope['path']}: {e}" if e.status == 415 else
                                str(e))
        if body is None:  # the client went away
            return None
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)

    @staticmethod
    def cross_site(headers: dict, scope: dict) -> str | None:
        if headers.get(b"sec-fetch-site", b"") == b"cross-site":
            return "cross-site requests are refused (Sec-Fetch-Site: cross-site)"
        origin = headers.get(b"origin")
        if origin is None:
            return None
        o = origin.decode(errors="replace")
        host = urlsplit(o).hostname or ""
        own = (headers.get(b"host", b"").decode(errors="replace").rsplit(":", 1)[0]).strip("[]").lower()
        if host and (host == own or is_loopback_name(host) and is_loopback_name(own or "localhost")):
            return None
        return f"requests from web pages of another origin are refused (Origin: {o[:100]})"


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap and a request-head deadline (see module docstring)."""

    max_connections = DEFAULT_MAX_CONNECTIONS
    header_timeout_s = DEFAULT_HEADER_TIMEOUT_S

    _head_timer: Any = None
    _completed = 0  # replies sent on this connection: a deadline armed for an earlier request head is void

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            transport.close()
            return
        self._arm_head_deadline()

    def data_received(self, data: bytes) -> None:
        import h11

        if self._head_timer is None and self.conn.their_state is h11.IDLE:  # a new request head is starting
            self._arm_head_deadline()
        super().data_received(data)

    def on_response_complete(self) -> None:
        self._completed += 1
        super().on_response_complete()

    def _arm_head_deadline(self) -> None:
        import h11

        armed_at = self._completed

        def expire() -> None:
            self._head_timer = None
            if (self._completed == armed_at and self.conn.their_state is h11.IDLE
                    and not self.transport.is_closing()):
                self.transport.close()

        self._head_timer = self.loop.call_later(self.header_timeout_s, expire)


def default_max_connections() -> int:
    """The connection cap when none is given: what the open-files limit allows, less a reserve for sandboxes (each
    holds a few descriptors), and never below :data:`DEFAULT_MAX_CONNECTIONS`. Every in-flight ``/process`` holds
    one connection (ProRL's API answers when the rollout is done), so a trainer with 65,000 jobs in flight needs
    65,000: the cap is there to keep a flood from exhausting descriptors, not to ration real clients."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    return max(DEFAULT_MAX_CONNECTIONS, soft - max(4096, soft // 8))


def protocol_class(max_connections: int, header_timeout_s: float) -> type:
    """A :class:`GuardedH11Protocol` subclass with these settings (uvicorn takes a class, not an instance)."""
    return type("ConfiguredGuardedH11Protocol", (GuardedH11Protocol,),
                {"max_connections": int(max_connections), "header_timeout_s": float(header_timeout_s)})
