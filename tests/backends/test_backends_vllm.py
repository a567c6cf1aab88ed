"""The ``vllm`` tier (``make test-vllm``): the openai and vllm backends against real vLLM (CPU build).

A real ``vllm.entrypoints.openai.api_server`` runs from ``.venv-vllm`` (``scripts/setup-vllm.sh``) on loopback with
the tiny model in fp32; the tests run here in ``.venv`` and talk HTTP to it. They check what a trainer relies on:
the prompt ids are echoed unchanged, the sampled ids and one logprob per id come back (EOS and stop-string tokens
included), and the logprobs are the same numbers the ``hf`` backend computes, within 1e-4. The in-process
``VLLMBackend`` is checked the same way in a subprocess of ``.venv-vllm``.

They run only when asked: ``ENVHUB_REQUIRE_VLLM=1`` (set by ``make test-vllm``; a missing ``.venv-vllm`` is then a
failure) or ``pytest -m vllm`` (a missing venv skips). Otherwise they skip, so the default suite stays fast.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from envhub.backends.base import BackendError, SamplingParams
from envhub.backends.openai import OpenAIBackend
from envhub.backends.pool import BackendPool
from vllm_server import REPO, VLLMServer, cpu_env, require_vllm_tier, vllm_python

# one worker per module under pytest-xdist: its vLLM server (a module fixture) starts once, not once per worker
pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(900), pytest.mark.xdist_group(__name__)]

TOL = 1e-4


@pytest.fixture(scope="module")
def vllm_ready(request):
    """Run only when asked (``ENVHUB_REQUIRE_VLLM=1`` or ``-m vllm``): the tier takes minutes, the default suite
    must stay lean even on a machine where ``.venv-vllm`` exists."""
    require_vllm_tier(request)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from envhub.testing.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("vllm-models"), template="chatml", seed=0)


@pytest.fixture(scope="module")
def server(vllm_ready, model_dir):
    with VLLMServer(model_dir) as s:
        print(f"\n[vllm tier] server ready in {s.startup_s:.1f}s at {s.url}")
        yield s


@pytest.fixture(scope="module")
def hf_ref(model_dir):
    from envhub.backends.hf import HFBackend

    return HFBackend(model_dir, num_threads=1)


@pytest.fixture(scope="module")
def prompts(model_dir):
    """A real chat prompt (ChatML with tools, rendered by the template) and a few raw id sequences."""
    from envhub.env import ToolSpec
    from envhub.testing.models import load_tokenizer
    from envhub.codec.chat import ChatCodec

    codec = ChatCodec(load_tokenizer(model_dir), tools=[ToolSpec("finish", "Finish.", {"type": "object"})])
    chat = codec.prompt_ids([{"role": "system", "content": "You are terse."},
                             {"role": "user", "content": "What is 17 + 25? Call finish with the answer."}])
    return [chat, [5, 6, 7, 8], [100, 200, 300, 400, 500, 12], list(range(30, 90))]


def teacher_forced(hf, prompt, ids):
    """log_softmax of one uncached forward pass over prompt + ids, at each id: the raw logprobs of those ids."""
    import torch

    with torch.inference_mode():
        logits = hf.model(torch.tensor([prompt + ids])).logits[0].float()
    lp = torch.log_softmax(logits[len(prompt) - 1: len(prompt) - 1 + len(ids)], dim=-1)
    return [float(lp[j, t]) for j, t in enumerate(ids)]


async def raw_completion(server, body):
    import httpx

    async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
        r = await c.post("/v1/completions", json={"model": "tiny", "logprobs": 0, "return_token_ids": True, **body})
        r.raise_for_status()
        return r.json()["choices"][0]


async def test_greedy_ids_and_fp32_logprobs_match_the_hf_backend(server, hf_ref, prompts):
    backend = OpenAIBackend(server.url)  # the served name is discovered from /v1/models
    params = SamplingParams(max_tokens=24, temperature=0, extra={"ignore_eos": True})
    t0 = time.monotonic()
    gens = await asyncio.gather(*(backend.generate(p, params, session_id=f"g{i}") for i, p in enumerate(prompts)))
    print(f"[vllm tier] {len(prompts)} greedy requests x 24 tokens over HTTP in {time.monotonic() - t0:.2f}s")
    for prompt, gen in zip(prompts, gens):
        ref = await hf_ref.generate(prompt, params)
        assert gen.token_ids == ref.token_ids
        assert len(gen.logprobs) == len(gen.token_ids) == 24 and gen.finish_reason == "length"
        assert max(abs(a - b) for a, b in zip(gen.logprobs, ref.logprobs)) < TOL
    assert backend.model == "tiny"
    await backend.close()


async def test_prompt_ids_are_echoed_unchanged(server, prompts):
    for prompt in prompts:
        choice = await raw_completion(server, {"prompt": prompt, "max_tokens": 2, "temperature": 0})
        assert choice["prompt_token_ids"] == prompt
        assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"]) == 2


async def test_sampled_logprobs_are_the_raw_policy_logprobs(server, hf_ref, prompts):
    """At temperature 0.8 / top-p 0.9, vLLM's default logprobs are log_softmax of the raw logits: teacher-forcing
    the ids vLLM sampled through the hf model gives the same numbers."""
    backend = OpenAIBackend(server.url, model="tiny")
    for i, prompt in enumerate(prompts):
        params = SamplingParams(max_tokens=32, temperature=0.8, top_p=0.9, seed=100 + i, extra={"ignore_eos": True})
        gen = await backend.generate(prompt, params)
        assert len(gen.token_ids) == 32
        ref = teacher_forced(hf_ref, prompt, gen.token_ids)
        assert max(abs(a - b) for a, b in zip(gen.logprobs, ref)) < TOL
        again = await backend.generate(prompt, params)  # a seeded request reproduces
        assert again.token_ids == gen.token_ids
    await backend.close()


async def test_eos_is_in_token_ids_but_not_in_text(server, hf_ref, prompts):
    """A logit bias makes the model sample its EOS (<|im_end|>); the bias is a logits processor, so the returned
    logprob is still the raw one."""
    eos = hf_ref.tokenizer.convert_tokens_to_ids("<|im_end|>")
    prompt = prompts[0]
    choice = await raw_completion(server, {"prompt": prompt, "max_tokens": 8, "temperature": 0,
                                           "logit_bias": {str(eos): 100}})
    assert choice["token_ids"] == [eos] and choice["finish_reason"] == "stop"
    assert "<|im_end|>" not in choice["text"]
    backend = OpenAIBackend(server.url, model="tiny")
    gen = await backend.generate(prompt, SamplingParams(max_tokens=8, temperature=0,
                                                        extra={"logit_bias": {str(eos): 100}}))
    assert gen.token_ids == [eos] and gen.finish_reason == "stop"
    assert abs(gen.logprobs[0] - teacher_forced(hf_ref, prompt, [eos])[0]) < TOL
    await backend.close()


async def test_stop_strings_cut_text_but_not_token_ids(server, hf_ref, prompts):
    prompt = prompts[2]
    base = {"prompt": prompt, "max_tokens": 16, "temperature": 1.0, "seed": 5, "ignore_eos": True}
    free = await raw_completion(server, base)
    stop = hf_ref.tokenizer.decode(free["token_ids"][5:7])
    assert stop.strip()
    cut = await raw_completion(server, {**base, "stop": [stop]})
    assert cut["finish_reason"] == "stop" and stop not in cut["text"]
    ids = cut["token_ids"]
    assert ids == free["token_ids"][: len(ids)] and len(ids) <= 7
    assert stop in hf_ref.tokenizer.decode(ids)  # the token completing the stop string is kept
    backend = OpenAIBackend(server.url, model="tiny")
    gen = await backend.generate(prompt, SamplingParams(max_tokens=16, temperature=1.0, seed=5, stop=[stop],
                                                        extra={"ignore_eos": True}))
    assert gen.token_ids == ids and gen.finish_reason == "stop"
    await backend.close()


async def test_pool_over_a_dead_and_a_real_server(server, prompts):
    from test_backends_openai import dead_url

    pool = BackendPool({"dead": OpenAIBackend(dead_url(), model="tiny"), "vllm": OpenAIBackend(server.url)},
                       revive_after=None)
    params = SamplingParams(max_tokens=4, temperature=0)

    async def rollout(sid):
        pool.open_session(sid)
        try:
            return [await pool.generate(prompts[1], params, session_id=sid) for _ in range(3)]
        finally:
            pool.close_session(sid)

    results = await asyncio.gather(*(rollout(f"r{i}") for i in range(8)))
    first = results[0][0].token_ids
    assert all(g.token_ids == first for turns in results for g in turns)
    assert {b["name"]: b["healthy"] for b in pool.status()["backends"]} == {"dead": False, "vllm": True}
    with pytest.raises(BackendError, match="HTTP 400"):  # a bad request is vLLM's clear message, not a hang
        await OpenAIBackend(server.url, model="tiny").generate([5] * 3000, params)
    await pool.close()


def test_in_process_vllm_backend_matches_hf(vllm_ready, model_dir, hf_ref, prompts, tmp_path):
    """``VLLMBackend`` (AsyncLLM + TokensPrompt) in .venv-vllm: greedy ids and fp32 logprobs equal the hf backend's."""
    params = {"max_tokens": 16, "temperature": 0, "extra": {"ignore_eos": True}}
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"model": str(model_dir),
                               "requests": [{"prompt_ids": p, "params": params} for p in prompts]}))
    out = tmp_path / "out.json"
    t0 = time.monotonic()
    proc = subprocess.run([str(vllm_python()), str(REPO / "tests" / "backends" / "vllm_inprocess.py"), str(job),
                           str(out)], env=cpu_env(), cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    print(f"\n[vllm tier] in-process AsyncLLM: engine up in {result['startup_s']:.1f}s, "
          f"whole run {time.monotonic() - t0:.1f}s")
    for prompt, gen in zip(prompts, result["generations"]):
        ref = asyncio.run(hf_ref.generate(prompt, SamplingParams.from_dict(params)))
        assert gen["token_ids"] == ref.token_ids and gen["finish_reason"] == "length"
        assert max(abs(a - b) for a, b in zip(gen["logprobs"], ref.logprobs)) < TOL


async def test_a_server_without_rl_routes_is_a_clear_error(server):
    """This tier's server runs without ``VLLM_SERVER_DEV_MODE`` and ``--enable-scale-out`` (#25): the lifecycle
    refuses to drive it (it would only be drained), and the token-in/token-out backend gets vLLM's own 403."""
    from envhub.backends.lifecycle import LifecycleError, WeightLifecycle
    from envhub.backends.vllm_http import VLLMGenerateBackend, VLLMServerControl

    lc = WeightLifecycle()
    with pytest.raises(LifecycleError, match="VLLM_SERVER_DEV_MODE=1"):
        lc.add_engine(VLLMServerControl(server.url))
    assert lc.engines == []
    backend = VLLMGenerateBackend(server.url)
    with pytest.raises(BackendError, match="HTTP 403.*enable-scale-out"):
        await backend.generate([5, 6, 7], SamplingParams(max_tokens=2))
    await backend.close()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-s", "-q"]))


async def test_the_gateway_over_real_vllm_keeps_its_ids_and_logprobs(server, hf_ref, model_dir):
    """The gateway in front of real vLLM: three chained chat calls; the merged chain holds exactly the ids vLLM
    sampled, with vLLM's logprobs, and vLLM was given exactly the trajectory's context before each call."""
    from envhub.gateway import ChatRequest, Gateway, build
    from envhub.testing.models import load_tokenizer

    served = []

    class Recording(OpenAIBackend):
        async def generate(self, prompt_ids, params, *, session_id=""):
            gen = await super().generate(prompt_ids, params, session_id=session_id)
            served.append((list(prompt_ids), gen))
            return gen

    backend = Recording(server.url)
    gw = Gateway(backend, load_tokenizer(model_dir))
    s = gw.start_session("vllm")
    msgs = [{"role": "user", "content": "Count to three."}]
    for turn in range(3):
        r = await gw.complete(s, ChatRequest("chat", list(msgs), None,
                                             SamplingParams(max_tokens=8, temperature=1.0, seed=turn), True))
        msgs += [r.call.reply, {"role": "user", "content": "Again."}]
    await backend.close()
    (t,) = build(s)
    assert t.num_turns == 3 and [c.parent is not None for c in s.calls] == [False, True, True]
    ids = t.prompt_ids + t.response_ids
    for prompt, gen in served:
        n = len(prompt)
        assert ids[:n] == prompt and ids[n:n + len(gen.token_ids)] == gen.token_ids
        assert t.response_logprobs[n - len(t.prompt_ids): n - len(t.prompt_ids) + len(gen.token_ids)] == gen.logprobs
    assert sum(t.response_mask) == sum(len(g.token_ids) for _, g in served)
