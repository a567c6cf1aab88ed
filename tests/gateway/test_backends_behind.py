"""Every backend kind behind the gateway: the openai token-id backend on a (named) vLLM stand-in server, and a pool
of two with sticky sessions -- each session's calls stay on one server (its prefix cache), sessions spread over both,
and the record is exact. (Scripted and transformers backends: test_clients.py; vLLM itself: the vllm tier.)"""
from __future__ import annotations

import sys
from pathlib import Path

from gw_helpers import Recording, invariant_problems

from envhub.backends import make_backend
from envhub.gateway import ChatRequest, Gateway, build

sys.path.insert(0, str(Path(__file__).parent.parent / "backends"))
from standin_server import StandIn  # noqa: E402


async def test_pool_of_token_id_servers_is_sticky_per_session(tiny_model_path, tiny_tokenizer):
    from envhub.backends.base import SamplingParams
    from envhub.backends.hf import HFBackend

    hf = HFBackend(tiny_model_path)
    servers = [await StandIn(hf).start(), await StandIn(hf).start()]
    pool = make_backend(",".join(s.url for s in servers))
    backend = Recording(pool)
    gw = Gateway(backend, tiny_tokenizer, default_max_tokens=8)
    sessions = [gw.start_session(f"s{i}") for i in range(4)]
    try:
        for turn in range(3):
            for i, s in enumerate(sessions):
                msgs = [{"role": "user", "content": f"Hello {i}."}]
                for c in s.calls:
                    msgs += [c.reply, {"role": "user", "content": "More."}]
                r = await gw.complete(s, ChatRequest("chat", msgs, None, SamplingParams(max_tokens=8, seed=turn),
                                                     True))
                assert r.call.parent == (s.calls[-2].call_id if turn else None)
        for s in sessions:
            gw.end_session(s)
    finally:
        await pool.close()
        for srv in servers:
            await srv.stop()
    prompts_by_server = [{tuple(b["prompt"]) for b in srv.bodies} for srv in servers]
    assert all(prompts_by_server), "both servers took sessions"
    for s in sessions:
        where = {n for c in s.calls for n, prompts in enumerate(prompts_by_server) if tuple(c.prompt_ids) in prompts}
        assert len(where) == 1, f"{s.session_id} moved between servers: {where}"
    recorded = backend.calls
    for s in sessions:
        mine = [(p, g) for p, g in recorded if any(p == c.prompt_ids for c in s.calls)]
        trajs = build(s)
        assert len(trajs) == 1 and trajs[0].num_turns == 3
        assert invariant_problems(s, trajs, mine) == []
