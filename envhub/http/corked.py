"""A transport whose writes made in one step of the event loop go out together (:class:`CorkedTransport`).

uvicorn writes a response's head and each body message with its own ``transport.write``, and uvloop sends each at
once when its buffer is empty: a syscall per write. For the gateway's replies that is two per response (head, body),
and for the AReaL export, sent as ~80 pieces (``envhub.gateway.asgi.Pieces``), ~80, which cost more than joining
the 6.3 MB body had (#28 item 10). Here the writes of one step are kept, in order, and handed to the real transport
as one ``writelines`` (uvloop: one ``writev``) by a callback scheduled with the first of them, which runs once the
step that wrote them yields. The bytes and their order are unchanged; what changes is when they leave, by at most
the rest of the current step. ``close`` sends what is kept first (as a transport's own close flushes its buffer);
``abort`` drops it (as a transport's abort does)."""
from __future__ import annotations

import asyncio
from typing import Any


class CorkedTransport:
    """Wraps ``transport``: ``write`` keeps, a ``call_soon`` callback flushes; everything else is the transport's."""

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop | None = None):
        self._transport = transport
        self._loop = loop or asyncio.get_event_loop()
        self._kept: list[Any] = []

    def write(self, data: Any) -> None:
        if not data:
            return
        if not self._kept:
            self._loop.call_soon(self.flush)
        self._kept.append(data)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        kept, self._kept = self._kept, []
        if kept and not self._transport.is_closing():
            if len(kept) == 1:
                self._transport.write(kept[0])
            else:
                self._transport.writelines(kept)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._kept = []
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + sum(memoryview(d).nbytes for d in self._kept)

    def __getattr__(self, name: str) -> Any:  # is_closing, get_extra_info, pause_reading, ...: the transport's
        return getattr(self._transport, name)
