"""Wire format between the host client and the in-sandbox action server: length-prefixed JSON frames.

Each message is a 4-byte big-endian length followed by that many bytes of UTF-8 JSON. A request is an object with an
``op`` (``"shell"``, ``"exec"``, ``"edit"``, ``"python"``, ``"read"``, ``"write"``, ``"killall"``, ``"ping"``,
``"shutdown"``) and its arguments; the reply is ``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. Bytes
travel base64-encoded. A Unix domain socket keeps one round trip at tens of microseconds.

Encoding and decoding use the C accelerator behind :mod:`json` (``_json``) directly: the same scanner and encoder
``json.loads``/``json.dumps`` run, without importing the ``json`` package (it pulls in ``re`` and ``enum``, which
is a third of the action server's cold start). If ``_json`` is missing (another Python), :mod:`json` is used.

A reply may carry one file descriptor as ``SCM_RIGHTS`` ancillary data (``send(..., fd=N)``, read with
``recv_with_fd``): that is how the host gets its own copy of the sandbox shell's pty (see ``envhub.sandbox.attached``).
"""
from __future__ import annotations

import struct
from time import monotonic as _monotonic

MAX_FRAME = 512 << 20  # a frame larger than this is a protocol error, never an allocation
_HEADER = struct.Struct(">I")
_FD = struct.Struct("i")
_SOL_SOCKET, _SCM_RIGHTS = 1, 1  # Linux values (socket.SOL_SOCKET, socket.SCM_RIGHTS), without importing socket


class ProtocolError(ConnectionError):
    """The peer closed the connection or sent a malformed frame."""


def _codec():
    try:
        import _json

        class _Context:  # what json.JSONDecoder hands the C scanner
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
            memo: dict = {}

        def _unsupported(obj):
            raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")

        scan = _json.make_scanner(_Context())
        encode = _json.make_encoder(None, _unsupported, _json.encode_basestring, None, ":", ",", False, False, True)

        def dumps(obj) -> str:
            return "".join(encode(obj, 0))

        def loads(text: str):
            obj, end = scan(text, 0)
            if end != len(text):
                raise ValueError(f"extra data after the JSON value at {end}")
            return obj

        if loads(dumps({"a": [1, 2.5, "é", None, True]})) == {"a": [1, 2.5, "é", None, True]}:
            return dumps, loads
    except Exception:  # noqa: S110 (an interpreter whose _json differs: the public module below is always right)
        pass
    import json

    return (lambda obj: json.dumps(obj, ensure_ascii=False, separators=(",", ":"))), json.loads


dumps, loads = _codec()


def send(sock, obj: dict, fd: int | None = None) -> None:
    data = dumps(obj).encode("utf-8", errors="surrogatepass")
    if len(data) > MAX_FRAME:
        raise ProtocolError(f"frame of {len(data)} bytes exceeds the {MAX_FRAME}-byte limit")
    frame = _HEADER.pack(len(data)) + data
    if fd is None:
        sock.sendall(frame)
        return
    # the descriptor rides on the first byte; the kernel delivers it with the first recvmsg that reads that byte
    sock.sendmsg([frame[:1]], [(_SOL_SOCKET, _SCM_RIGHTS, _FD.pack(fd))])
    sock.sendall(frame[1:])


def recv_with_fd(sock, max_frame: int = MAX_FRAME, deadline: float | None = None) -> tuple[dict, int | None]:
    """Like :func:`recv`, for a reply that may carry a file descriptor (received close-on-exec). Returns
    ``(obj, fd)``; ``fd`` is None if none came. The caller owns the descriptor."""
    import socket

    first, anc, _, _ = sock.recvmsg(1, socket.CMSG_SPACE(_FD.size), socket.MSG_CMSG_CLOEXEC)
    if not first:
        raise ProtocolError("connection closed by peer")
    fd = None
    for level, kind, payload in anc:
        if level == _SOL_SOCKET and kind == _SCM_RIGHTS and len(payload) >= _FD.size:
            fd = _FD.unpack_from(payload)[0]
    try:
        return _finish(sock, first, max_frame, deadline), fd
    except BaseException:
        if fd is not None:
            import os

            os.close(fd)
        raise


def recv(sock, max_frame: int = MAX_FRAME, deadline: float | None = None) -> dict:
    """One frame. ``max_frame``: the largest frame accepted (the host passes one derived from the request's output
    limit: a hijacked server must not make it allocate more). ``deadline`` (``time.monotonic()``): a frame still
    incomplete then is an error -- with a per-``recv`` socket timeout, this bounds a peer that trickles bytes."""
    # one recv usually brings the whole frame (header and body): a second syscall only for large frames
    first = sock.recv(1 << 16)
    if not first:
        raise ProtocolError("connection closed by peer")
    return _finish(sock, first, max_frame, deadline)


def _finish(sock, first: bytes, max_frame: int = MAX_FRAME, deadline: float | None = None) -> dict:
    """The frame whose first bytes are ``first``: read the rest, decode, check."""
    if len(first) < _HEADER.size:
        first += _read_exact(sock, _HEADER.size - len(first), deadline)
    (n,) = _HEADER.unpack_from(first)
    if n > max_frame:
        raise ProtocolError(f"peer announced a {n}-byte frame (limit {max_frame})")
    body = first[_HEADER.size:]
    if len(body) > n:
        raise ProtocolError("peer sent more than one frame: one request at a time")
    if len(body) < n:
        body += _read_exact(sock, n - len(body), deadline)
    try:
        obj = loads(body.decode("utf-8", errors="surrogatepass"))
    except ValueError as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise ProtocolError(f"malformed frame: {e}") from None
    if not isinstance(obj, dict):
        raise ProtocolError("a frame must hold a JSON object")
    return obj


def _read_exact(sock, n: int, deadline: float | None = None) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        if deadline is not None and _monotonic() > deadline:
            raise ProtocolError(f"frame incomplete at the deadline ({len(buf)} of {n} bytes)")
        chunk = sock.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ProtocolError("connection closed by peer")
        buf += chunk
    return bytes(buf)
