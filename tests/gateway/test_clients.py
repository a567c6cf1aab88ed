"""The real client libraries against ``envhub gateway`` on loopback: openai chat and responses (streaming and not),
anthropic messages (streaming and not), the OpenAI Agents SDK's ``Runner.run`` with a function tool. Each plays a
tool loop the way a harness does (echoing what the SDK parsed), and the session must come out as one main chain
that passes the token-fidelity check."""
from __future__ import annotations

import json

import pytest
from gw_helpers import TOOLS, NonCanonicalScripted, Recording, agent_policy, invariant_problems

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread, build
from envhub.rollout.fidelity import check_trajectory

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
FLAT_TOOLS = [{"type": "function", **TOOLS[0]["function"]}]
ANTHROPIC_TOOLS = [{"name": "bash", "description": TOOLS[0]["function"]["description"],
                    "input_schema": TOOLS[0]["function"]["parameters"]}]


@pytest.fixture
def served(tiny_tokenizer, tiny_samples):
    backend = Recording(NonCanonicalScripted(agent_policy, tiny_tokenizer, tiny_samples))
    gw = Gateway(backend, tiny_tokenizer)
    with GatewayThread(gw) as srv:
        yield gw, srv, backend


def check_session(gw, session, backend, turns: int) -> None:
    gw.end_session(session)
    trajs = build(session, "prefix_merging")
    assert [t.details["chain_role"] for t in trajs] == ["main"], [c.break_reason for c in session.calls]
    main = trajs[0]
    assert main.num_turns == turns
    assert [c.parent is None for c in session.calls] == [True] + [False] * (turns - 1)
    assert invariant_problems(session, trajs, backend.calls) == []
    codec = gw.codec_for(json.loads(main.details["tools"]))
    assert check_trajectory(main, codec, generations=[g for _, g in backend.calls]) == []


def chat_loop(client, stream: bool) -> str:
    messages = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "List files."}]
    for _ in range(6):
        if stream:
            text, calls, finish = "", {}, None
            for chunk in client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True,
                                                        stream_options={"include_usage": True}):
                if not chunk.choices:
                    assert chunk.usage.completion_tokens > 0
                    continue
                d = chunk.choices[0].delta
                text += d.content or ""
                for tc in d.tool_calls or []:
                    calls[tc.index] = {"id": tc.id, "type": "function",
                                       "function": {"name": tc.function.name, "arguments": tc.function.arguments}}
                finish = chunk.choices[0].finish_reason or finish
            msg = {"role": "assistant", "content": text, **({"tool_calls": list(calls.values())} if calls else {})}
        else:
            r = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
            finish, m = r.choices[0].finish_reason, r.choices[0].message
            assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
            msg = m.model_dump(exclude_none=True)
        messages.append(msg)
        if finish != "tool_calls":
            return msg["content"]
        for c in msg["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": c["id"], "content": "a.txt\nb.txt\n"})
    raise AssertionError("the agent never finished")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_chat_completions(served, stream):
    gw, srv, backend = served
    s = gw.start_session("chat")
    answer = chat_loop(openai.OpenAI(base_url=srv.url + "/v1", api_key=s.api_key, max_retries=0), stream)
    assert answer.endswith("Done after 3 turns: café ✓")
    check_session(gw, s, backend, 4)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_openai_responses(served, stream):
    gw, srv, backend = served
    s = gw.start_session("responses")
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=s.api_key, max_retries=0)
    items: list = [{"role": "user", "content": "List files."}]
    for _ in range(6):
        if stream:
            with client.responses.stream(model="m", input=items, tools=FLAT_TOOLS, instructions="Be an agent.") as st:
                kinds = [ev.type for ev in st]
                r = st.get_final_response()
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            assert "response.output_item.done" in kinds
        else:
            r = client.responses.create(model="m", input=items, tools=FLAT_TOOLS, instructions="Be an agent.")
        assert r.usage.input_tokens > 0
        items += [o.model_dump(exclude_none=True) for o in r.output]  # Codex echoes the items verbatim
        calls = [o for o in r.output if o.type == "function_call"]
        if not calls:
            break
        items += [{"type": "function_call_output", "call_id": c.call_id, "output": "a.txt\n"} for c in calls]
    assert r.output_text.endswith("Done after 3 turns: café ✓")
    check_session(gw, s, backend, 4)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_anthropic_messages(served, stream):
    gw, srv, backend = served
    s = gw.start_session("anthropic")
    client = anthropic.Anthropic(base_url=srv.url, api_key=s.api_key, max_retries=0)
    messages: list = [{"role": "user", "content": "List files."}]
    for _ in range(6):
        kw = dict(model="m", max_tokens=400, system=[{"type": "text", "text": "Be an agent."}], messages=messages,
                  tools=ANTHROPIC_TOOLS)
        if stream:
            with client.messages.stream(**kw) as st:
                m = st.get_final_message()
        else:
            m = client.messages.create(**kw)
        assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
        content = [b.model_dump(exclude_none=True) for b in m.content]
        for b in content:  # Claude Code puts cache_control on the newest block; it moves every turn
            b.pop("parsed_output", None)
        content[-1]["cache_control"] = {"type": "ephemeral"}
        messages.append({"role": "assistant", "content": content})
        if m.stop_reason != "tool_use":
            break
        messages.append({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": b.id, "content": "a.txt"} for b in m.content if b.type == "tool_use"]})
    for msg in messages[:-1]:  # ...and is gone from the older blocks on the next request
        if isinstance(msg["content"], list):
            for b in msg["content"]:
                b.pop("cache_control", None)
    assert m.content[0].text.endswith("Done after 3 turns: café ✓") and m.stop_reason == "end_turn"
    n = client.messages.count_tokens(model="m", messages=messages[:1], system="Be an agent.", tools=ANTHROPIC_TOOLS)
    assert n.input_tokens > 0
    check_session(gw, s, backend, 4)


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_openai_agents_sdk_runner(tiny_tokenizer, api):
    """The OpenAI Agents SDK's own loop (Runner.run), a @function_tool the agent really calls."""
    agents = pytest.importorskip("agents")
    ran = []

    @agents.function_tool
    def bash(command: str) -> str:
        """Run a shell command."""
        ran.append(command)
        return "a.txt\nb.txt"

    backend = Recording(ScriptedBackend(agent_policy))
    gw = Gateway(backend, tiny_tokenizer)
    with GatewayThread(gw) as srv:
        s = gw.start_session("sdk")
        client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key=s.api_key, max_retries=0)
        model = (agents.OpenAIChatCompletionsModel if api == "chat_completions" else agents.OpenAIResponsesModel)(
            model="m", openai_client=client)
        agents.set_tracing_disabled(True)
        agent = agents.Agent(name="a", instructions="Be an agent.", tools=[bash], model=model)
        result = agents.Runner.run_sync(agent, "List files.")
    assert ran == ["echo 1 && ls", "echo 2 && ls", "echo 3 && ls"] or ran == ["echo 0 && ls", "echo 1 && ls",
                                                                              "echo 2 && ls"], ran
    assert "Done after 3 turns" in result.final_output
    check_session(gw, s, backend, 4)


def test_tiny_model_sampling_through_the_gateway(tiny_model_path, tiny_tokenizer):
    """A real model behind it (transformers on CPU, temperature 1): what it samples is what the trajectory holds."""
    from envhub.backends.hf import HFBackend

    backend = Recording(HFBackend(tiny_model_path))
    gw = Gateway(backend, tiny_tokenizer, default_max_tokens=12)
    with GatewayThread(gw) as srv:
        s = gw.start_session("tiny")
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key=s.api_key, max_retries=0)
        messages = [{"role": "user", "content": "Say something."}]
        for turn in range(3):
            r = client.chat.completions.create(model="m", messages=messages, seed=turn)
            messages += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "More."}]
    trajs = build(s)
    assert len(trajs) == 1 and trajs[0].num_turns == 3, [c.break_reason for c in s.calls]
    assert invariant_problems(s, trajs, backend.calls) == []
