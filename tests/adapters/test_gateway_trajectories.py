"""Trajectories the gateway builds (a black-box agent's session: several calls merged into one chain, plus an
auxiliary chain) through both trainer adapters' real classes: OpenRLHF gets one action range per call of the chain,
veRL the same positions in its response mask, and a failed session trains nothing."""
from __future__ import annotations

import asyncio
import sys
from dataclasses import replace
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainers
pytest.importorskip("openrlhf", reason="needs the trainers venv (make test-trainers)")
sys.path.insert(0, str(Path(__file__).parent.parent / "gateway"))

from gw_helpers import AUX_SYSTEM, TOOLS, agent_policy  # noqa: E402


def gateway_session(tokenizer):
    from envhub.backends.base import SamplingParams
    from envhub.backends.scripted import ScriptedBackend
    from envhub.gateway import ChatRequest, Gateway

    gw = Gateway(ScriptedBackend(agent_policy), tokenizer)
    s = gw.start_session("t")

    async def go():
        msgs = [{"role": "system", "content": "agent"}, {"role": "user", "content": "List files."}]
        while True:
            r = await gw.complete(s, ChatRequest("chat", list(msgs), TOOLS, SamplingParams(max_tokens=300), True))
            msgs.append(r.call.reply)
            if not r.tool_calls:
                break
            msgs += [{"role": "tool", "tool_call_id": c["id"], "content": "a.txt"} for c in r.tool_calls]
        await gw.complete(s, ChatRequest("chat", [{"role": "system", "content": AUX_SYSTEM},
                                                  {"role": "user", "content": "title?"}], None, SamplingParams(), True))

    asyncio.run(go())
    gw.set_reward(s, 1.0)
    gw.end_session(s)
    return s


def test_merged_chains_train_exactly_the_sampled_spans_in_both_adapters(tiny_tokenizer):
    from envhub.gateway import build
    from envhub_openrlhf.executor import to_openrlhf_output
    from envhub_verl.agent_loop import to_agent_loop_output
    from test_openrlhf import build_experience

    s = gateway_session(tiny_tokenizer)
    main, aux = build(s, "prefix_merging")
    assert (main.details["chain_role"], aux.details["chain_role"], main.num_turns) == ("main", "aux", 4)
    p = len(main.prompt_ids)
    spans = [(len(c.prompt_ids) - p, len(c.prompt_ids) - p + len(c.sampled_ids)) for c in s.calls[:4]]
    out = to_openrlhf_output(main, prompt="p", label="l")
    assert out["action_ranges"] == [(a + p, b + p) for a, b in spans] and out["reward"] == 1.0  # prompt + response
    assert build_experience(out).action_mask.sum() == sum(b - a for a, b in spans)
    v = to_agent_loop_output(main, main.prompt_ids, with_logprobs=True)
    assert [i for i, m in enumerate(v.response_mask) if m] == [i for a, b in spans for i in range(a, b)]
    assert v.reward_score == 1.0
    failed = replace(main, finish_reason="error", error="the session ended on a failed model call")
    assert to_openrlhf_output(failed, prompt="p", label="l")["action_ranges"] == []
    assert sum(to_agent_loop_output(failed, failed.prompt_ids, with_logprobs=True).response_mask) == 0
