"""Every accepted input is used or refused, and a prompt over the context is the provider's context error before any
backend call (#28, items 4 and 5), checked with the real openai and anthropic SDKs where the tests use them."""
from __future__ import annotations

import math

import httpx
import pytest
from gw_helpers import Recording, agent_policy

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")


class WithContext(Recording):
    """A backend that knows its own context length, as ``HFBackend`` does (``max_context``: the model's
    ``max_position_embeddings``); the tiny model's is 4,096."""

    def __init__(self, inner, max_context: int):
        super().__init__(inner)
        self.max_context = max_context


@pytest.fixture
def small(tiny_tokenizer):
    backend = WithContext(ScriptedBackend(agent_policy), 512)
    gw = Gateway(backend, tiny_tokenizer, max_model_len=32768)  # the flag's default: larger than the backend's
    with GatewayThread(gw) as srv:
        yield gw, srv, backend


LONG = "word " * 2000


def test_the_limit_is_the_smaller_of_the_flag_and_the_backends_context(tiny_tokenizer, tiny_model_path):
    from envhub.backends.hf import HFBackend

    hf = HFBackend(tiny_model_path)
    assert hf.max_context == 4096
    assert Gateway(hf, tiny_tokenizer, max_model_len=32768).max_model_len == 4096
    assert Gateway(hf, tiny_tokenizer, max_model_len=1000).max_model_len == 1000
    assert Gateway(ScriptedBackend(agent_policy), tiny_tokenizer, max_model_len=32768).max_model_len == 32768


def test_openai_sdk_gets_context_length_exceeded_before_any_backend_call(small):
    gw, srv, backend = small
    s = gw.start_session("long")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=s.api_key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": LONG}])
    assert e.value.code == "context_length_exceeded" and e.value.body["type"] == "invalid_request_error"
    assert "maximum context length is 512 tokens" in e.value.message
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model="m", input=LONG)
    assert e.value.code == "context_length_exceeded"
    assert backend.calls == []  # never reached the backend
    ok = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert ok.choices[0].message.content and len(backend.calls) == 1


def test_anthropic_sdk_gets_anthropics_prompt_too_long_before_any_backend_call(small):
    gw, srv, backend = small
    s = gw.start_session("long")
    client = anthropic.Anthropic(base_url=srv.url, api_key=s.api_key, max_retries=0)
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": LONG}])
    err = e.value.body["error"]
    assert e.value.body["type"] == "error" and err["type"] == "invalid_request_error"
    assert err["message"].startswith("prompt is too long: ") and err["message"].endswith("> 512 maximum")
    assert backend.calls == []


IMAGE_URL = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}


@pytest.mark.parametrize("route,body,where", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                                                         IMAGE_URL]}]}, "messages[0].content[1]"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"},
                                           {"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
     "messages[2].content[0]"),
    ("/v1/responses", {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "what is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]}, "input[0].content[1]"),
    ("/v1/responses", {"input": [{"type": "function_call_output", "call_id": "c", "output": [
        {"type": "input_file", "file_id": "f"}]}]}, "input[0].output[0]"),
    ("/v1/messages", {"max_tokens": 5, "messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "shot:"}, {"type": "image", "source": {"type": "base64", "data": "x"}}]}]}]},
     "messages[2].content[0].content[1]"),
], ids=["chat-image", "chat-audio", "responses-image", "responses-file-output", "anthropic-tool-result-image"])
def test_non_text_input_is_refused_with_the_providers_error_never_dropped(small, route, body, where):
    gw, srv, backend = small
    s = gw.start_session("img")
    r = httpx.post(srv.url + route, json=body, headers={"Authorization": f"Bearer {s.api_key}"})
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert where in msg and "text only" in msg, msg
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert backend.calls == []


def test_the_openai_sdk_sees_the_image_refused(small):
    gw, srv, _ = small
    s = gw.start_session("img")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=s.api_key, max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this?"}, IMAGE_URL]}])
    assert e.value.param == "messages[0].content[1]"


@pytest.mark.parametrize("raw", [b'{"reward": NaN}', b'{"reward": Infinity}', b'{"reward": -Infinity}'])
def test_set_reward_refuses_non_finite_numbers_and_the_export_stays_json(small, raw):
    gw, srv, _ = small
    s = gw.start_session("nan")
    h = {"Authorization": f"Bearer {s.api_key}", "Content-Type": "application/json"}
    assert httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]},
                      headers=h).status_code == 200
    r = httpx.post(srv.url + "/rl/set_reward", content=raw, headers=h)
    assert r.status_code == 400 and "not a JSON value" in r.json()["error"]["message"], r.text
    with pytest.raises(ValueError, match="finite"):
        gw.set_reward(s, math.nan)  # the Python API refuses it too
    assert all(c.reward is None for c in s.calls)
    gw.end_session(s)
    out = httpx.post(srv.url + "/export_trajectories", json={"session_id": s.session_id})
    assert out.status_code == 200 and out.json()["interactions"]  # strict JSON (httpx's json would choke on NaN)


def test_without_the_backends_context_the_long_prompt_reaches_the_backend(tiny_tokenizer, monkeypatch):
    """Break the fix on purpose (the gateway ignores the backend's context): the over-long prompt is sent to the
    backend, which is the 502-and-retry path the fix removes."""
    from envhub.gateway import context

    monkeypatch.setattr(context, "backend_context", lambda backend: None)
    backend = WithContext(ScriptedBackend(agent_policy), 512)
    gw = Gateway(backend, tiny_tokenizer, max_model_len=32768)
    assert gw.max_model_len == 32768
    with GatewayThread(gw) as srv:
        s = gw.start_session("long")
        r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": LONG}]},
                       headers={"Authorization": f"Bearer {s.api_key}"})
    assert len(backend.calls) == 1 and len(backend.calls[0][0]) > 512, r.text
