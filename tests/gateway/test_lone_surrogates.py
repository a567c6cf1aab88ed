"""A lone UTF-16 surrogate (JSON ``"\\ud800"`` without its pair) parses into a Python string that no tokenizer can
encode. It is the client's mistake: every dialect answers its own 400 naming the field, before any backend call,
never a 500 from inside the tokenizer (which is what the gateway answered before)."""
from __future__ import annotations

import httpx
import pytest
from gw_helpers import Recording, agent_policy

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread, messages, toolskey

pytestmark = pytest.mark.timeout(120)

LONE = "\\ud800"  # as the client's JSON writes it
TOOL = {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}}

CASES = [  # route, raw JSON body, the field the error must name
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"hi %s there"}]}' % LONE, "messages[0].content"),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":[{"type":"text","text":"a%s"}]}]}' % LONE,
     "messages[0].content[0].text"),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"go"},{"role":"assistant","content":"",'
     '"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":{"cmd":"%s"}}}]},'
     '{"role":"tool","tool_call_id":"c1","content":"ok"}]}' % LONE, "messages[1].tool_calls"),
    ("/v1/chat/completions", '{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function",'
     '"function":{"name":"b%s","parameters":{}}}]}' % LONE, "tools"),
    ("/v1/responses", '{"input":[{"role":"user","content":[{"type":"input_text","text":"x%s"}]}]}' % LONE, None),
    ("/v1/messages", '{"max_tokens":5,"messages":[{"role":"user","content":"x%s"}]}' % LONE, None),
    ("/v1beta/models/m:generateContent", '{"contents":[{"role":"user","parts":[{"text":"x%s"}]}]}' % LONE, None),
]
IDS = ["chat-content", "chat-text-part", "chat-tool-call-arguments-object", "chat-tools", "responses", "anthropic", "gemini"]


@pytest.fixture(scope="module")
def served(tiny_tokenizer):
    backend = Recording(ScriptedBackend(agent_policy))
    gw = Gateway(backend, tiny_tokenizer)
    with GatewayThread(gw) as srv:
        yield gw, srv, backend


def post(gw, srv, route, raw):
    s = gw.start_session("surrogate")
    h = {"Authorization": f"Bearer {s.api_key}", "x-api-key": s.api_key, "x-goog-api-key": s.api_key,
         "Content-Type": "application/json"}
    r = httpx.post(srv.url + route, content=raw.encode(), headers=h, timeout=30)
    gw.drop_session(s)
    return r


@pytest.mark.parametrize("route,raw,where", CASES, ids=IDS)
def test_a_lone_surrogate_is_the_clients_400_naming_the_field(served, route, raw, where):
    gw, srv, backend = served
    before = len(backend.calls)
    r = post(gw, srv, route, raw)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert "lone UTF-16 surrogate" in message, message
    if where is not None:
        assert message.startswith(where + " "), message
    assert len(backend.calls) == before  # refused before any generation


def test_a_surrogate_pair_is_one_character_and_served(served):
    gw, srv, _ = served
    r = post(gw, srv, "/v1/chat/completions", '{"messages":[{"role":"user","content":"\\ud83d\\ude00 hi"}]}')
    assert r.status_code == 200, r.text


def test_arguments_text_escaping_a_lone_surrogate_is_rendered_as_written(served):
    """Arguments sent as a JSON *string* (as OpenAI sends them, and as a model may write ``"\\ud800"``) are valid text;
    only their parse holds the lone surrogate. The render keeps them as written, as it keeps invalid JSON: the call is
    served, where the tokenizer failed it with a 500 before (an agent re-sending that history would fail forever)."""
    gw, srv, _ = served
    raw = ('{"messages":[{"role":"user","content":"go"},{"role":"assistant","content":"","tool_calls":[{"id":"c1",'
           '"type":"function","function":{"name":"bash","arguments":"{\\"cmd\\":\\"\\\\ud800\\"}"}}]},'
           '{"role":"tool","tool_call_id":"c1","content":"ok"}]}')
    assert "\\\\ud800" in raw  # the arguments' own JSON escape, inside the body's JSON string
    r = post(gw, srv, "/v1/chat/completions", raw)
    assert r.status_code == 200, r.text


def test_break_it_without_the_check_the_tokenizer_fails_the_call(served, monkeypatch):
    gw, srv, _ = served
    monkeypatch.setattr(messages, "unicode_text", lambda text, where: text)
    monkeypatch.setattr(toolskey, "unicode_text", lambda text, where: text)
    r = post(gw, srv, *CASES[0][:2])
    assert r.status_code != 400 or "lone UTF-16 surrogate" not in r.text


def test_break_it_a_render_that_parses_every_argument_text_fails_the_call(served, monkeypatch):
    import json

    from envhub.codec import messages as codec_messages

    gw, srv, _ = served
    monkeypatch.setattr(codec_messages, "_json_args", lambda text: json.loads(text) if text.strip() else {})
    raw = ('{"messages":[{"role":"user","content":"go"},{"role":"assistant","content":"","tool_calls":[{"id":"c2",'
           '"type":"function","function":{"name":"bash","arguments":"{\\"cmd\\":\\"\\\\ud800\\"}"}}]},'
           '{"role":"tool","tool_call_id":"c2","content":"ok"}]}')
    assert post(gw, srv, "/v1/chat/completions", raw).status_code == 500
