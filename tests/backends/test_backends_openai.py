"""The openai backend over real HTTP on loopback.

The server here is the named stand-in of standin_server.py (vLLM's and SGLang's reply shapes, tokens from the hf
backend on the tiny model). The real vLLM check is test_backends_vllm.py (``make test-vllm``).
"""
from __future__ import annotations

import asyncio
import socket

import pytest

from envhub.backends import make_backend
from envhub.backends.base import BackendError, SamplingParams
from envhub.backends.openai import OpenAIBackend
from envhub.backends.pool import BackendPool
from standin_server import StandIn

PROMPT = [100, 200, 300, 400, 500, 12]


@pytest.fixture
async def server(hf):
    s = await StandIn(hf).start()
    yield s
    await s.stop()


def dead_url() -> str:
    """A loopback port with nothing listening (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_completions_match_the_hf_backend_exactly(server, hf):
    backend = OpenAIBackend(server.url)  # model=None: asks /v1/models
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=7, extra={"ignore_eos": True})
    gen = await backend.generate(PROMPT, params, session_id="s")
    ref = await hf.generate(PROMPT, params)
    assert gen.token_ids == ref.token_ids and gen.logprobs == ref.logprobs and gen.finish_reason == "length"
    assert backend.model == "tiny"
    body = server.bodies[-1]
    assert body["prompt"] == PROMPT and body["return_token_ids"] is True and body["logprobs"] == 0
    assert body["seed"] == 7 and body["ignore_eos"] is True
    await backend.close()


async def test_connection_is_reused_across_turns(server):
    backend = OpenAIBackend(server.url, model="tiny")
    for _ in range(4):
        await backend.generate(PROMPT, SamplingParams(max_tokens=2, temperature=0))
    assert len(set(server.peers)) == 1, server.peers  # one keep-alive connection served every turn
    await backend.close()


async def test_a_connection_idle_past_the_expiry_is_not_reused(server, monkeypatch):
    """A keep-alive connection is dropped by the client before the server's own keep-alive timeout can close it
    under a request (vLLM's uvicorn: 5 s; httpx's default expiry is also 5 s, and a request crossing the server's
    close fails "Server disconnected without sending a response", seen in the vLLM tier). Here the expiry is
    shortened to keep the test fast; the shipped value must stay under uvicorn's 5 s."""
    import envhub.backends.openai as openai_backend

    assert openai_backend.KEEPALIVE_EXPIRY_S < 5.0
    monkeypatch.setattr(openai_backend, "KEEPALIVE_EXPIRY_S", 0.3)
    backend = OpenAIBackend(server.url, model="tiny")
    params = SamplingParams(max_tokens=2, temperature=0)
    await backend.generate(PROMPT, params)
    await backend.generate(PROMPT, params)  # at once: the same connection (test_connection_is_reused_across_turns)
    await asyncio.sleep(0.6)
    await backend.generate(PROMPT, params)  # idle past the expiry: a new one
    assert server.peers[0] == server.peers[1] != server.peers[2], server.peers
    await backend.close()


async def test_stop_string_tokens_are_kept_even_though_text_is_cut(server, hf):
    free = await hf.generate(PROMPT, SamplingParams(max_tokens=12, temperature=1.0, seed=2, extra={"ignore_eos": True}))
    stop = hf.tokenizer.decode(free.token_ids[4:6])
    backend = OpenAIBackend(server.url, model="tiny")
    gen = await backend.generate(PROMPT, SamplingParams(max_tokens=12, temperature=1.0, seed=2, stop=[stop],
                                                        extra={"ignore_eos": True}))
    assert gen.finish_reason == "stop" and gen.token_ids == free.token_ids[: len(gen.token_ids)]
    assert stop in hf.tokenizer.decode(gen.token_ids)
    await backend.close()


async def test_sglang_generate(server, hf):
    backend = make_backend(f"sglang+{server.url}")
    assert backend.api == "sglang"
    params = SamplingParams(max_tokens=6, temperature=0)
    gen = await backend.generate(PROMPT, params)
    ref = await hf.generate(PROMPT, params)
    assert gen.token_ids == ref.token_ids and gen.logprobs == ref.logprobs
    body = server.bodies[-1]
    assert body["input_ids"] == PROMPT and body["return_logprob"] is True
    assert body["sampling_params"]["max_new_tokens"] == 6
    await backend.close()


async def test_server_errors_carry_the_server_message(server):
    backend = OpenAIBackend(server.url, model="no-such-model")
    with pytest.raises(BackendError, match=r"HTTP 404: The model `no-such-model` does not exist"):
        await backend.generate(PROMPT, SamplingParams(max_tokens=2))
    backend.model = "tiny"
    with pytest.raises(BackendError, match="HTTP 400: .*vocabulary"):
        await backend.generate([10**7], SamplingParams(max_tokens=2))
    server.fail_status = 503
    with pytest.raises(BackendError, match="HTTP 503: The engine is overloaded"):
        await backend.generate(PROMPT, SamplingParams(max_tokens=2))
    await backend.close()


async def test_a_changed_prompt_is_refused(server):
    server.mutate_prompt = True
    backend = OpenAIBackend(server.url, model="tiny")
    with pytest.raises(BackendError, match="changed the prompt ids"):
        await backend.generate(PROMPT, SamplingParams(max_tokens=2))
    await backend.close()


async def test_unreachable_and_slow_servers(server):
    with pytest.raises(BackendError, match="cannot reach"):
        await OpenAIBackend(dead_url(), model="tiny").generate(PROMPT, SamplingParams(max_tokens=2))
    server.delay_s = 1.0
    slow = OpenAIBackend(server.url, model="tiny", timeout=0.2)
    with pytest.raises(BackendError, match="timed out"):
        await slow.generate(PROMPT, SamplingParams(max_tokens=2))
    await slow.close()


async def test_pool_fails_over_from_a_dead_server_to_a_live_one(server, hf):
    dead = OpenAIBackend(dead_url(), model="tiny")
    live = OpenAIBackend(server.url, model="tiny")
    pool = BackendPool({"dead": dead, "live": live}, revive_after=None)
    sids = [f"r{i}" for i in range(6)]
    for sid in sids:
        pool.open_session(sid)
    assert {pool.assignment(s) for s in sids} == {"dead", "live"}
    params = SamplingParams(max_tokens=4, temperature=0)
    gens = await asyncio.gather(*(pool.generate(PROMPT, params, session_id=s) for s in sids))
    ref = await hf.generate(PROMPT, params)
    assert all(g.token_ids == ref.token_ids for g in gens)  # every rollout finished its turn, on the live server
    assert {pool.assignment(s) for s in sids} == {"live"}
    status = {b["name"]: b for b in pool.status()["backends"]}
    assert status["dead"]["healthy"] is False and "cannot reach" in status["dead"]["last_error"]
    await pool.close()


def test_make_backend_specs(tiny_dir):
    from envhub.backends.hf import HFBackend
    from envhub.backends.scripted import ScriptedBackend

    assert isinstance(make_backend("golden", policy=lambda task, messages: "x"), ScriptedBackend)
    with pytest.raises(ValueError, match="policy"):
        make_backend("golden")
    b = make_backend("http://127.0.0.1:9/v1")
    assert isinstance(b, OpenAIBackend) and b.base_url == "http://127.0.0.1:9" and b.api == "completions"
    pool = make_backend("http://127.0.0.1:9, http://127.0.0.1:10")
    assert isinstance(pool, BackendPool) and len(pool.backends) == 2
    assert isinstance(make_backend(str(tiny_dir), num_threads=1), HFBackend)
    with pytest.raises(FileNotFoundError):
        make_backend("/no/such/model")
    with pytest.raises(ValueError, match="api"):
        OpenAIBackend("http://x", api="grpc")
