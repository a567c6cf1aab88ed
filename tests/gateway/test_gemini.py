"""Gemini's own API (``:generateContent``, ``:streamGenerateContent``, ``:countTokens``) against Google's own client,
``google-genai``, pointed at ``envhub gateway`` on loopback: function call + function response loops with the exact
token splice (also when the client drops or re-mints the call ids, as Gemini CLI may), both stream forms, a true
``usageMetadata`` and ``countTokens``, the real tiny model behind it, and malformed bodies answered with Google's
400 shape."""
from __future__ import annotations

import json

import httpx
import pytest
from gw_helpers import NonCanonicalScripted, Recording, agent_policy, invariant_problems
from test_clients import check_session

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread, build
from envhub.gateway.core import Gateway as CoreGateway

genai = pytest.importorskip("google.genai")
types = pytest.importorskip("google.genai.types")
BASH = {"name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "OBJECT", "properties": {"command": {"type": "STRING"}}, "required": ["command"]}}
pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def served(tiny_tokenizer, tiny_samples):
    backend = Recording(NonCanonicalScripted(agent_policy, tiny_tokenizer, tiny_samples))
    gw = Gateway(backend, tiny_tokenizer)
    with GatewayThread(gw) as srv:
        yield gw, srv, backend


def client(srv, key):
    return genai.Client(api_key=key, http_options=types.HttpOptions(
        base_url=srv.url, retry_options=types.HttpRetryOptions(attempts=1)))


def config(**kw):
    return types.GenerateContentConfig(
        system_instruction="You are an agent.", tools=[types.Tool(function_declarations=[BASH])],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True), **kw)


def echo(content: types.Content, ids: str) -> types.Content:
    """The model turn as the client sends it back: ``verbatim``; ``dropped`` call ids (and Gemini CLI's
    ``thoughtSignature`` added); ``reminted`` ids the gateway never issued."""
    data = content.model_dump(exclude_none=True)
    for n, part in enumerate(data["parts"]):
        if "function_call" in part and ids == "dropped":
            part["function_call"].pop("id", None)
            part["thought_signature"] = b"skip_thought_signature_validator"
        elif "function_call" in part and ids == "reminted":
            part["function_call"]["id"] = f"{part['function_call']['name']}-1764000000-{n}"
    return types.Content.model_validate(data)


def tool_loop(c, ids: str, stream: bool) -> list:
    """Play the agent's loop as a harness does; returns every response (or list of chunks)."""
    contents: list = [types.Content(role="user", parts=[types.Part(text="List files.")])]
    seen = []
    for _ in range(6):
        if stream:
            chunks = list(c.models.generate_content_stream(model="m", contents=contents, config=config()))
            seen.append(chunks)
            parts = [p for ch in chunks for p in ch.candidates[0].content.parts]
            model_turn = types.Content(role="model", parts=parts)
            last = chunks[-1]
        else:
            last = c.models.generate_content(model="m", contents=contents, config=config())
            seen.append(last)
            model_turn = last.candidates[0].content
        contents.append(echo(model_turn, ids))
        calls = [p.function_call for p in model_turn.parts if p.function_call]
        if not calls:
            assert last.candidates[0].finish_reason == types.FinishReason.STOP
            return seen
        contents.append(types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
            id=None if ids == "dropped" else echo(model_turn, ids).parts[-1].function_call.id,
            name=f.name, response={"output": "a.txt\nb.txt\n"})) for f in calls]))
    raise AssertionError("the agent never finished")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("ids", ["verbatim", "dropped", "reminted"])
def test_function_call_loop_is_one_exact_chain(served, ids, stream):
    gw, srv, backend = served
    s = gw.start_session("gemini")
    seen = tool_loop(client(srv, s.api_key), ids, stream)
    final = seen[-1][-1] if stream else seen[-1]
    assert final.text.endswith("Done after 3 turns: café ✓")
    # the exact splice: each call's prompt starts with the previous call's prompt ids + the ids it sampled
    for (p0, g0), (p1, _) in zip(backend.calls, backend.calls[1:]):
        assert p1[:len(p0) + len(g0.token_ids)] == p0 + list(g0.token_ids)
    # usageMetadata is the recorded truth
    usage = [(ch[-1] if stream else ch).usage_metadata for ch in seen]
    assert [(u.prompt_token_count, u.candidates_token_count, u.total_token_count) for u in usage] == [
        (len(p), len(g.token_ids), len(p) + len(g.token_ids)) for p, g in backend.calls]
    check_session(gw, s, backend, 4)


def test_without_the_splice_the_exactness_check_fails(served, monkeypatch):
    """Break-it: a gateway that re-renders the history (the model's non-canonical ids re-tokenized) instead of
    splicing feeds the model a prompt that does not start with what it sampled; the check above catches it."""
    monkeypatch.setattr(CoreGateway, "splice", staticmethod(
        lambda codec, parent, new: codec.prompt_ids(parent.context + [parent.reply] + new)))
    gw, srv, backend = served
    s = gw.start_session("gemini")
    tool_loop(client(srv, s.api_key), "verbatim", False)
    broken = [p1[:len(p0) + len(g0.token_ids)] != p0 + list(g0.token_ids)
              for (p0, g0), (p1, _) in zip(backend.calls, backend.calls[1:])]
    assert any(broken)
    gw.end_session(s)
    with pytest.raises(AssertionError, match="sampled ids are not where its chain puts them"):
        build(s, "prefix_merging")  # the builder's own splice invariant refuses the chain


def test_matching_without_ids_is_what_keeps_the_chain(served, monkeypatch):
    """Break-it: if the parent were found by minted ids only, a client that drops them (Gemini CLI may) would start
    a new chain on every call."""
    from envhub.gateway import matching

    real = matching._find_parent
    monkeypatch.setattr(matching, "_find_parent", lambda session, echoed, k: (
        real(session, echoed, k) if any(c.get("id") in session.issued_tool_ids for c in echoed.get("tool_calls") or [])
        else (None, False)))
    gw, srv, backend = served
    s = gw.start_session("gemini")
    tool_loop(client(srv, s.api_key), "dropped", False)
    assert [c.parent is None for c in s.calls] != [True, False, False, False]


def test_stream_without_alt_sse_is_one_json_array(served):
    """Google's server answers ``:streamGenerateContent`` without ``alt=sse`` with one JSON array of the chunks."""
    gw, srv, backend = served
    s = gw.start_session("array")
    body = {"contents": [{"role": "user", "parts": [{"text": "List files."}]}],
            "tools": [{"functionDeclarations": [BASH]}]}
    url = f"{srv.url}/v1beta/models/m:streamGenerateContent"
    r = httpx.post(url, json=body, headers={"x-goog-api-key": s.api_key})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    chunks = r.json()
    assert isinstance(chunks, list) and [list(p) for ch in chunks for p in ch["candidates"][0]["content"]["parts"]] \
        == [["text"], ["functionCall"]]
    assert "finishReason" not in chunks[0]["candidates"][0] and chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    prompt, gen = backend.calls[-1]
    assert chunks[-1]["usageMetadata"] == {"promptTokenCount": len(prompt), "candidatesTokenCount": len(gen.token_ids),
                                           "totalTokenCount": len(prompt) + len(gen.token_ids)}
    sse = httpx.post(url + "?alt=sse&key=" + s.api_key, json=body)  # the key as a query parameter, as Google takes it
    assert sse.status_code == 200 and sse.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in sse.text.split("\r\n") if line.startswith("data: ")]
    assert [list(p) for ev in events for p in ev["candidates"][0]["content"]["parts"]] == [["text"], ["functionCall"]]


def test_count_tokens_is_the_rendered_prompt(served):
    gw, srv, backend = served
    s = gw.start_session("count")
    c = client(srv, s.api_key)
    contents = [types.Content(role="user", parts=[types.Part(text="List files, then say café.")])]
    n = c.models.count_tokens(model="m", contents=contents).total_tokens
    plain = types.GenerateContentConfig(automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    r = c.models.generate_content(model="m", contents=contents, config=plain)
    assert n == r.usage_metadata.prompt_token_count == len(backend.calls[-1][0])
    codec = gw.codec_for(None)
    assert n == len(codec.prompt_ids([{"role": "user", "content": "List files, then say café."}]))
    # the whole-request form counts the system instruction and the tools too
    full = {"generateContentRequest": {"model": "models/m", "contents": [{"role": "user", "parts": [{"text": "Hi"}]}],
                                       "systemInstruction": {"parts": [{"text": "Be brief."}]},
                                       "tools": [{"functionDeclarations": [BASH]}]}}
    got = httpx.post(f"{srv.url}/v1beta/models/m:countTokens", json=full, headers={"x-goog-api-key": s.api_key}).json()
    tools = [{"type": "function", "function": {"name": "bash", "description": BASH["description"], "parameters": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]
    want = gw.codec_for(tools).prompt_ids([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert got == {"totalTokens": len(want)}


def test_the_sdk_automatic_function_calling_loop(tiny_tokenizer):
    """google-genai's own loop: a Python function as the tool, called by the SDK on the model's functionCall."""
    ran = []

    def bash(command: str) -> str:
        """Run a shell command."""
        ran.append(command)
        return "a.txt\nb.txt"

    backend = Recording(ScriptedBackend(agent_policy))
    gw = Gateway(backend, tiny_tokenizer)
    with GatewayThread(gw) as srv:
        s = gw.start_session("afc")
        c = client(srv, s.api_key)  # kept: a Client closes its connection pool when it is collected
        r = c.models.generate_content(
            model="m", contents="List files.", config=types.GenerateContentConfig(
                system_instruction="Be an agent.", tools=[bash]))
    assert ran == ["echo 0 && ls", "echo 1 && ls", "echo 2 && ls"], ran
    assert r.text.endswith("Done after 3 turns: café ✓")
    check_session(gw, s, backend, 4)


def test_tiny_model_sampling_through_the_gemini_route(tiny_model_path, tiny_tokenizer):
    """The real tiny model behind it (transformers on CPU, temperature 1, a seed per call)."""
    from envhub.backends.hf import HFBackend

    backend = Recording(HFBackend(tiny_model_path))
    gw = Gateway(backend, tiny_tokenizer, default_max_tokens=12)
    with GatewayThread(gw) as srv:
        s = gw.start_session("tiny")
        c = client(srv, s.api_key)
        contents: list = [types.Content(role="user", parts=[types.Part(text="Say something.")])]
        for turn in range(3):
            r = c.models.generate_content(model="m", contents=contents, config=types.GenerateContentConfig(
                seed=turn, temperature=1.0, max_output_tokens=12))
            assert r.usage_metadata.candidates_token_count == len(backend.calls[-1][1].token_ids)
            contents += [r.candidates[0].content, types.Content(role="user", parts=[types.Part(text="More.")])]
    trajs = build(s)
    assert len(trajs) == 1 and trajs[0].num_turns == 3, [c.break_reason for c in s.calls]
    assert invariant_problems(s, trajs, backend.calls) == []
