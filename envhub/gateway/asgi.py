"""The gateway's ASGI plumbing (:mod:`envhub.gateway.app` serves the routes): the error a route raises for its
status, reading the caller's key from the headers, the checks of a body's fields, waiting for a disconnect, and
sending a JSON reply (a dict, its bytes, or :class:`Pieces` of them).
"""
from __future__ import annotations

import json
import math
from typing import Any


class HTTPError(Exception):
    """A reply with ``status`` and an OpenAI-shaped error body (``message``, ``param``, ``code``)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.param, self.code = status, param, code


def _number(body: dict[str, Any], name: str, default: float | None) -> float:
    """A finite number field (``default`` when absent; required when ``default`` is None)."""
    v = body.get(name, default) if default is not None else body.get(name)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise HTTPError(400, f"{name} must be a finite number, got {v!r}", param=name)
    return float(v)


def _choice(body: dict[str, Any], name: str, options: tuple[str, ...]) -> str:
    """One of ``options`` (the first is the default)."""
    v = body.get(name, options[0])
    if v not in options:
        raise HTTPError(400, f"{name} must be one of {', '.join(map(repr, options))}; got {v!r}", param=name)
    return str(v)


async def _disconnected(receive: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _key_of(headers: dict) -> str | None:
    auth = headers.get(b"authorization", b"").decode("latin-1")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip()
    x = headers.get(b"x-api-key") or headers.get(b"x-goog-api-key")  # Anthropic's, Gemini's
    return x.decode("latin-1").strip() if x else None


class Pieces(list):
    """A JSON reply already encoded, as the byte pieces (``bytes`` or byte-format ``memoryview``) whose
    concatenation is the body: :func:`_send` writes them without joining them first (the AReaL export, 6.3 MB per
    session in the throughput benchmark, #28 item 10)."""


SMALL_PIECE = 16 << 10  # pieces under this are joined into one body message; larger ones are sent as they are


def body_messages(pieces: list[bytes | memoryview]) -> list[bytes | memoryview]:
    """The ASGI body messages' payloads for ``pieces``: each run of small pieces joined (a message per ~100-byte
    JSON fragment would cost more than the copy), each large one as it is (uvloop's transport keeps a reference
    and writes them with one ``writev``; nothing is copied in this process). Their concatenation is the pieces'."""
    out: list[bytes | memoryview] = []
    run: list[bytes | memoryview] = []
    for p in pieces:
        if memoryview(p).nbytes < SMALL_PIECE:
            run.append(p)
            continue
        if run:
            out.append(b"".join(run))
            run = []
        out.append(p)
    if run:
        out.append(b"".join(run))
    return out


async def _send(send: Any, status: int, payload: dict[str, Any] | bytes | Pieces) -> None:
    if isinstance(payload, Pieces):
        parts = body_messages(payload)
        size = sum(memoryview(p).nbytes for p in parts)
    else:
        parts = [payload if isinstance(payload, bytes) else json.dumps(payload, ensure_ascii=False,
                                                                        separators=(",", ":")).encode()]
        size = len(parts[0])
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(size).encode())]})
    last = len(parts) - 1
    for i, body in enumerate(parts):
        await send({"type": "http.response.body", "body": body, "more_body": i < last})
