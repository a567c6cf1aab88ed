"""#28 item 10 (continued): the AReaL export is sent as the pieces it is built from (never joined into one 6 MB body),
and a spliced call's record says which prefix it extends, so the export does not compare it again. What an AReaL
client receives must not change by a byte: every check compares with ``json.dumps`` of the reference construction.
Real gateway over loopback HTTP, the tiny model's tokenizer, the scripted backend."""
from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest
from test_export_encoding import TOOLS, always_a_tool, reference

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread, areal, asgi
from envhub.gateway.core import ChatRequest

LONG = "".join(f"line {j}: value = compute(value, {j})  # a long tool output\n" for j in range(400))


def long_session(tokenizer, calls: int = 4):
    """A chain of ``calls`` calls on a context of several thousand tokens: its constant runs and its first
    ``input_ids`` chunk are over :data:`asgi.SMALL_PIECE`, so the export has pieces sent on their own."""
    gw = Gateway(ScriptedBackend(always_a_tool), tokenizer)

    async def play():
        s = gw.start_session("t")
        msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": LONG}]
        for _ in range(calls):
            r = await gw.complete(s, ChatRequest("chat", [dict(m) for m in msgs], tools=TOOLS))
            msgs.append(dict(r.call.reply))
            msgs += [{"role": "tool", "tool_call_id": c["id"], "content": LONG[:2000]} for c in r.tool_calls]
        gw.set_reward(s, 1.0)
        return s

    return gw, asyncio.run(play())


def sent_messages(payload) -> list[dict]:
    """The ASGI messages :func:`asgi._send` sends for ``payload``."""
    out: list[dict] = []

    async def send(message):
        out.append(message)

    asyncio.run(asgi._send(send, 200, payload))
    return out


@pytest.mark.timeout(120)
def test_the_pieces_are_sent_unjoined_and_are_the_reference_bytes(tiny_tokenizer):
    """Several body messages, the large pieces among them as they are, ``more_body`` on all but the last, the
    Content-Length their total; their concatenation is the reference bytes."""
    _, s = long_session(tiny_tokenizer)
    pieces = areal.export_pieces(s, discount=0.9)
    big = [p for p in pieces if memoryview(p).nbytes >= asgi.SMALL_PIECE]
    assert len(big) >= 4
    msgs = sent_messages(asgi.Pieces(pieces))
    start, bodies = msgs[0], msgs[1:]
    assert len(bodies) > 2 and [m["more_body"] for m in bodies] == [True] * (len(bodies) - 1) + [False]
    assert all(any(m["body"] is p for m in bodies) for p in big)  # sent as they are, not copied
    body = b"".join(bytes(m["body"]) for m in bodies)
    assert body == reference(s, 0.9)
    assert dict(start["headers"])[b"content-length"] == str(len(body)).encode()
    # a dict or bytes payload is one message, as before
    assert [m.get("more_body") for m in sent_messages({"a": 1})[1:]] == [False]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("protocol", ["httptools", "h11"])
def test_an_areal_client_receives_the_reference_bytes_over_http(tiny_tokenizer, protocol, monkeypatch):
    """Over loopback HTTP, on either protocol the gateway serves with, the export of a long session (many body
    messages) is byte for byte ``json.dumps`` of the reference, and the session is gone after it."""
    monkeypatch.setenv("ENVHUB_GATEWAY_HTTP", protocol)
    gw, s = long_session(tiny_tokenizer)
    want = reference(s, 0.9)
    assert len(asgi.body_messages(areal.export_pieces(s, discount=0.9))) > 2
    gw.end_session(s)
    with GatewayThread(gw) as srv:
        r = httpx.post(srv.url + "/export_trajectories", json={"session_id": s.session_id, "discount": 0.9},
                       timeout=60)
    assert r.status_code == 200 and r.content == want
    assert r.headers["content-length"] == str(len(want)) and s.session_id not in gw.sessions


@pytest.mark.timeout(180)
def test_break_it_a_lost_piece_changes_what_the_client_receives(tiny_tokenizer, monkeypatch):
    """The HTTP check has teeth: a sender that leaves out one large piece delivers other bytes."""
    real = asgi.body_messages

    def lossy(pieces):
        out = real(pieces)
        return out[:2] + out[3:]

    monkeypatch.setattr(asgi, "body_messages", lossy)
    gw, s = long_session(tiny_tokenizer)
    want = reference(s)
    gw.end_session(s)
    with GatewayThread(gw) as srv:
        r = httpx.post(srv.url + "/export_trajectories", json={"session_id": s.session_id}, timeout=60)
    assert r.status_code == 200 and r.content != want


@pytest.mark.timeout(120)
def test_a_spliced_record_says_what_it_extends(tiny_tokenizer):
    """Every spliced call holds its parent's own prompt and sampled lists, and its prompt starts with them; a chain's
    first call holds nothing."""
    _, s = long_session(tiny_tokenizer)
    assert s.calls[0].spliced_from is None
    for c in s.calls[1:]:
        parent = s.by_id[c.parent]
        assert c.spliced_from[0] is parent.prompt_ids and c.spliced_from[1] is parent.sampled_ids
        assert c.prompt_ids[:len(parent.prompt_ids) + len(parent.sampled_ids)] == parent.prompt_ids + parent.sampled_ids


def altered(s, i: int, **kw):
    """Call ``i`` of ``s`` replaced by a copy whose prompt's first id is changed (``kw``: other fields)."""
    old = s.calls[i]
    new = dataclasses.replace(old, prompt_ids=[7] + old.prompt_ids[1:], **kw)
    s.calls[i] = s.by_id[old.call_id] = new
    return new


@pytest.mark.timeout(120)
def test_a_record_without_the_mark_is_still_compared(tiny_tokenizer):
    """A record put together by hand (no ``spliced_from``) whose prompt does not extend its parent's is encoded from
    scratch, and so is its child, whose mark names lists its (replaced) parent no longer holds: the bytes are still
    the reference's."""
    _, s = long_session(tiny_tokenizer)
    changed = altered(s, 2, spliced_from=None)
    assert not areal._extends(changed, s.by_id[changed.parent]) and not areal._extends(s.calls[3], changed)
    assert areal.export_json(s) == reference(s)


@pytest.mark.timeout(120)
def test_break_it_the_export_trusts_the_mark(tiny_tokenizer):
    """The mark is what the export reads instead of comparing: the same hand-made record still holding its parent's
    lists gets the parent's encoding, and the bytes differ from the reference (so only the splice may set it, as
    ``CallServing.complete`` does)."""
    _, s = long_session(tiny_tokenizer)
    changed = altered(s, 2)
    assert areal._extends(changed, s.by_id[changed.parent])
    assert areal.export_json(s) != reference(s)
