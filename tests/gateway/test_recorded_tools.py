"""A trajectory records the tools exactly as they were rendered (#28, item 3).

The tools a prompt was rendered with were stored with sorted keys while the prompt was rendered in the request's
order; a Qwen-style template (the tiny model's ChatML, which ``tojson``s each tool) then re-renders another prompt
and ``envhub check-trajectory`` fails a faithful trajectory. The same sorting keyed the shared codec cache, so two
tool lists that differ only in key order were rendered with whichever came first."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from gw_helpers import agent_policy

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread

openai = pytest.importorskip("openai")
REPO = Path(__file__).resolve().parents[2]
# name before description: not sorted, as every SDK and harness sends it
BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command.", "strict": False,
                                         "parameters": {"type": "object", "required": ["command"],
                                                        "properties": {"command": {"type": "string"}}}}}


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_a_gateway_trajectory_with_tools_passes_check_trajectory(tiny_tokenizer, tmp_path):
    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    with GatewayThread(gw) as srv:
        s = gw.start_session("tools")
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=s.api_key, max_retries=0)
        r = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "List files."}],
                                           tools=[BASH])
        assert r.choices[0].message.tool_calls
        out = httpx.post(f"{srv.url}/sessions/{s.session_id}/trajectories", json={"builder": "prefix_merging"}).json()
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in out["trajectories"]))
    assert json.loads(out["trajectories"][0]["details"]["tools"]) == [
        {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                          "parameters": BASH["function"]["parameters"], "strict": False}}]
    p = subprocess.run([sys.executable, "-m", "envhub.cli", "check-trajectory", str(path), "--tokenizer", "tiny"],
                       capture_output=True, text=True, timeout=120, cwd=str(REPO))
    assert p.returncode == 0, p.stdout + p.stderr


def test_tool_lists_that_differ_only_in_key_order_each_render_as_sent(tiny_tokenizer):
    """The shared codec cache must not hand one key order's codec to the other."""
    from envhub.codec.chat import ChatCodec

    a = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]
    b = [{"type": "function", "function": {"description": "d", "name": "f", "parameters": {"type": "object"}}}]
    msgs = [{"role": "user", "content": "hi"}]
    for tools in (a, b):
        want = tiny_tokenizer.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
        assert ChatCodec.shared(tiny_tokenizer, tools=tools).render(msgs, add_generation_prompt=True) == want


def test_sorted_tools_in_the_record_fail_the_check(tiny_tokenizer):
    """Break the fix on purpose (the record stores the tools with sorted keys, as before): the fidelity check then
    fails the trajectory, which shows the check sees the difference."""
    from envhub.gateway import build
    from envhub.rollout.fidelity import check_trajectory

    import asyncio

    from envhub.gateway.core import ChatRequest
    from envhub.gateway.dialects.chat import function_tools

    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    s = gw.start_session("t")
    asyncio.run(gw.complete(s, ChatRequest("chat", [{"role": "user", "content": "List files."}],
                                           function_tools([BASH]))))
    (traj,) = build(s)
    assert check_trajectory(traj, tiny_tokenizer) == []
    traj.details["tools"] = json.dumps(json.loads(traj.details["tools"]), sort_keys=True)
    assert check_trajectory(traj, tiny_tokenizer) != []
