"""Split frame encoding (``envhub.codec.frame_ids``): fixed special-token runs encoded once, only the text around
each content per turn -- always the ids of the whole delta text, and refused where a token could straddle."""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from envhub.codec.chat import ChatCodec
from envhub.codec.frame_ids import FrameIds

OPENING = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Go."}]
CALL = {"id": "call_1_0", "type": "function", "function": {"name": "bash", "arguments": "{\"cmd\": \"ls\"}"}}
PARTS = ["a", "Z", "1", " ", "  ", "\n", "\n\n", "\t", "\r\n", ".", "'s", "word", " word", "é", "中", "🙂",
         "<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|start_header_id|>", "<tool_call>", "\x00", "\x1c"]
CONTENT = st.lists(st.sampled_from(PARTS), max_size=12).map("".join)

SHAPES = {  # reply shape -> (messages for contents, whether the assistant turn before it called a tool)
    "user": (lambda c: [{"role": "user", "content": c[0]}], False),
    "two users": (lambda c: [{"role": "user", "content": c[0]}, {"role": "user", "content": c[1]}], False),
    "tool": (lambda c: [{"role": "tool", "content": c[0], "tool_call_id": "call_1_0"}], True),
    "two tools": (lambda c: [{"role": "tool", "content": c[0], "tool_call_id": "call_1_0"},
                             {"role": "tool", "content": c[1], "tool_call_id": "call_1_1"}], True),
}


def _history(codec: ChatCodec, tool_call: bool) -> list[dict]:
    msg = {"role": "assistant", "content": "", "tool_calls": [CALL]} if tool_call else {"role": "assistant",
                                                                                          "content": "ok"}
    return [*OPENING, msg]


def _check(codec: ChatCodec, contents: list[str]) -> None:
    for name, (shape, tool_call) in SHAPES.items():
        history = _history(codec, tool_call)
        for eos in (True, False):
            for c in ([f"warm {i}", f"up {i}"] for i in range(4)):  # learn + verify the frame and its split
                codec.delta_ids(history, shape(c), sampled_eos=eos)
            new = shape(contents)
            want = codec.encode(codec.delta_text(history, new, sampled_eos=eos, exact=True))
            assert codec.delta_ids(history, new, sampled_eos=eos) == want, (name, eos, contents)


@settings(max_examples=60, deadline=None)
@given(contents=st.lists(CONTENT, min_size=2, max_size=2))
def test_split_ids_equal_the_whole_delta_text(codec, text_codec, contents):
    for c in (codec, text_codec):
        _check(c, contents)


def test_the_split_is_taken_on_the_hot_path(tiny_tokenizers):
    codec = ChatCodec(tiny_tokenizers["chatml"])
    history = _history(codec, False)
    for i in range(4):
        codec.delta_ids(history, [{"role": "user", "content": f"reply {i}"}], sampled_eos=True)
    plans = [p for p in codec._frame_ids.values() if p is not None]
    assert plans and plans[0].unverified == 0
    plan = plans[0]
    assert plan.tails == ["user\n"] and plan.heads == [""]  # "\n<|im_start|>" | "user\n" + content | "<|im_end|>..."
    assert codec.decode(plan.fixed[0]) == "\n<|im_start|>"
    assert codec.decode(plan.fixed[1]) == "<|im_end|>\n<|im_start|>assistant\n"


@settings(max_examples=25, deadline=None)
@given(contents=st.lists(CONTENT, min_size=2, max_size=2))
def test_split_ids_with_other_pipelines(built, contents):
    for name, (tok, _) in built.items():
        if name != "dropout":
            _check(ChatCodec.shared(tok), contents)


def test_a_token_that_could_straddle_a_boundary_refuses_the_split(built):
    tok, _ = built["newline-token"]  # "\n\n" is an added token; the ChatML frame has "\n" right before the content
    codec = ChatCodec(tok)
    history = _history(codec, False)
    for content in ["warm", "up", "\nstarts with a newline", "ends with one\n", "\n", ""]:
        new = [{"role": "user", "content": content}]
        want = codec.encode(codec.delta_text(history, new, sampled_eos=True, exact=True))
        assert codec.delta_ids(history, new, sampled_eos=True) == want
    assert list(codec._frame_ids.values()) == [None]


class _Words:
    def __init__(self, tokens):
        self.raw_tokens = tokens
        self.split_added = re.compile("(" + "|".join(map(re.escape, sorted(tokens, key=len, reverse=True))) + ")").split


def test_plan_refuses_straddles_and_pieces_without_tokens():
    pieces = ["\n<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n"]
    base = ["<|im_start|>", "<|im_end|>"]
    encode = lambda text: [len(text)]  # noqa: E731 (the plan only stores what encode returns)
    assert FrameIds.plan(pieces, False, _Words(base), encode) is not None
    assert FrameIds.plan(pieces, False, _Words(base + ["r\nX"]), encode) is None  # "r\n" ends the piece before
    assert FrameIds.plan(pieces, False, _Words(base + ["x<|im_end|>"]), encode) is None  # "<|im_end|>" starts the next
    assert FrameIds.plan(["\n<|im_start|>user\n", "\n\n", "<|im_end|>"], False, _Words(base), encode) is None
    assert FrameIds.plan(pieces, False, None, encode) is None  # no word path: the whole text is encoded


def test_rollouts_stay_faithful_on_every_pipeline(built):
    """End to end: the executor with the fast paths, graded by the fidelity check (which never uses them)."""
    import asyncio

    import envhub
    from envhub.backends.scripted import ScriptedBackend
    from envhub.rollout.executor import rollout_many
    from envhub.rollout.fidelity import check_trajectory
    from envhub.task import select

    spec = envhub.get_spec("guess-number")
    tasks = select(spec.load_tasks(), n=4)
    for name, (tok, _) in built.items():
        if name == "dropout":
            continue
        trajs = asyncio.run(rollout_many(spec, tasks, ScriptedBackend(spec.golden), tok))
        for t in trajs:
            assert t.finish_reason == "done" and t.passed, (name, t.error)
            assert check_trajectory(t, tok) == [], name
