"""#28 item 10: the gateway's httptools protocol writes through ``envhub.http.corked.CorkedTransport``: the writes of
one event-loop step leave together, in order, and nothing written before a close is lost. Real uvloop transports
over a loopback socket pair; the peer reads what arrived."""
from __future__ import annotations

import asyncio
import socket

import pytest

from envhub.http import corked
from envhub.http.corked import CorkedTransport

uvloop = pytest.importorskip("uvloop")


async def pair():
    """A real transport on one end of a loopback socket pair, a plain socket on the other."""
    a, b = socket.socketpair()
    loop = asyncio.get_running_loop()
    transport, _ = await loop.connect_accepted_socket(asyncio.Protocol, a)
    b.setblocking(False)
    return transport, b


async def read_all(sock, until_eof: bool = True) -> bytes:
    loop, out = asyncio.get_running_loop(), []
    while True:
        try:
            data = await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), 5)
        except asyncio.TimeoutError:
            if until_eof:
                raise
            return b"".join(out)
        if not data:
            return b"".join(out)
        out.append(data)


class Spy:
    """The real transport, with the number of pieces of each write or writelines recorded (it still writes)."""

    def __init__(self, transport, calls: list[int]):
        self.transport, self.calls = transport, calls

    def write(self, data):
        self.calls.append(1)
        self.transport.write(data)

    def writelines(self, lines):
        lines = list(lines)
        self.calls.append(len(lines))
        self.transport.writelines(lines)

    def __getattr__(self, name):
        return getattr(self.transport, name)


def run(coro):
    return uvloop.run(coro)


@pytest.mark.timeout(60)
def test_one_steps_writes_leave_as_one_writelines_in_order():
    async def main():
        transport, peer = await pair()
        calls: list[int] = []
        spy = Spy(transport, calls)  # the real transport, its writes counted
        t = CorkedTransport(spy)
        pieces = [b"HTTP/1.1 200 OK\r\n\r\n", memoryview(b"x" * 300_000)[1:], b"tail"]
        for p in pieces:
            t.write(p)
        assert calls == []  # kept until this step yields
        await asyncio.sleep(0)
        assert calls == [3]
        t.close()
        got = await read_all(peer)
        assert got == b"".join(bytes(p) for p in pieces)

    run(main())


@pytest.mark.timeout(60)
def test_a_close_right_after_writing_sends_what_was_written():
    """uvicorn writes a 400 and closes in the same step (an over-long head): the reply must still arrive."""
    async def main():
        transport, peer = await pair()
        t = CorkedTransport(transport)
        t.write(b"HTTP/1.1 400 Bad Request\r\n")
        t.write(b"connection: close\r\n\r\nInvalid HTTP request received.")
        t.close()
        assert t.is_closing()
        assert (await read_all(peer)).startswith(b"HTTP/1.1 400 Bad Request\r\nconnection: close")

    run(main())


@pytest.mark.timeout(60)
def test_break_it_a_close_that_does_not_flush_loses_the_reply(monkeypatch):
    monkeypatch.setattr(corked.CorkedTransport, "close", lambda self: self._transport.close())

    async def main():
        transport, peer = await pair()
        t = CorkedTransport(transport)
        t.write(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        t.close()
        return await read_all(peer)

    assert run(main()) == b""


@pytest.mark.timeout(60)
def test_abort_drops_what_is_kept_and_the_rest_is_the_transports():
    async def main():
        transport, peer = await pair()
        t = CorkedTransport(transport)
        t.write(b"never sent")
        assert t.get_write_buffer_size() == len(b"never sent")
        assert t.get_extra_info("socket") is transport.get_extra_info("socket")
        t.abort()
        await asyncio.sleep(0)
        return await read_all(peer)

    assert run(main()) == b""
