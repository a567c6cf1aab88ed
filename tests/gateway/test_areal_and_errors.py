"""AReaL's session API, checked field by field against AReaL's shapes (``areal/experimental/openai/proxy``:
``proxy_rollout_server.py``, ``server.py``; ``types.py`` ``to_tensor_dict``; ``infra/rpc/serialization.py``), and bad
input: each gets the provider's error shape with a message a person can act on, and the gateway keeps serving."""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from gw_helpers import TOOLS, Recording, agent_policy

from envhub.backends.base import LLMBackend
from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread
from envhub.gateway.areal import decode_tensor

ADMIN = "admin-key"


@pytest.fixture
def areal(tiny_tokenizer):
    backend = Recording(ScriptedBackend(agent_policy))
    gw = Gateway(backend, tiny_tokenizer)
    with GatewayThread(gw, token=ADMIN) as srv:
        yield srv, backend


def post(srv, path, body, key=None, **kw):
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(srv.url + path, json=body, headers=headers, timeout=30, **kw)


def tool_loop(srv, key, turns=4):
    messages = [{"role": "user", "content": "List files."}]
    ids = []
    for _ in range(turns):
        r = post(srv, "/chat/completions", {"model": "m", "messages": messages, "tools": TOOLS}, key).json()
        ids.append(r["id"])
        msg = r["choices"][0]["message"]
        messages.append(msg)
        for c in msg.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "a.txt"})
        if r["choices"][0]["finish_reason"] != "tool_calls":
            break
    return ids


@pytest.mark.parametrize("style", ["individual", "concat"])
def test_areal_session_grant_start_calls_reward_end_export(areal, style):
    srv, backend = areal
    assert post(srv, "/rl/start_session", {"task_id": "t"}, ADMIN).status_code == 429  # no capacity granted yet
    assert post(srv, "/grant_capacity", {}, ADMIN).json() == {"capacity": 1}
    started = post(srv, "/rl/start_session", {"task_id": "t", "api_key": None}, ADMIN).json()
    assert set(started) == {"session_id", "api_key"} and started["session_id"] == "t-0"
    assert post(srv, "/rl/start_session", {"task_id": "t"}, ADMIN).status_code == 429  # capacity spent
    key = started["api_key"]
    ids = tool_loop(srv, key)
    assert len(ids) == 4
    assert post(srv, "/rl/set_reward", {"interaction_id": ids[1], "reward": 0.5}, key).json() == {"message": "success"}
    assert post(srv, "/rl/set_reward", {"interaction_id": None, "reward": 1.0}, key).json() == {"message": "success"}
    assert post(srv, "/rl/set_reward", {"interaction_id": "nope", "reward": 1.0}, key).status_code == 400
    assert post(srv, "/rl/end_session", {}, key).json() == {"message": "success", "interaction_count": 4}
    assert post(srv, "/rl/end_session", {}, key).status_code == 410
    assert post(srv, "/export_trajectories", {"session_id": "t-0"}, key).status_code == 403  # needs the admin key
    out = post(srv, "/export_trajectories", {"session_id": "t-0", "discount": 0.9, "style": style}, ADMIN).json()
    inter = out["interactions"]
    rewards = {ids[3]: 1.0, ids[2]: 0.9, ids[1]: 0.5 + 0.81, ids[0]: 0.9 * (0.5 + 0.81)}  # r[i] += r[i+1] * 0.9
    assert list(inter) == (ids if style == "individual" else ids[-1:])
    for cid, item in inter.items():
        assert set(item) == {"tensor_dict", "reward", "interaction_id"} and item["interaction_id"] == cid
        assert item["reward"] == pytest.approx(rewards[cid])
        td = item["tensor_dict"]
        assert set(td) == {"input_ids", "loss_mask", "logprobs", "versions", "attention_mask", "rewards"}
        for name, dtype in [("input_ids", "torch.int64"), ("loss_mask", "torch.int64"), ("logprobs", "torch.float32"),
                            ("versions", "torch.int64"), ("attention_mask", "torch.bool"), ("rewards", "torch.float32")]:
            assert td[name]["type"] == "tensor" and td[name]["dtype"] == dtype
        t = {k: decode_tensor(v) for k, v in td.items()}
        n = t["input_ids"].shape[1]
        assert all(t[k].shape == (1, n) for k in ("loss_mask", "logprobs", "versions", "attention_mask"))
        assert t["rewards"].shape == (1,) and t["rewards"][0] == pytest.approx(rewards[cid])
        served = [(p, g) for p, g in backend.calls]
        idx = ids.index(cid)
        prompt, gen = served[idx]
        assert t["input_ids"][0].tolist() == prompt + gen.token_ids
        mask = t["loss_mask"][0].tolist()
        if style == "individual":  # the prompt is masked, the call's output trained
            assert mask == [0] * len(prompt) + [1] * len(gen.token_ids)
        else:  # the whole chain: every call's output trained, the rendered tool results between them not
            want = np.zeros(n, dtype=int)
            for p, g in served:
                want[len(p):len(p) + len(g.token_ids)] = 1
            assert mask == want.tolist()
        assert ((t["versions"][0] == -1) == (t["loss_mask"][0] == 0)).all()
        assert (t["logprobs"][0][t["loss_mask"][0] == 0] == 0).all()
    assert post(srv, "/export_trajectories", {"session_id": "t-0"}, ADMIN).status_code == 404  # exported: forgotten
    assert post(srv, "/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, key).status_code == 401


def test_areal_key_reuse_rules(areal):
    srv, _ = areal
    for _ in range(3):
        post(srv, "/grant_capacity", {}, ADMIN)
    assert post(srv, "/rl/start_session", {"task_id": "t", "api_key": "k1"}, ADMIN).json()["api_key"] == "k1"
    assert post(srv, "/rl/start_session", {"task_id": "t", "api_key": "k1"}, ADMIN).status_code == 409  # active
    assert post(srv, "/rl/start_session", {"task_id": "t", "api_key": ADMIN}, ADMIN).status_code == 400
    post(srv, "/rl/end_session", {}, "k1")
    again = post(srv, "/rl/start_session", {"task_id": "t", "api_key": "k1"}, ADMIN).json()  # ended: refresh
    assert again == {"session_id": "t-1", "api_key": "k1"}
    assert post(srv, "/grant_capacity", {}, "not-admin").status_code == 403


class Failing(LLMBackend):
    name = "failing"

    def __init__(self, inner):
        self.inner, self.fail = inner, False
        self.name = inner.name  # "scripted": the gateway hands it the conversation

    def open_session(self, sid, **kw):
        self.inner.open_session(sid, **kw)

    async def generate(self, prompt_ids, params, *, session_id=""):
        if self.fail:
            raise ConnectionError("engine at 10.0.0.7:8000 refused the connection")
        return await self.inner.generate(prompt_ids, params, session_id=session_id)


@pytest.fixture
def plain(tiny_tokenizer):
    backend = Failing(ScriptedBackend(agent_policy))
    gw = Gateway(backend, tiny_tokenizer, max_model_len=2048)
    with GatewayThread(gw, max_body_bytes=1 << 20) as srv:
        s = gw.start_session("bad")
        yield srv, s.api_key, backend, gw, s


OK = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("path,shape", [("/v1/chat/completions", "openai"), ("/v1/responses", "openai"),
                                        ("/v1/messages", "anthropic")])
def test_bad_input_gets_the_providers_error_shape(plain, path, shape):
    srv, key, *_ = plain
    h = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def err(r, status, words):
        assert r.status_code == status, r.text
        body = r.json()
        msg = body["error"]["message"]
        if shape == "anthropic":
            assert body["type"] == "error" and body["error"]["type"]
        else:
            assert set(body["error"]) == {"message", "type", "param", "code"}
        assert words in msg, msg
        return body

    err(httpx.post(srv.url + path, content=b"{not json", headers=h), 400, "not valid JSON")
    err(httpx.post(srv.url + path, content=b"[1, 2]", headers=h), 400, "JSON object")
    err(httpx.post(srv.url + path, json=OK, headers={"Authorization": "Bearer wrong"}), 401, "invalid or expired")
    err(httpx.post(srv.url + path, json=OK), 401, "no session key")
    err(httpx.post(srv.url + path, content=b"{" + b" " * (2 << 20) + b"}", headers=h), 413, "limit")
    if path.endswith("chat/completions"):
        err(httpx.post(srv.url + path, json={**OK, "n": 3}, headers=h), 400, "n=3 is not supported")
        err(httpx.post(srv.url + path, json={**OK, "tool_choice": "required", "tools": TOOLS}, headers=h), 400,
            "tool_choice")
        err(httpx.post(srv.url + path, json={**OK, "temperature": "hot"}, headers=h), 400, "temperature")
        err(httpx.post(srv.url + path, json={"messages": [{"role": "wizard", "content": "x"}]}, headers=h), 400,
            "role")
        body = err(httpx.post(srv.url + path, json={"messages": [{"role": "user", "content": "word " * 3000}]},
                              headers=h), 400, "maximum context length")
        assert body["error"]["code"] == "context_length_exceeded"
    if path.endswith("responses"):
        err(httpx.post(srv.url + path, json={"input": [{"type": "image_generation_call"}]}, headers=h), 400,
            "does not serve")
        err(httpx.post(srv.url + path, json={"input": "x", "previous_response_id": "resp_1"}, headers=h), 400,
            "previous_response_id")
    if path.endswith("messages"):
        err(httpx.post(srv.url + path, json=OK, headers=h), 400, "max_tokens")
        err(httpx.post(srv.url + path, json={**OK, "max_tokens": 10, "messages": [{"role": "user", "content": [
            {"type": "image", "source": {}}]}]}, headers=h), 400, "'image' block")
    # ...and the gateway still serves a good request on the same session
    good = {"chat/completions": OK, "responses": {"input": "hi"}, "messages": {**OK, "max_tokens": 50}}
    r = httpx.post(srv.url + path, json=good[path.split("/v1/")[1]], headers=h)
    assert r.status_code == 200, r.text


def test_backend_failure_mid_session_marks_it_and_the_gateway_keeps_serving(plain):
    from envhub.gateway import build

    srv, key, backend, gw, s = plain
    h = {"Authorization": f"Bearer {key}"}
    assert httpx.post(srv.url + "/v1/chat/completions", json={**OK, "tools": TOOLS}, headers=h).status_code == 200
    backend.fail = True
    r = httpx.post(srv.url + "/v1/chat/completions", json=OK, headers=h)
    assert r.status_code == 502 and "refused the connection" in r.json()["error"]["message"]
    r = httpx.post(srv.url + "/v1/messages", json={**OK, "max_tokens": 5}, headers=h)
    assert r.status_code == 502 and r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
    assert "upstream_failure" in s.flags
    trajs = build(s)  # the session ended on a failed call: kept, marked, never trained
    assert trajs and all(t.finish_reason == "error" and not any(t.loss_mask) for t in trajs)
    backend.fail = False
    s2 = gw.start_session("after")
    r = httpx.post(srv.url + "/v1/chat/completions", json=OK, headers={"Authorization": f"Bearer {s2.api_key}"})
    assert r.status_code == 200


def test_url_path_session_fallback_and_x_api_key(plain):
    srv, key, *_ = plain
    assert httpx.post(f"{srv.url}/s/{key}/v1/chat/completions", json=OK).status_code == 200
    r = httpx.post(srv.url + "/v1/messages", json={**OK, "max_tokens": 20}, headers={"x-api-key": key})
    assert r.status_code == 200 and r.json()["type"] == "message"


def test_cross_site_page_is_refused(plain):
    srv, key, *_ = plain
    r = httpx.post(srv.url + "/v1/chat/completions", json=OK, headers={"Authorization": f"Bearer {key}",
                                                                       "Origin": "https://evil.example"})
    assert r.status_code == 403


def test_mixed_policy_versions_are_flagged(plain):
    from envhub.gateway import build

    srv, key, backend, gw, s = plain
    h = {"Authorization": f"Bearer {key}"}
    msgs = [{"role": "user", "content": "List files."}]
    r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": msgs, "tools": TOOLS}, headers=h).json()
    httpx.post(srv.url + "/rl/set_version", json={"version": 7})
    msg = r["choices"][0]["message"]
    msgs += [msg, {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": "a"}]
    httpx.post(srv.url + "/v1/chat/completions", json={"messages": msgs, "tools": TOOLS}, headers=h)
    (t,) = build(s)
    assert "mixed_policy_versions" in t.details["flags"] and t.policy_version is None
    vs = t.details["versions"]
    assert set(vs) == {-1, 0, 7} and vs[-1] == 7
    assert json.loads(httpx.get(srv.url + f"/sessions/{s.session_id}").text)["chains"] == 1


def test_a_client_that_goes_away_mid_generation_leaves_no_trained_turn(tiny_tokenizer):
    """The backend is slow; the client times out and disconnects: the call is cancelled, marked, never trained."""
    import asyncio as aio

    from envhub.gateway import build

    class Slow(LLMBackend):
        name = "scripted"

        def __init__(self):
            self.inner, self.cancelled = ScriptedBackend(agent_policy), 0

        def open_session(self, sid, **kw):
            self.inner.open_session(sid, **kw)

        async def generate(self, prompt_ids, params, *, session_id=""):
            try:
                await aio.sleep(5)
            except aio.CancelledError:
                self.cancelled += 1
                raise
            return await self.inner.generate(prompt_ids, params, session_id=session_id)

    backend = Slow()
    gw = Gateway(backend, tiny_tokenizer)
    with GatewayThread(gw) as srv:
        s = gw.start_session("gone")
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/chat/completions", json=OK, headers={"Authorization": f"Bearer {s.api_key}"},
                       timeout=0.5)
        for _ in range(100):
            if backend.cancelled:
                break
            import time

            time.sleep(0.05)
    assert backend.cancelled == 1
    assert "aborted_call" in s.flags and s.calls[0].error
    assert build(s) == []  # no finished call: nothing to train on


@pytest.mark.slow
def test_a_client_varying_its_tools_does_not_grow_memory(plain):
    """Every call with another tool set would compile and keep another codec: the codecs shared per tokenizer (the
    gateway's, the executor's and the service's one cache) are a bounded set."""
    from envhub.codec.chat import _SHARED, MAX_SHARED

    srv, key, backend, gw, s = plain
    for i in range(MAX_SHARED + 5):
        tools = [{"type": "function", "function": {"name": f"tool_{i}", "description": "x", "parameters": {}}}]
        r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                              "tools": tools}, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200
    assert len(_SHARED[gw.tokenizer]) == MAX_SHARED
