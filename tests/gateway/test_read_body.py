"""#28 item 10: ``envhub.http.limits.read_body`` returns a body that came in one message as it came (no copies),
and times each receive with ``asyncio.timeout`` where Python has it (``wait_for`` on 3.10). Both must answer exactly
as the earlier code did: the same bytes, the same 413/408/415 and the same ``None`` for a client that left, for
every way a body can arrive; checked against that code, kept here as the reference, under both timers."""
from __future__ import annotations

import asyncio

import pytest

from envhub.http import limits
from envhub.http.limits import BodyRefused, check_length, read_body

pytestmark = pytest.mark.timeout(60)
CAP = 100


async def reference(headers, receive, *, max_body, body_timeout, flag, assume_json=False):
    """read_body as it was before (#28 item 10's last change to it)."""
    ctype = headers.get(b"content-type", b"application/json" if assume_json else b"").split(b";")[0].strip().lower()
    has_body = headers.get(b"content-length", b"0") not in (b"0", b"") or b"transfer-encoding" in headers
    if (has_body or assume_json) and ctype != b"application/json":
        raise BodyRefused(415, f"the body must be JSON: send 'Content-Type: application/json' (got "
                               f"{ctype.decode(errors='replace')!r})")
    check_length(headers, max_body, flag)
    body, more = bytearray(), True
    while more:
        try:
            msg = await asyncio.wait_for(receive(), body_timeout)
        except asyncio.TimeoutError:
            raise BodyRefused(408, f"the request body was not complete within {body_timeout:g} s") from None
        if msg["type"] == "http.disconnect":
            return None
        body += msg.get("body", b"")
        more = msg.get("more_body", False)
        if len(body) > max_body:
            raise BodyRefused(413, f"request body is larger than this server's limit of {max_body} bytes ({flag})")
    return bytes(body)


def body(*chunks, last_more=False):
    return [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1 or last_more}
            for i, c in enumerate(chunks)]


STALL = object()  # the client sends nothing more
CASES = {
    "one message": body(b'{"a":1}'),
    "empty": body(b""),
    "no body key": [{"type": "http.request", "more_body": False}],
    "exactly the cap": body(b"x" * CAP),
    "one over the cap in one message": body(b"x" * (CAP + 1)),
    "chunks": body(b'{"a"', b":", b"1}"),
    "chunks then an empty last": body(b'{"a":1}', b""),
    "an empty first chunk": body(b"", b'{"a":1}'),
    "over the cap across chunks": body(b"x" * 60, b"x" * 60),
    "a bytearray chunk": body(bytearray(b'{"a":1}')),
    "a memoryview chunk": body(memoryview(b'{"a":1}')),
    "disconnect first": [{"type": "http.disconnect"}],
    "disconnect mid-body": body(b'{"a"', last_more=True) + [{"type": "http.disconnect"}],
    "stall first": [STALL],
    "stall mid-body": body(b'{"a"', last_more=True) + [STALL],
}
HEADERS = {
    "json": {b"content-type": b"application/json"},
    "none (assumed json)": {},
    "text": {b"content-type": b"text/plain", b"content-length": b"7"},
    "announced over the cap": {b"content-type": b"application/json", b"content-length": str(CAP + 1).encode()},
}


async def outcome(read, headers, messages, assume_json=True):
    queue = list(messages)

    async def receive():
        msg = queue.pop(0)
        if msg is STALL:
            await asyncio.Event().wait()
        return msg

    try:
        got = await read(headers, receive, max_body=CAP, body_timeout=0.05, flag="--cap", assume_json=assume_json)
    except BodyRefused as e:
        return ("refused", e.status, str(e))
    return ("body", type(got).__name__, got)


@pytest.fixture(params=["asyncio.timeout", "wait_for"])
def timer(request, monkeypatch):
    if request.param == "wait_for":
        monkeypatch.setattr(limits, "_timeout", None)
    else:
        assert limits._timeout is not None, "Python 3.11+ has asyncio.timeout"
    return request.param


@pytest.mark.parametrize("headers", HEADERS, ids=list(HEADERS))
@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_read_body_answers_as_before(case, headers, timer):
    for assume_json in (True, False):
        got = asyncio.run(outcome(read_body, HEADERS[headers], CASES[case], assume_json))
        want = asyncio.run(outcome(reference, HEADERS[headers], CASES[case], assume_json))
        assert got == want


def test_a_body_in_one_message_is_not_copied():
    raw = b'{"a":' + b"1" * 50 + b"}"
    got = asyncio.run(read_body({}, _once(raw), max_body=CAP, body_timeout=1, flag="", assume_json=True))
    assert got is raw


def _once(raw):
    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}
    return receive


def test_break_it_a_fast_path_without_the_cap_lets_a_large_body_through(monkeypatch):
    """A one-message shortcut that forgot the cap would pass "one over the cap in one message"; the comparison above
    sees it."""
    real = limits.read_body

    async def no_cap(headers, receive, *, max_body, **kw):
        msg = await receive()
        if not msg.get("more_body") and msg["type"] == "http.request":
            return msg.get("body", b"")
        raise AssertionError("not reached in this check")

    got = asyncio.run(outcome(no_cap, HEADERS["json"], CASES["one over the cap in one message"]))
    want = asyncio.run(outcome(reference, HEADERS["json"], CASES["one over the cap in one message"]))
    assert got != want and want[:2] == ("refused", 413)
    assert asyncio.run(outcome(real, HEADERS["json"], CASES["one over the cap in one message"])) == want
