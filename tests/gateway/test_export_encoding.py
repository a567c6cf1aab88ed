"""#28 item 10: the AReaL export encodes each token once and sends exactly the bytes it sent before; a chain's opening
is rendered once per distinct conversation. Real gateway, tiny model's tokenizer, scripted backend; speed is
``benchmarks/gateway_throughput.py``'s business, these check behaviour only."""
from __future__ import annotations

import asyncio
import base64
import json
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest

from envhub.backends.scripted import ScriptedBackend
from envhub.env import Action, ToolCall
from envhub.gateway import Gateway, GatewayThread, areal
from envhub.gateway.core import ChatRequest

ROOT = Path(__file__).resolve().parents[2]
AREAL_PY = ROOT / ".venv-areal" / "bin" / "python"
TOOLS = [{"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                           "parameters": {"type": "object",
                                                          "properties": {"command": {"type": "string"}}}}}]
OUTPUT = "".join(f"line {j}: value = compute(value, {j})\n" for j in range(40))


def always_a_tool(task, messages) -> Action:
    n = sum(m.get("role") == "assistant" for m in messages)
    return Action(f"Step {n}.", [ToolCall("bash", {"command": f"sed -n {n},+9p f.py"})])


def reference(session, discount: float = 1.0, style: str = "individual") -> bytes:
    """What the gateway sent before #28 item 10: ``json.dumps`` of :func:`areal.export` (kept as the reference)."""
    return json.dumps({"interactions": areal.export(session, discount=discount, style=style)}, ensure_ascii=False,
                      separators=(",", ":")).encode()


def played(tokenizer, calls: int = 6) -> tuple[Gateway, object]:
    """A session with a chain of ``calls`` calls, a retried call (a second child of call 3: a branch), a new chain
    (the history rewritten), rewards on two calls."""
    gw = Gateway(ScriptedBackend(always_a_tool), tokenizer)

    async def play():
        s = gw.start_session("t")
        msgs = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix f.py."}]
        asked = []
        for _ in range(calls):
            asked.append([dict(m) for m in msgs])
            r = await gw.complete(s, ChatRequest("chat", [dict(m) for m in msgs], tools=TOOLS))
            msgs.append(dict(r.call.reply))
            msgs += [{"role": "tool", "tool_call_id": c["id"], "content": OUTPUT} for c in r.tool_calls]
        await gw.complete(s, ChatRequest("chat", asked[3], tools=TOOLS))  # a retry: a branch off call 2
        await gw.complete(s, ChatRequest("chat", [{"role": "user", "content": "Start over."}], tools=TOOLS))
        gw.set_reward(s, 0.25, s.calls[2].call_id)
        gw.set_reward(s, 1.0)
        return s

    return gw, asyncio.run(play())


def encoded_bytes(monkeypatch) -> list[int]:
    """Count the raw bytes base64 encodes from here on (the old and the new export both encode through
    ``base64.b64encode``)."""
    seen: list[int] = []
    real = base64.b64encode

    def counting(raw, *a, **kw):
        seen.append(len(raw))
        return real(raw, *a, **kw)

    monkeypatch.setattr(base64, "b64encode", counting)
    return seen


def distinct_tokens(session) -> int:
    """Tokens of the session's calls, each prefix shared with the parent counted once."""
    return sum(len(c.prompt_ids) + len(c.sampled_ids) - (
        len(session.by_id[c.parent].prompt_ids) + len(session.by_id[c.parent].sampled_ids) if c.parent else 0)
        for c in session.calls if c.ok)


def encoding_bound(session) -> int:
    """Raw bytes an export that encodes each token once may encode: 8 per distinct token (input_ids), the tails of
    the four per-token tensors after their constant runs (8 + 4 + 8 bytes per sampled token, at most 2 run units
    and 2 carried bytes each), the reward."""
    done = [c for c in session.calls if c.ok]
    return 8 * distinct_tokens(session) + sum(20 * len(c.sampled_ids) + 4 * 2 * 8 + 2 + 4 for c in done)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("discount", [1.0, 0.9])
def test_export_bytes_are_what_the_reference_sent(tiny_tokenizer, discount):
    _, s = played(tiny_tokenizer)
    assert sum(c.parent is not None for c in s.calls) >= 5 and any(c.parent is None for c in s.calls[1:])
    assert areal.export_json(s, discount=discount) == reference(s, discount)
    assert areal.export_json(s, style="concat") == reference(s, style="concat")
    s.flag("aborted_call")  # a session built as failed: every loss mask all zeros, the other tensors unchanged
    assert areal.export_json(s, discount=discount) == reference(s, discount)


@pytest.mark.timeout(120)
def test_the_http_export_is_the_reference_bytes(tiny_tokenizer):
    gw, s = played(tiny_tokenizer)
    want = reference(s, 0.9)
    gw.end_session(s)
    with GatewayThread(gw) as srv:
        r = httpx.post(srv.url + "/export_trajectories", json={"session_id": s.session_id, "discount": 0.9},
                       timeout=30)
    assert r.status_code == 200 and r.content == want


@pytest.mark.timeout(120)
def test_export_encodes_each_shared_token_once(tiny_tokenizer, monkeypatch):
    """Before #28 item 10 every interaction's whole [1, L] tensors were encoded, the shared prefix once per call:
    that path (:func:`areal.export`, kept as the reference) is several times over the bound, the wire path within."""
    _, s = played(tiny_tokenizer)
    seen = encoded_bytes(monkeypatch)
    areal.export_json(s)
    assert sum(seen) <= encoding_bound(s), (sum(seen), encoding_bound(s))
    seen.clear()
    reference(s)
    assert sum(seen) > 4 * encoding_bound(s)


@pytest.mark.timeout(120)
def test_break_it_encoding_every_prefix_again_exceeds_the_bound(tiny_tokenizer, monkeypatch):
    """The check above has teeth: with the parent's encoding never reused the bytes are still right, but the bound
    is exceeded (input_ids alone are then encoded once per call)."""
    _, s = played(tiny_tokenizer)
    monkeypatch.setattr(areal, "_extends", lambda call, parent: False)
    seen = encoded_bytes(monkeypatch)
    body = areal.export_json(s)
    assert sum(seen) > 2 * encoding_bound(s)
    monkeypatch.undo()
    assert body == reference(s)


@pytest.mark.timeout(120)
def test_break_it_a_wrong_constant_run_changes_the_bytes(tiny_tokenizer, monkeypatch):
    """The byte comparison has teeth: a constant run encoded one unit short is caught."""
    _, s = played(tiny_tokenizer)
    real = areal._fill
    monkeypatch.setattr(areal, "_fill", lambda unit, count, tail=b"": real(unit, max(count - 1, 0), tail))
    assert areal.export_json(s) != reference(s)


@pytest.mark.timeout(180)
@pytest.mark.skipif(not AREAL_PY.exists(), reason=".venv-areal (make areal-venv) is not installed")
def test_areals_own_deserializer_reads_the_same_tensors(tiny_tokenizer, tmp_path):
    """AReaL 1.0.4's ``deserialize_interactions`` + ``to_tensor_dict`` on the gateway's bytes give, tensor for
    tensor, what the reference export encodes."""
    _, s = played(tiny_tokenizer)
    (tmp_path / "export.json").write_bytes(areal.export_json(s, discount=0.9))
    code = ("import json, sys\n"
            "from areal.experimental.openai.proxy.server import deserialize_interactions\n"
            "out = {}\n"
            "for k, it in deserialize_interactions(json.load(open(sys.argv[1]))['interactions']).items():\n"
            "    out[k] = {n: [str(t.dtype), t.tolist()] for n, t in it.to_tensor_dict().items()}\n"
            "    out[k]['reward'] = it.reward\n"
            "json.dump(out, open(sys.argv[2], 'w'))\n")
    subprocess.run([str(AREAL_PY), "-c", code, str(tmp_path / "export.json"), str(tmp_path / "read.json")],
                   check=True, timeout=150, capture_output=True)
    read = json.loads((tmp_path / "read.json").read_text())
    want = areal.export(s, discount=0.9)
    assert list(read) == list(want)
    for cid, item in want.items():
        assert read[cid]["reward"] == item["reward"]
        for name, t in item["tensor_dict"].items():
            dtype, values = read[cid][name]
            assert dtype == t["dtype"] and np.array_equal(np.asarray(values), areal.decode_tensor(t)), (cid, name)


@pytest.mark.timeout(120)
def test_a_chain_opening_is_rendered_once_per_distinct_conversation(tiny_tokenizer):
    """Sessions of a GRPO group open with the same messages: the second opening is the first's ids (a hit), equal
    to a fresh rendering; other messages or other tools are rendered (a miss)."""
    gw = Gateway(ScriptedBackend(always_a_tool), tiny_tokenizer)
    opening = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix f.py."}]
    other_tools = [{"type": "function", "function": dict(TOOLS[0]["function"], description="Run it.")}]

    async def open_(messages, tools):
        return (await gw.complete(gw.start_session("g"), ChatRequest("chat", [dict(m) for m in messages],
                                                                     tools=tools))).call.prompt_ids

    fresh = gw.codec_for(TOOLS).prompt_ids(opening)
    assert asyncio.run(open_(opening, TOOLS)) == fresh and gw.openings.misses == 1
    assert asyncio.run(open_(opening, TOOLS)) == fresh and gw.openings.hits == 1
    assert asyncio.run(open_(opening, other_tools)) == gw.codec_for(other_tools).prompt_ids(opening)
    changed = opening[:1] + [{"role": "user", "content": "Fix g.py."}]
    assert asyncio.run(open_(changed, TOOLS)) == gw.codec_for(TOOLS).prompt_ids(changed)
    assert (gw.openings.hits, gw.openings.misses) == (1, 3)


@pytest.mark.timeout(120)
def test_break_it_an_opening_cache_blind_to_the_tools_serves_wrong_ids(tiny_tokenizer, monkeypatch):
    """The cache's key must hold the tools: keyed on the messages alone, the second tool set gets the first's ids."""
    from envhub.gateway.calls import OpeningCache

    real = OpeningCache.key
    monkeypatch.setattr(OpeningCache, "key", staticmethod(lambda tk, context: real("", context)))
    gw = Gateway(ScriptedBackend(always_a_tool), tiny_tokenizer)
    opening = [{"role": "user", "content": "Fix f.py."}]
    other_tools = [{"type": "function", "function": dict(TOOLS[0]["function"], description="Run it.")}]

    async def open_(tools):
        return (await gw.complete(gw.start_session("g"), ChatRequest("chat", [dict(m) for m in opening],
                                                                     tools=tools))).call.prompt_ids

    asyncio.run(open_(TOOLS))
    assert asyncio.run(open_(other_tools)) != gw.codec_for(other_tools).prompt_ids(opening)


QUIRKY = [{"role": "developer", "content": "Be brief."},
          {"role": "system", "content": [{"type": "text", "text": "Second system block."}]},
          {"role": "user", "content": [{"type": "text", "text": "Fix f.py."}, {"type": "input_text", "text": "Now."}]}]


def quirky_session(gw) -> tuple[object, list[list[dict]]]:
    """A tool loop whose requests carry what ``prepare`` rewrites (a developer role, two leading system blocks,
    content parts, a system message mid-conversation), each request the previous one plus new messages."""
    sent = []

    async def play():
        s = gw.start_session("q")
        msgs = [dict(m) for m in QUIRKY]
        for turn in range(4):
            sent.append([dict(m) for m in msgs])
            r = await gw.complete(s, ChatRequest("chat", sent[-1], tools=TOOLS))
            msgs.append(dict(r.call.reply))
            msgs += [{"role": "tool", "tool_call_id": c["id"], "content": [{"type": "text", "text": "ok"}]}
                     for c in r.tool_calls]
            if turn == 1:
                msgs.append({"role": "system", "content": "Budget: 2 calls left."})
        return s

    return asyncio.run(play()), sent


@pytest.mark.timeout(120)
def test_preparing_only_the_new_messages_is_preparing_them_all(tiny_tokenizer):
    from envhub.gateway.messages import prepare

    gw = Gateway(ScriptedBackend(always_a_tool), tiny_tokenizer, drift_every=1)
    s, sent = quirky_session(gw)
    assert [c.request for c in s.calls] == [prepare(m) for m in sent]
    assert all(c.parent is not None for c in s.calls[1:]) and gw.prepare_memo  # spliced; every check agreed
    assert any(m["content"].startswith("<system-reminder>") for m in s.calls[-1].request)


@pytest.mark.timeout(120)
def test_a_malformed_new_message_is_named_by_its_own_index(tiny_tokenizer):
    from envhub.gateway.messages import BadRequest

    gw = Gateway(ScriptedBackend(always_a_tool), tiny_tokenizer)
    s, sent = quirky_session(gw)
    bad = sent[-1] + [dict(s.calls[-1].reply), {"role": "tool", "content": [{"type": "image_url"}]}]
    with pytest.raises(BadRequest, match=rf"messages\[{len(bad) - 1}\]"):
        asyncio.run(gw.complete(s, ChatRequest("chat", bad, tools=TOOLS)))


@pytest.mark.timeout(120)
def test_break_it_a_memo_that_drops_a_message_is_caught_and_turned_off(tiny_tokenizer, monkeypatch, caplog):
    """The full pass on each drift check catches a memo that disagrees (here: every new message but the first
    dropped), logs it, and prepares every later request whole."""
    from envhub.gateway import calls

    real = calls.prepare

    def lossy(messages):
        out = real(messages)
        return out[:2] if messages and messages[0] is calls._HISTORY else out

    monkeypatch.setattr(calls, "prepare", lossy)
    gw = Gateway(ScriptedBackend(always_a_tool), tiny_tokenizer, drift_every=1)
    with caplog.at_level("WARNING"):
        quirky_session(gw)
    assert not gw.prepare_memo and "preparing every request whole" in caplog.text


@pytest.mark.timeout(120)
def test_tools_reordered_mid_session_are_keyed_as_sent(tiny_tokenizer):
    """Equal as dicts is not rendered alike: tools whose keys come in another order render (``tojson``) in that
    order, so a call's tools key is always its own request's, never a remembered equal-looking one."""
    from envhub.gateway.calls import tools_key

    gw = Gateway(ScriptedBackend(always_a_tool), tiny_tokenizer)
    fn = TOOLS[0]["function"]
    reordered = [{"function": {"parameters": fn["parameters"], "description": fn["description"], "name": fn["name"]},
                  "type": "function"}]
    assert reordered == TOOLS and tools_key(reordered) != tools_key(TOOLS)

    async def play():
        s = gw.start_session("r")
        msgs = [{"role": "user", "content": "Fix f.py."}]
        for tools in (TOOLS, reordered):
            await gw.complete(s, ChatRequest("chat", [dict(m) for m in msgs], tools=tools))
        return s

    s = asyncio.run(play())
    assert [c.tools_key for c in s.calls] == [tools_key(TOOLS), tools_key(reordered)]
