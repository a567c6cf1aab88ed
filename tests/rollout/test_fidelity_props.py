"""Token fidelity, property-tested on two real chat templates (Qwen2.5 ChatML with tools, Llama-3.1).

Random multi-turn scripts -- assistant text with unicode and special-token look-alikes, sampled as canonical,
byte-by-byte, split, or arbitrary id sequences (which re-encode to other ids), random tool calls, random env
replies, turns ending on the end-of-turn token, on another EOS, on a stop string, or cut by length -- are assembled
as the executor assembles them. Then: the fidelity check passes, an independent oracle (transformers'
``apply_chat_template``) agrees with every env span, and mutations (a flipped mask bit, a re-tokenized span, shifted
logprobs) are caught.
"""
from __future__ import annotations

import random

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rollout_sim import TOOLS, Turn, assemble, byte_ids, oracle_env_text, split_ids

from envhub.env import Action, ToolCall
from envhub.rollout.fidelity import FidelityError, assert_faithful, check_trajectory
from envhub.rollout.trajectory import Trajectory

SETTINGS = settings(max_examples=int(__import__("os").environ.get("ENVHUB_FIDELITY_EXAMPLES", "40")), deadline=None, suppress_health_check=list(HealthCheck))

FRAGMENTS = ["\n", " ", "  ", "\t", "é", "中文", "🙂", "{", "}", '"', "\\", "<|im_end|>", "<|eot_id|>", "<tool_call>",
             "</tool_call>", "<|im_start|>", "<|python_tag|>", "\r\n", "\u0301", "answer", " the", "42"]
texts = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=6), max_size=8).map("".join)
OTHER_EOS = {"chatml": "<|endoftext|>", "llama3": "<|eom_id|>"}


def _tokenize(draw, codec, tok, text: str) -> list[int]:
    how = draw(st.sampled_from(["canonical", "bytes", "split", "random"]))
    if how == "canonical":
        return codec.encode(text)
    if how == "bytes":
        return byte_ids(tok, text)
    if how == "split":
        return split_ids(codec, text, draw(st.lists(st.integers(0, max(len(text), 1)), max_size=4)))
    # arbitrary sampled ids (any non-EOS token, special ones included): may decode to invalid UTF-8
    pool = [i for i in range(len(tok)) if i not in codec.eos_token_ids]
    return draw(st.lists(st.sampled_from(pool), min_size=1, max_size=12))


def _reply(draw, family):
    contents = draw(st.lists(texts, min_size=1, max_size=3))
    kind = draw(st.sampled_from(["user", "user", "empty"]))

    def reply(action: Action) -> list[dict]:
        if action.tool_calls:
            return [{"role": "tool", "tool_call_id": c.id, "name": c.name, "content": contents[i % len(contents)]}
                    for i, c in enumerate(action.tool_calls)]
        if kind == "empty" and family == "chatml":
            return []
        return [{"role": "user", "content": contents[0]}]

    return reply


def _script(draw, codec, tok, family, *, zero_logprobs=False, final_reply_gp=None) -> tuple[list[dict], list[Turn]]:
    opening = ([{"role": "system", "content": draw(texts)}] if draw(st.booleans()) else []) + \
              [{"role": "user", "content": draw(texts)}]
    n = draw(st.integers(1, 4))
    turns = []
    for k in range(n):
        kind = draw(st.sampled_from(["text", "calls", "calls"]))
        if kind == "calls":
            calls = [ToolCall(draw(st.sampled_from(["bash", "finish", "nope"])),
                              {draw(st.sampled_from(["cmd", "answer"])): draw(texts.filter(lambda s: "tool_call>" not in s))})
                     for _ in range(1 if family == "llama3" else draw(st.integers(1, 3)))]
            text = codec.render_action(Action(draw(texts.filter(lambda s: "tool_call>" not in s)), calls))
        else:
            text = draw(texts)
        ending = draw(st.sampled_from(["eot", "eot", "other_eos", "stop", "length"] if k == n - 1 else
                                      ["eot", "eot", "other_eos", "stop"]))
        stop = []
        if ending == "stop":
            stop = [draw(st.sampled_from(["</tool_call>", "STOP", "\n\n"]))]
            text += stop[0]
        ids = _tokenize(draw, codec, tok, text)
        if ending == "eot":
            ids += [codec.end_of_turn_id]
        elif ending == "other_eos":
            ids += [tok.convert_tokens_to_ids(OTHER_EOS[family])]
        lps = [0.0] * len(ids) if zero_logprobs else [-round(random.Random(i * 7 + k).uniform(0.01, 5), 4) for i in range(len(ids))]
        last_no_reply = k == n - 1 and final_reply_gp is None and draw(st.booleans())
        turns.append(Turn(ids, lps, None if last_no_reply else _reply(draw, family), stop,
                          "length" if ending == "length" else "stop"))
    return opening, turns


@st.composite
def scripts(draw, codec, tok, family, **kw):
    return _script(draw, codec, tok, family, **kw)


@SETTINGS
@given(data=st.data())
@pytest.mark.slow
def test_random_scripts_are_faithful(data, codec, tok, family):
    final = data.draw(st.sampled_from([None, True, False]))
    opening, turns = data.draw(scripts(codec, tok, family, final_reply_gp=final))
    traj, gens, replies = assemble(codec, opening, turns, final_reply_gp=final)

    assert check_trajectory(traj, codec, generations=gens) == []
    assert check_trajectory(traj, codec) == []
    assert check_trajectory(traj, tok, tools=TOOLS) == []
    # sampled ids sit unchanged, in order, in the mask-1 spans
    spans = [traj.response_ids[a:b] for a, b in traj.action_ranges]
    assert spans == [g.token_ids for g in gens if g.token_ids]
    # independent oracle: each env span is what transformers' apply_chat_template renders after that turn
    turn_idx = [i for i, m in enumerate(traj.messages) if m["role"] == "assistant"]
    for r in replies:
        k = r["turn"]
        history = traj.messages[: turn_idx[k] + 1]
        gp = k < len(turns) - 1 or bool(final)
        want = oracle_env_text(tok, TOOLS, history, r["messages"], codec.end_of_turn,
                               sampled_eos=gens[k].token_ids[-1:] == [codec.end_of_turn_id], add_generation_prompt=gp)
        assert codec.decode(r["ids"]) == tok.decode(tok.encode(want, add_special_tokens=False), skip_special_tokens=False)
    # a dataset row / JSON round trip keeps it faithful
    assert check_trajectory(Trajectory.from_row(traj.to_row()), codec) == []


@SETTINGS
@given(data=st.data())
def test_canonical_golden_scripts_equal_one_shot_rendering(data, codec, tok, family):
    """With canonical ids that end on the end-of-turn token, the record is exactly the template's tokenization of
    the whole conversation (apply_chat_template), so delta tokenization adds and drops nothing."""
    from envhub.codec.chat import normalize_messages

    words = st.lists(st.sampled_from(["ls", "the", "answer", "é", "42", "x.py", "中文", "🙂"]), min_size=1, max_size=4).map(" ".join)
    opening = [{"role": "user", "content": data.draw(words)}]
    turns = []
    for _ in range(data.draw(st.integers(1, 3))):
        action = Action("", [ToolCall(data.draw(st.sampled_from(["bash", "finish"])), {"cmd": data.draw(words)})])
        ids = codec.action_ids(action)
        content = data.draw(words)
        turns.append(Turn(ids, [0.0] * len(ids), lambda a, c=content: [
            {"role": "tool", "tool_call_id": a.tool_calls[0].id, "name": a.tool_calls[0].name, "content": c}]))
    traj, gens, _ = assemble(codec, opening, turns, final_reply_gp=True)
    want = tok.apply_chat_template(normalize_messages(traj.messages), tools=TOOLS, add_generation_prompt=True,
                                   tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert traj.prompt_ids + traj.response_ids == list(want)


def _valid(data, codec, tok, family, **kw):
    opening, turns = data.draw(scripts(codec, tok, family, final_reply_gp=True, **kw))
    traj, gens, _ = assemble(codec, opening, turns, final_reply_gp=True)
    return traj, gens


def _copy(traj: Trajectory, **changes) -> Trajectory:
    return Trajectory.from_dict({**traj.to_dict(), **changes})


@SETTINGS
@given(data=st.data(), zero=st.booleans())
@pytest.mark.slow
def test_flipped_mask_bit_is_caught(data, codec, tok, family, zero):
    traj, gens = _valid(data, codec, tok, family, zero_logprobs=zero)
    if not traj.response_mask:
        return
    i = data.draw(st.integers(0, len(traj.response_mask) - 1))
    mask = list(traj.response_mask)
    mask[i] = 1 - mask[i]
    lps = list(traj.response_logprobs)
    bad = _copy(traj, response_mask=mask, response_logprobs=lps)
    assert check_trajectory(bad, codec, generations=gens)
    if mask[i] == 0 and not zero:
        # Without the generations, a sampled token turned env token is still caught by its logprob. (With zero
        # logprobs a flip at a turn boundary can be a consistent record -- "the env supplied <|im_end|>" -- which
        # only the generations can refute.)
        assert check_trajectory(bad, codec)


@SETTINGS
@given(data=st.data())
@pytest.mark.slow
def test_retokenized_sampled_span_is_caught(data, codec, tok, family):
    traj, gens = _valid(data, codec, tok, family)
    candidates = [(k, r) for k, r in enumerate(traj.action_ranges)
                  if codec.encode(codec.decode(traj.response_ids[r[0]:r[1]])) != traj.response_ids[r[0]:r[1]]]
    if not candidates:
        return  # every span in this script happens to be canonical
    k, (a, b) = data.draw(st.sampled_from(candidates))
    again = codec.encode(codec.decode(traj.response_ids[a:b]))  # what a decode/re-encode pipeline would record
    ids = traj.response_ids[:a] + again + traj.response_ids[b:]
    mask = traj.response_mask[:a] + [1] * len(again) + traj.response_mask[b:]
    lps = traj.response_logprobs[:a] + [-0.5] * len(again) + traj.response_logprobs[b:]
    bad = _copy(traj, response_ids=ids, response_mask=mask, response_logprobs=lps)
    assert any("changed" in p or "differ" in p for p in check_trajectory(bad, codec, generations=gens))


@SETTINGS
@given(data=st.data())
def test_retokenized_env_span_is_caught(data, codec, tok, family):
    traj, gens = _valid(data, codec, tok, family)
    if not traj.action_ranges:
        return
    a = traj.action_ranges[0][1]
    b = a
    while b < len(traj.response_mask) and traj.response_mask[b] == 0:
        b += 1
    span = traj.response_ids[a:b]
    text = codec.decode(span)
    # same text, other ids: every non-special piece byte by byte
    pieces, again = text, []
    specials = set(tok.all_special_tokens) | {"<tool_call>", "</tool_call>"}
    while pieces:
        hit = min(((pieces.find(s), s) for s in specials if s in pieces), default=(len(pieces), ""))
        again += byte_ids(tok, pieces[: hit[0]]) + (codec.encode(hit[1]) if hit[1] else [])
        pieces = pieces[hit[0] + len(hit[1]):]
    if again == span:
        return
    bad = _copy(traj, response_ids=traj.response_ids[:a] + again + traj.response_ids[b:],
                response_mask=traj.response_mask[:a] + [0] * len(again) + traj.response_mask[b:],
                response_logprobs=traj.response_logprobs[:a] + [0.0] * len(again) + traj.response_logprobs[b:])
    problems = check_trajectory(bad, codec)
    assert any("re-tokenized" in p for p in problems), problems
    assert check_trajectory(bad, codec, strict=False) == []  # the text itself is right


@SETTINGS
@given(data=st.data())
def test_shifted_logprobs_are_caught(data, codec, tok, family):
    traj, gens = _valid(data, codec, tok, family)
    lps = traj.response_logprobs
    shifted = [0.0] + lps[:-1]
    if shifted == lps:
        return
    bad = _copy(traj, response_logprobs=shifted)
    assert check_trajectory(bad, codec, generations=gens)
    if any(m == 0 and lp != 0.0 for m, lp in zip(traj.response_mask, shifted)):
        assert check_trajectory(bad, codec)  # without generations: a sampled logprob landed on an env token


def test_check_raises_on_request(codec, tok):
    ids = codec.action_ids("hello")
    traj, gens, _ = assemble(codec, [{"role": "user", "content": "hi"}], [Turn(ids, [-0.1] * len(ids), None)])
    assert_faithful(traj, codec, generations=gens)
    bad = _copy(traj, prompt_ids=traj.prompt_ids[:-1])
    try:
        assert_faithful(bad, codec)
    except FidelityError as e:
        assert "prompt_ids differ" in str(e) and e.problems
    else:
        raise AssertionError("a truncated prompt passed the check")
    assert any("lengths differ" in p for p in check_trajectory(_copy(traj, response_logprobs=[]), codec))
    assert any("generations" in p for p in check_trajectory(traj, codec, generations=gens * 2))
