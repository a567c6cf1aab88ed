"""The scripted (golden) backend plays a policy through the real tokenizer and the real codec."""
from __future__ import annotations

import pytest

from envhub.backends.base import SamplingParams
from envhub.backends.scripted import ScriptedBackend, encode
from envhub.env import Action
from envhub.policy import call, finish, script, turns_taken


def _ids(codec, action):
    return encode(codec.tokenizer, codec.render_action(Action.coerce(action)))


async def test_plays_the_rendered_action_then_eos(codec):
    action = call("bash", command="ls -la /tmp")
    backend = ScriptedBackend(script([action]))
    backend.open_session("s", task={"task_id": "t"}, messages=[{"role": "user", "content": "go"}], codec=codec)
    gen = await backend.generate([1, 2, 3], SamplingParams(), session_id="s")
    expected = _ids(codec, action)
    assert gen.token_ids == expected + [codec.eos_token_ids[0]]
    assert gen.logprobs == [0.0] * len(gen.token_ids)
    assert gen.finish_reason == "stop"
    # the ids decode back to the model-format text, tool call included
    text = codec.tokenizer.decode(gen.token_ids[:-1])
    assert "bash" in text and "ls -la /tmp" in text


async def test_follows_the_live_conversation(codec):
    """The policy sees what the executor appends to the live list: a reactive policy reads the env's replies."""
    seen = []

    def policy(task, messages):
        seen.append(len(messages))
        return f"turn {turns_taken(messages)} after {messages[-1]['content']}"

    live = [{"role": "user", "content": "start"}]
    backend = ScriptedBackend(policy)
    backend.open_session("s", task={}, messages=live, codec=codec)
    g1 = await backend.generate([], SamplingParams(), session_id="s")
    live += [{"role": "assistant", "content": "turn 0 after start"}, {"role": "user", "content": "reply-1"}]
    g2 = await backend.generate([], SamplingParams(), session_id="s")
    assert codec.tokenizer.decode(g1.token_ids[:-1]) == "turn 0 after start"
    assert codec.tokenizer.decode(g2.token_ids[:-1]) == "turn 1 after reply-1"
    assert seen == [1, 3]


async def test_max_tokens_cuts_without_eos(codec):
    action = "The answer is 42 because we add the numbers step by step."
    full = _ids(codec, action)
    backend = ScriptedBackend(script([action]))
    backend.open_session("s", task={}, messages=[], codec=codec)
    gen = await backend.generate([], SamplingParams(max_tokens=5), session_id="s")
    assert gen.token_ids == full[:5] and gen.finish_reason == "length"
    # exactly the text's length: no room for the end-of-turn token, so it is still a length cut
    gen = await backend.generate([], SamplingParams(max_tokens=len(full)), session_id="s")
    assert gen.token_ids == full and gen.finish_reason == "length"
    gen = await backend.generate([], SamplingParams(max_tokens=len(full) + 1), session_id="s")
    assert gen.token_ids == full + [codec.eos_token_ids[0]] and gen.finish_reason == "stop"


async def test_stop_string_cuts_after_the_completing_token(codec):
    action = "Let me think. The answer is 42. Done here."
    full = _ids(codec, action)
    backend = ScriptedBackend(script([action]))
    backend.open_session("s", task={}, messages=[], codec=codec)
    gen = await backend.generate([], SamplingParams(stop=["is 42"]), session_id="s")
    assert gen.finish_reason == "stop"
    assert gen.token_ids == full[: len(gen.token_ids)]  # a prefix of the turn, no EOS appended
    text = codec.tokenizer.decode(gen.token_ids)
    assert text.endswith("42") or "is 42" in text
    assert "is 42" not in codec.tokenizer.decode(gen.token_ids[:-1])  # the last token completed it
    # a stop string that never occurs changes nothing
    gen = await backend.generate([], SamplingParams(stop=["zzz"]), session_id="s")
    assert gen.token_ids == full + [codec.eos_token_ids[0]]


async def test_stop_token_ids(codec):
    action = "alpha beta gamma"
    full = _ids(codec, action)
    backend = ScriptedBackend(script([action]))
    backend.open_session("s", task={}, messages=[], codec=codec)
    gen = await backend.generate([], SamplingParams(stop_token_ids=[full[1]]), session_id="s")
    assert gen.token_ids == full[:2] and gen.finish_reason == "stop"


async def test_script_ends_with_finish_and_sessions_are_separate(codec):
    backend = ScriptedBackend(script(["first"]))
    a, b = [], []
    backend.open_session("a", task={}, messages=a, codec=codec)
    backend.open_session("b", task={}, messages=b, codec=codec)
    ga = await backend.generate([], SamplingParams(), session_id="a")
    a.append({"role": "assistant", "content": "first"})
    ga2 = await backend.generate([], SamplingParams(), session_id="a")
    gb = await backend.generate([], SamplingParams(), session_id="b")
    assert ga.token_ids == gb.token_ids  # b is still at its first turn
    assert ga2.token_ids == _ids(codec, finish()) + [codec.eos_token_ids[0]]
    backend.close_session("a")
    assert backend.open_sessions == 1


async def test_unknown_session_and_bad_policy_are_clear_errors(codec):
    backend = ScriptedBackend(script(["x"]))
    with pytest.raises(RuntimeError, match="open_session"):
        await backend.generate([], SamplingParams(), session_id="nope")
    with pytest.raises(TypeError, match="policy"):
        ScriptedBackend("not a policy")
    with pytest.raises(ValueError, match="codec"):
        backend.open_session("s", task={}, messages=[])


async def test_golden_backend_plays_the_env_of_each_session(codec):
    """The service's GoldenBackend plays, in each session, the golden of the env ``spec_of(session_id)`` names (the
    service passes its job table); sessions of different envs open at once never play each other's."""
    from types import SimpleNamespace

    from envhub.service.golden import GoldenBackend

    with pytest.raises(RuntimeError, match="spec_of.*ScriptedBackend\\(spec.golden\\)"):  # outside the service
        GoldenBackend().open_session("s", task={}, messages=[], codec=codec)
    envs = {f"job-{answer}": SimpleNamespace(golden=lambda task, messages, a=answer: a)
            for answer in ("first env", "second env")}
    backend = GoldenBackend(envs.__getitem__)
    for sid in envs:  # both open before either plays
        backend.open_session(sid, task={}, messages=[{"role": "user", "content": "go"}], codec=codec)
    for sid in reversed(list(envs)):
        gen = await backend.generate([1], SamplingParams(), session_id=sid)
        assert gen.token_ids == _ids(codec, sid.removeprefix("job-")) + [codec.eos_token_ids[0]]
    for sid in envs:
        backend.close_session(sid)
    assert backend.open_sessions == 0
    with pytest.raises(KeyError):  # a session that is no job: refused when it opens
        backend.open_session("job-unknown", task={}, messages=[], codec=codec)
