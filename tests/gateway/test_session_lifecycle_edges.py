"""Session edges found by reading the gateway (#28): a key taken over by a new session stays bound when the old
session is dropped; a conversation the template cannot render is a 400 on ``count_tokens`` as on a call; ending a
session from another thread wakes an export waiting on the gateway's loop, safely."""
from __future__ import annotations

import asyncio
import threading

import httpx
import pytest
from gw_helpers import agent_policy

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import BadRequest, Gateway, GatewayThread
from envhub.gateway import core as gateway_core

TOOLS = [{"type": "function", "function": {"name": "bash", "description": "run",
                                           "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]


@pytest.mark.timeout(60)
def test_dropping_an_ended_session_leaves_its_key_with_the_session_that_took_it_over(tiny_tokenizer):
    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    old = gw.start_session("t", api_key="k-1")
    gw.end_session(old)
    new = gw.start_session("t", api_key="k-1")  # an ended session's key is taken over
    gw.drop_session(old)
    assert gw.session_for_key("k-1") is new
    gw.drop_session(new)
    assert gw.session_for_key("k-1") is None


@pytest.mark.timeout(60)
def test_count_tokens_refuses_an_unrenderable_conversation_with_a_400(llama3_tokenizer):
    gw = Gateway(ScriptedBackend(agent_policy), llama3_tokenizer)
    body = {"model": "m", "max_tokens": 5, "tools": [{"name": "bash", "description": "run", "input_schema":
                                                      TOOLS[0]["function"]["parameters"]}],
            # two tool calls in one assistant turn: Llama-3.1's template renders one call per turn, and raises
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": [
                             {"type": "tool_use", "id": "a", "name": "bash", "input": {"cmd": "ls"}},
                             {"type": "tool_use", "id": "b", "name": "bash", "input": {"cmd": "pwd"}}]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": "a", "content": "x"},
                             {"type": "tool_result", "tool_use_id": "b", "content": "y"}]}]}
    with GatewayThread(gw, token="admin") as srv:
        s = gw.start_session("t")
        r = httpx.post(srv.url + "/v1/messages/count_tokens", json=body, headers={"x-api-key": s.api_key},
                       timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error" and "chat template" in r.text


@pytest.mark.timeout(60)
def test_ending_a_session_from_another_thread_wakes_the_waiter_on_its_loop(tiny_tokenizer):
    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    s = gw.start_session("t")
    loop = asyncio.new_event_loop()
    loop.set_debug(True)  # asyncio then refuses a future completed from the wrong thread, instead of waking late
    waiting, woke = threading.Event(), []

    async def wait_for_end():
        waiting.set()
        await asyncio.wait_for(s.ended_event.wait(), 20)
        woke.append(True)

    t = threading.Thread(target=loop.run_until_complete, args=(wait_for_end(),))
    t.start()
    try:
        assert waiting.wait(10)
        while not getattr(s.ended_event, "_waiters", None):
            threading.Event().wait(0.01)
        gw.end_session(s)  # from this thread, not the loop's
        t.join(25)
        assert woke == [True]
    finally:
        t.join(25)
        loop.close()


@pytest.mark.timeout(60)
def test_setting_the_event_directly_from_another_thread_is_what_the_guard_prevents(tiny_tokenizer, monkeypatch):
    """Break-it: with the thread-safe set replaced by a plain ``set()``, asyncio (debug mode) refuses the call."""
    monkeypatch.setattr(gateway_core, "_set_from_any_thread", lambda ev: ev.set())
    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    s = gw.start_session("t")
    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    parked = threading.Event()

    async def wait_for_end():
        parked.set()
        await s.ended_event.wait()

    def run():
        try:
            loop.run_until_complete(wait_for_end())
        except RuntimeError:  # stopped below: the waiter's wake-up was lost, it would wait forever
            pass

    t = threading.Thread(target=run)
    t.start()
    try:
        assert parked.wait(10)
        while not getattr(s.ended_event, "_waiters", None):
            threading.Event().wait(0.01)
        with pytest.raises(RuntimeError, match="thread"):
            gw.end_session(s)
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(10)
        loop.close()


@pytest.mark.timeout(60)
def test_a_reward_on_a_call_that_failed_is_refused_not_silently_lost(tiny_tokenizer):
    from test_areal_and_errors import Failing

    backend = Failing(ScriptedBackend(agent_policy))
    gw = Gateway(backend, tiny_tokenizer)
    with GatewayThread(gw, token="admin") as srv:
        s = gw.start_session("t")
        h = {"Authorization": f"Bearer {s.api_key}"}
        body = {"messages": [{"role": "user", "content": "hi"}]}
        ok = httpx.post(srv.url + "/v1/chat/completions", json=body, headers=h, timeout=30)
        backend.fail = True
        bad = httpx.post(srv.url + "/v1/chat/completions", json=body, headers=h, timeout=30)
    assert ok.status_code == 200 and bad.status_code == 502
    failed = next(c for c in s.calls if not c.ok)
    with pytest.raises(BadRequest, match="did not finish"):
        gw.set_reward(s, 1.0, call_id=failed.call_id)
    assert gw.set_reward(s, 1.0, call_id=ok.json()["id"]).reward == 1.0  # a finished call takes it
