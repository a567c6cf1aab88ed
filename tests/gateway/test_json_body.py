"""The request body's JSON is parsed by ``pydantic_core.from_json`` first and by ``json.loads`` on any error
(:func:`envhub.gateway.app.parse_json`, #28 item 10): every body must be accepted or refused exactly as
``json.loads(raw, parse_constant=_not_json)`` did, same value (key order included), same error, same HTTP reply."""
from __future__ import annotations

import json

import httpx
import pytest
from gw_helpers import agent_policy

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread
from envhub.gateway import app as app_mod

pytestmark = pytest.mark.timeout(120)

# where the two parsers differ (from_json refuses, json.loads reads or refuses in its own words) and where they agree
BODIES = [
    b'{"x":"\\ud800"}', b'{"\\ud800":1}', b'{"x":"\\udfff\\ud800"}', b'{"x":"\xed\xa0\x80"}',  # lone surrogates
    b'\xef\xbb\xbf{"x":1}', '{"x":"\u00e9"}'.encode("utf-16"),  # a BOM; UTF-16 (json.loads detects it)
    b'{"x":[' + b"[" * 300 + b"]" * 300 + b"]}",  # deeper than from_json's 200
    b'{"x":NaN}', b'{"x":Infinity}', b'{"x":-Infinity}', b'{"x":nan}',  # refused by _not_json / by both
    b'{"a":1,"b":2,"a":3}', b'{"z":1,"a":{"y":1,"b":2}}', b'{"x":12345678901234567890123456789}', b'{"x":1e400}',
    b'{"x":-0}', b'{"x":-0.0}', b'{"x":5e-324}', b'{"x":0.30000000000000004}', b'{"x":"a\\u0000b\\/"}',
    b' \t\r\n{"x":[true,null,false]}\n', b'[1]', b'"s"',
    b'{"x":1} x', b'{"x":[1,]}', b'{"x":"a\tb"}', b'{"x":"\xff"}', b"{'x':1}", b'{"x":01}', b'{"x":.5}',
]


def _reference(raw: bytes):
    return json.loads(raw, parse_constant=app_mod._not_json)


def _outcome(parse, raw: bytes):
    """What ``parse`` makes of ``raw``: the value and its key order, or the error's type and message."""
    try:
        value = parse(raw)
    except Exception as e:  # noqa: BLE001 -- the outcome compared, whatever it is
        return ("error", type(e).__name__, str(e))
    return ("value", repr(value), json.dumps(value) if not isinstance(value, float) else repr(value))


@pytest.mark.parametrize("raw", BODIES, ids=range(len(BODIES)))
def test_the_fast_parse_is_json_loads(raw):
    assert _outcome(app_mod.parse_json, raw) == _outcome(_reference, raw)


def test_the_fast_parser_is_really_used_and_really_refuses_these():
    """The bodies above exercise both paths: from_json reads the plain ones and refuses the surrogate ones."""
    fast = app_mod._pydantic_core
    assert fast is not None, "pydantic_core is installed with the serve extra"
    assert fast.from_json(b'{"a":1,"b":[2]}', allow_inf_nan=False) == {"a": 1, "b": [2]}
    for raw in BODIES[:7]:
        with pytest.raises(ValueError):
            fast.from_json(raw, allow_inf_nan=False)
        assert _outcome(_reference, raw)[0] == "value"  # ...which json.loads reads


def test_break_it_from_json_without_the_fallback_changes_what_is_accepted():
    def no_fallback(raw: bytes):
        return app_mod._pydantic_core.from_json(raw, allow_inf_nan=False)

    differ = [raw for raw in BODIES if _outcome(no_fallback, raw) != _outcome(_reference, raw)]
    assert b'{"x":"\\ud800"}' in differ and b'{"x":NaN}' in differ  # the check above would fail on these


@pytest.fixture
def gateway(tiny_tokenizer):
    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    with GatewayThread(gw) as srv:
        yield gw, srv


def _replies(gw, srv, bodies):
    """Status and reply of a chat call and of /rl/set_reward for each body (a fresh session each)."""
    out = []
    for raw in bodies:
        s = gw.start_session("json")
        h = {"Authorization": f"Bearer {s.api_key}", "Content-Type": "application/json"}
        r = httpx.post(srv.url + "/v1/chat/completions", content=raw, headers=h)
        w = httpx.post(srv.url + "/rl/set_reward", content=raw.replace(b'"messages"', b'"reward"'), headers=h)
        out.append((r.status_code, r.json().get("error"), r.json().get("choices", [{}])[0].get("message"),
                    w.status_code, w.text))
        gw.drop_session(s)
    return out


HTTP_BODIES = [b'{"messages":[{"role":"user","content":"hi \\ud800 there"}]}',  # lone surrogate in a message
               b'{"messages":[{"role":"user","content":"\\ud83d\\ude00 hi"}]}',  # a pair: one character
               b'{"messages":[{"role":"user","content":"hi"}],"temperature":NaN}',
               b'{"messages":1.5}', b'{"messages":[{"role":"user","content":"hi"}]} trailing']


@pytest.mark.slow
def test_over_http_every_reply_is_what_json_loads_gave(gateway, monkeypatch):
    gw, srv = gateway
    fast = _replies(gw, srv, HTTP_BODIES)
    monkeypatch.setattr(app_mod, "_pydantic_core", None)  # the old parse: json.loads only
    assert _replies(gw, srv, HTTP_BODIES) == fast
    # the lone surrogate parses (both ways), then is the client's 400 (tests/gateway/test_lone_surrogates.py)
    assert fast[0][0] == 400 and "lone UTF-16 surrogate" in fast[0][1]["message"]
    assert fast[1][0] == 200 and fast[2][0] == 400 and "not a JSON value" in fast[2][1]["message"]
    assert [r[0] for r in fast[3:]] == [400, 400]
