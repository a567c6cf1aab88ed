"""An assistant message the gateway never issued (Qwen Code opens every conversation with a user context message
and the assistant reply "Got it. Thanks for the context!", which no model sampled) is context: it starts the chain
as part of the root's prompt (never trained), later calls extend the chain as usual, and the fidelity check knows
which assistant messages were sampled from ``details["turns"]``."""
from __future__ import annotations

import httpx
from gw_helpers import TOOLS, Recording

from envhub.backends.scripted import ScriptedBackend
from envhub.env import Action, ToolCall
from envhub.gateway import Gateway, GatewayThread
from envhub.gateway.builders import build
from envhub.rollout.fidelity import check_trajectory

FAKE = "Got it. Thanks for the context!"


def policy(task, messages):
    steps = sum(m.get("role") == "assistant" and bool(m.get("tool_calls")) for m in messages)
    if steps < 2:
        return Action(f"Step {steps}.", [ToolCall("bash", {"command": f"echo {steps}"})])
    return Action("Done.")


def test_an_assistant_message_the_gateway_never_issued_is_prompt_context(tiny_tokenizer):
    backend = Recording(ScriptedBackend(policy))
    gw = Gateway(backend, tiny_tokenizer)
    with GatewayThread(gw) as srv:
        session = gw.start_session("t")
        messages = [{"role": "system", "content": "You are an agent."},
                    {"role": "user", "content": [{"type": "text", "text": "Setting up the context."}]},
                    {"role": "assistant", "content": FAKE},
                    {"role": "user", "content": "Fix the bug."}]
        while True:
            r = httpx.post(srv.url + "/v1/chat/completions", json={"model": "m", "messages": messages, "tools": TOOLS},
                           headers={"Authorization": f"Bearer {session.api_key}"}, timeout=30).json()
            msg = r["choices"][0]["message"]
            messages.append(msg)
            if not msg.get("tool_calls"):
                break
            for c in msg["tool_calls"]:
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": "ok"})
        gw.set_reward(session, 1.0)
        gw.end_session(session)
        trajs = build(session)
    (t,) = trajs
    assert t.details["chain_role"] == "main" and t.num_turns == 3 == len(backend.calls)
    assert "not sampled through this session" in t.details["chain_reason"]
    # the unsampled reply is in the prompt (no mask at all), only the three sampled replies are trained
    assert FAKE in tiny_tokenizer.decode(t.prompt_ids)
    assert FAKE not in tiny_tokenizer.decode([i for i, m in zip(t.response_ids, t.response_mask) if m])
    assert sum(t.response_mask) == sum(len(g.token_ids) for _, g in backend.calls)
    assert [m["content"] for m in t.messages if m["role"] == "assistant"][0] == FAKE
    gens = [g for _, g in backend.calls]
    assert check_trajectory(t, tiny_tokenizer, generations=gens, tools=TOOLS) == []
    # without the record of which messages were sampled the check counts the unsampled one as a turn and fails;
    # a record naming a message that is not an assistant's is refused
    details = dict(t.details)
    t.details = {k: v for k, v in details.items() if k != "turns"}
    assert check_trajectory(t, tiny_tokenizer, generations=gens, tools=TOOLS) != []
    t.details = {**details, "turns": [[3, 0, 1]] + details["turns"][1:]}
    assert "not increasing indices of assistant messages" in check_trajectory(t, tiny_tokenizer, generations=gens, tools=TOOLS)[0]
