"""Unit tests of ``envhub.rollout.prorl``: the per-message cut is exact for any turn layout, and reversible."""
from __future__ import annotations

import random

import pytest

from envhub.rollout.prorl import prorl_messages, text_log


def layout(seed: int):
    """A random trajectory layout: prompt messages, turns (some sampling 0 tokens), env replies of 0..2 messages
    with 0..n template tokens (a reply with tokens but no message included), possibly trailing env messages."""
    rng = random.Random(seed)
    messages = [{"role": "system", "content": "s"}] * rng.randint(0, 1) + [{"role": "user", "content": "q"}]
    prompt_ids = [rng.randrange(1000) for _ in range(rng.randint(1, 9))]
    response_ids, logprobs, mask, turns = [], [], [], []
    n_turns = rng.randint(1, 5)
    for k in range(n_turns):
        n = rng.randint(0, 6)
        turns.append((len(messages), len(response_ids), len(response_ids) + n))
        messages.append({"role": "assistant", "content": f"a{k}"})
        response_ids += [rng.randrange(1000) for _ in range(n)]
        logprobs += [-rng.random() for _ in range(n)]
        mask += [1] * n
        env_msgs = [{"role": rng.choice(["user", "tool"]), "content": f"e{k}{j}"} for j in range(rng.randint(0, 2))]
        messages += env_msgs
        if k == n_turns - 1:
            break
        m = rng.randint(0 if not env_msgs else 1, 5)
        response_ids += [rng.randrange(1000) for _ in range(m)]
        logprobs += [0.0] * m
        mask += [0] * m
    return messages, turns, prompt_ids, response_ids, logprobs, mask


@pytest.mark.parametrize("seed", range(200))
def test_the_cut_is_exact_masked_right_and_reversible(seed):
    messages, turns, prompt_ids, response_ids, logprobs, mask = layout(seed)
    out, trailing = prorl_messages(messages, turns, prompt_ids, response_ids, logprobs)
    assert out[-1]["role"] == "assistant"
    assert sum((m["token_ids"] for m in out), []) == prompt_ids + response_ids
    first = next(i for i, m in enumerate(out) if m["role"] == "assistant")  # NeMo-RL's split
    assert sum((m["token_ids"] for m in out[:first]), []) == prompt_ids
    got_mask = sum(([int(m["role"] == "assistant")] * len(m["token_ids"]) for m in out[first:]), [])
    assert got_mask == mask  # verl's loss_mask
    got_lp = sum((m["logprobs"] if m["logprobs"] is not None else [0.0] * len(m["token_ids"]) for m in out[first:]),
                 [])
    assert got_lp == logprobs
    assert text_log(out, trailing) == messages


def test_no_model_call_means_no_messages_as_prorl():
    messages = [{"role": "user", "content": "q"}]
    assert prorl_messages(messages, [], [1, 2], [], []) == ([], messages)


def test_ids_after_the_last_turn_are_a_bug_not_silently_dropped():
    with pytest.raises(ValueError, match="after the last model call"):
        prorl_messages([{"role": "user"}, {"role": "assistant"}], [(1, 0, 2)], [1], [5, 6, 7], [0.0] * 3)


def test_a_few_shot_assistant_turn_in_the_prompt_stays_in_the_prompt():
    """A prompt holding an assistant message (few-shot): clients split at the first assistant message, so the
    prompt's ids must all sit before it, and that message must carry no tokens (nothing to train on)."""
    messages = [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "shot"},
                {"role": "user", "content": "q2"}, {"role": "assistant", "content": "a"}]
    out, _ = prorl_messages(messages, [(3, 0, 2)], [1, 2, 3], [7, 8], [-0.5, -0.25])
    first = next(i for i, m in enumerate(out) if m["role"] == "assistant")
    assert sum((m["token_ids"] for m in out[:first]), []) == [1, 2, 3] and out[first]["token_ids"] == []
    assert sum((m["token_ids"] for m in out), []) == [1, 2, 3, 7, 8]


@pytest.mark.parametrize("seed", range(50))
def test_the_shared_context_encoding_is_byte_for_byte_plain_json(seed):
    """``encode_result`` slices each ``input_ids`` from one encoding of the context: the bytes must equal the plain
    encoding, including for messages whose ``input_ids`` is not a prefix, and for content that imitates the
    placeholder (an env cannot forge one: the nonce is random)."""
    import json

    from envhub.service.jobs import _dumps, encode_result

    messages, turns, prompt_ids, response_ids, logprobs, _ = layout(seed)
    out, trailing = prorl_messages(messages, turns, prompt_ids, response_ids, logprobs)
    out.append({"role": "user", "content": "\x00deadbeefdeadbeef:1\x00", "input_ids": [prompt_ids[0] + 1]})
    if seed % 2:
        out[-2] = {**out[-2], "input_ids": [9, 9, 9]}  # not a prefix of the context: encoded as it is
    result = {"prompt_ids": prompt_ids, "response_ids": response_ids, "messages": out, "x": float("-inf")}
    assert encode_result(result) == _dumps(result).encode()
    assert json.loads(encode_result(result))["messages"] == json.loads(_dumps(result))["messages"]
