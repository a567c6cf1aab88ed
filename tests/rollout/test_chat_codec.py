"""ChatCodec on real tokenizers and templates (Qwen2.5 ChatML with tools, Llama-3.1): prompt, delta, parse, render."""
from __future__ import annotations

import pytest
from rollout_sim import TOOLS
from hypothesis import given, settings
from hypothesis import strategies as st

from envhub.env import Action, ToolCall, ToolSpec
from envhub.codec.chat import ChatCodec, ChatTemplateError, normalize_messages

OPENING = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "List the files, then finish."}]


def test_prompt_ids_equal_apply_chat_template(tok, codec, text_codec):
    for c, kw in ((codec, {"tools": TOOLS}), (text_codec, {})):
        want = tok.apply_chat_template(OPENING, add_generation_prompt=True, tokenize=True, **kw)
        want = want["input_ids"] if isinstance(want, dict) or hasattr(want, "keys") else want
        assert c.prompt_ids(OPENING) == list(want)
        assert c.prompt_ids(OPENING) == tok.encode(c.render(OPENING, add_generation_prompt=True), add_special_tokens=False)


def test_end_of_turn_and_eos_ids(tok, codec, family):
    eot = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>"}[family]
    assert codec.end_of_turn == eot
    assert codec.eos_token_ids[0] == tok.convert_tokens_to_ids(eot)
    others = {"chatml": ["<|endoftext|>"], "llama3": ["<|end_of_text|>", "<|eom_id|>"]}[family]
    assert set(codec.eos_token_ids) == {tok.convert_tokens_to_ids(t) for t in [eot, *others]}


def test_delta_after_eos_and_after_stop_string(codec, family):
    action = Action("", [ToolCall("bash", {"cmd": "ls"})])
    ids = codec.action_ids(action)
    msg, parsed = codec.assistant_message(ids, turn=0)
    history = OPENING + [msg]
    new = [{"role": "tool", "tool_call_id": parsed.tool_calls[0].id, "name": "bash", "content": "a.txt"}]
    with_eos = codec.decode(codec.delta_ids(history, new, sampled_eos=True))
    without = codec.decode(codec.delta_ids(history, new, sampled_eos=False))
    if family == "chatml":
        assert with_eos == "\n<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        assert without == "<|im_end|>" + with_eos
    else:  # Llama-3.1: tool results in the ipython role, JSON-quoted (the template's `is iterable` quirk)
        assert with_eos == ('<|start_header_id|>ipython<|end_header_id|>\n\n"a.txt"<|eot_id|>'
                            "<|start_header_id|>assistant<|end_header_id|>\n\n")
        assert without == "<|eot_id|>" + with_eos
    no_gp = codec.decode(codec.delta_ids(history, new, sampled_eos=True, add_generation_prompt=False))
    assert with_eos.startswith(no_gp) and len(no_gp) < len(with_eos)


def test_golden_record_equals_one_shot_rendering(tok, codec):
    """Canonical golden turns through prompt + sampled + delta ids give exactly the template's full tokenization."""
    messages = [dict(m) for m in OPENING]
    record = codec.prompt_ids(messages)
    for k, action in enumerate([Action("", [ToolCall("bash", {"cmd": "ls -la"})]),
                                Action("", [ToolCall("finish", {"answer": "a.txt"})])]):
        ids = codec.action_ids(action)
        record += ids
        msg, parsed = codec.assistant_message(ids, turn=k)
        messages.append(msg)
        new = [{"role": "tool", "tool_call_id": parsed.tool_calls[0].id, "name": parsed.tool_calls[0].name,
                "content": f"result {k}\n  ok"}]
        record += codec.delta_ids(messages, new, sampled_eos=codec.ends_turn(ids))
        messages.extend(new)
    want = tok.apply_chat_template(normalize_messages(messages), tools=TOOLS, add_generation_prompt=True, tokenize=True)
    want = want["input_ids"] if hasattr(want, "keys") else want
    assert record == list(want)


def test_assistant_message_strips_eos_parses_and_names_calls(codec, family):
    action = Action("", [ToolCall("finish", {"answer": "42"})])
    ids = codec.action_ids(action)
    assert ids[-1] == codec.end_of_turn_id and codec.ends_turn(ids)
    msg, parsed = codec.assistant_message(ids, turn=3)
    assert parsed.tool_calls == [ToolCall("finish", {"answer": "42"}, id="call_3_0")]
    assert msg["role"] == "assistant" and msg["tool_calls"][0]["function"] == {"name": "finish", "arguments": '{"answer": "42"}'}
    _, again = codec.assistant_message(ids)
    _, same = codec.assistant_message(ids)
    assert again.tool_calls[0].id == same.tool_calls[0].id and again.tool_calls[0].id.startswith("call_")


def test_assistant_message_stop_string_cuts_text_after_it(codec):
    text = 'Checking.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>tail'
    ids = codec.encode(text)  # generation stopped on "</tool_call>"; the last token may run past it
    msg, action = codec.assistant_message(ids, stop=["</tool_call>"])
    if codec.parser.name == "hermes":
        assert action.tool_calls == [ToolCall("bash", {"cmd": "ls"}, id=action.tool_calls[0].id)]
        assert "tail" not in msg["content"]
    assert not codec.ends_turn(ids)


def test_no_tools_means_plain_text(text_codec):
    ids = text_codec.encode('<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>') + [text_codec.end_of_turn_id]
    msg, action = text_codec.assistant_message(ids)
    assert action.tool_calls == [] and action.text.startswith("<tool_call>") and "tool_calls" not in msg
    assert text_codec.render_action("just text") == "just text"


def test_toolspec_tools_are_accepted(tok):
    spec = ToolSpec("bash", "Run a shell command.", {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                      "required": ["cmd"]})
    assert ChatCodec(tok, tools=[spec]).prompt_ids(OPENING) == ChatCodec(tok, tools=[TOOLS[0]]).prompt_ids(OPENING)


def test_history_must_end_with_the_assistant_turn(codec):
    with pytest.raises(ChatTemplateError, match="must end with the assistant message"):
        codec.delta_ids(OPENING, [{"role": "user", "content": "x"}], sampled_eos=True)


REWRITING = (  # like Qwen3: earlier assistant turns lose their reasoning once a later message follows
    "{% for m in messages %}{% if m.role == 'assistant' and not loop.last %}"
    "{{ '<|im_start|>assistant\\n' + m.content.split('</think>')[-1] + '<|im_end|>\\n' }}"
    "{% else %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_template_rewriting_earlier_turns_is_a_clear_error(tiny_tokenizers):
    codec = ChatCodec(tiny_tokenizers["chatml"], chat_template=REWRITING)
    msg, _ = codec.assistant_message(codec.encode("<think>hmm</think>4") + [codec.end_of_turn_id])
    with pytest.raises(ChatTemplateError, match="re-renders earlier turns"):
        codec.delta_ids(OPENING + [msg], [{"role": "user", "content": "and 5?"}], sampled_eos=True)


def test_missing_template_and_unrenderable_conversation(tiny_tokenizers):
    tok = tiny_tokenizers["llama3"]
    saved = tok.chat_template
    try:
        tok.chat_template = None
        with pytest.raises(ChatTemplateError, match="no chat template"):
            ChatCodec(tok)
    finally:
        tok.chat_template = saved
    codec = ChatCodec(tok, tools=TOOLS)
    two_calls = {"role": "assistant", "content": "", "tool_calls": [
        ToolCall("bash", {"cmd": "ls"}, "a").to_openai(), ToolCall("bash", {"cmd": "pwd"}, "b").to_openai()]}
    with pytest.raises(ChatTemplateError, match="single tool-calls"):  # Llama-3.1 renders one call per turn
        codec.render(OPENING + [two_calls])


def test_render_action_formats_per_family(codec, family):
    action = Action("", [ToolCall("bash", {"cmd": "echo é"})])
    want = {"chatml": '<tool_call>\n{"name": "bash", "arguments": {"cmd": "echo é"}}\n</tool_call>',
            "llama3": '{"name": "bash", "parameters": {"cmd": "echo é"}}'}[family]
    assert codec.render_action(action) == want
    assert codec.action_ids(action) == codec.encode(want) + [codec.end_of_turn_id]


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=60) | st.sampled_from(["<|im_end|>x", "a<|eot_id|>\n", "\r\n\t é🙂", "<tool_call>"]))
def test_fast_encoder_equals_tokenizer_encode(tiny_tokenizers, text):
    for tok in tiny_tokenizers.values():
        codec = ChatCodec(tok)
        assert codec.encode(text) == tok.encode(text, add_special_tokens=False)


NUMBERED = (  # looks local, but numbers every message: a window of the history would number them wrongly
    "{% for m in messages %}{{ '<|im_start|>' + m.role + ' ' + loop.index|string + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _long_history(codec, turns=4):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "go"}]
    for k in range(turns):
        msg, _ = codec.assistant_message(codec.encode(f"step {k}") + [codec.end_of_turn_id])
        messages += [msg, {"role": "user", "content": f"ok {k}"}]
    msg, _ = codec.assistant_message(codec.encode("last") + [codec.end_of_turn_id])
    return messages + [msg]


def test_windowed_delta_equals_full_rendering(codec, text_codec):
    for c in (codec, text_codec):
        history = _long_history(c)
        new = [{"role": "user", "content": "next é"}]
        assert c.delta_window
        for eos in (True, False):
            assert c.delta_ids(history, new, sampled_eos=eos) == c.delta_ids(history, new, sampled_eos=eos, exact=True)


def test_window_is_verified_and_dropped_when_it_disagrees(tiny_tokenizers):
    from envhub.codec.chat import window_safe

    codec = ChatCodec(tiny_tokenizers["chatml"], chat_template=NUMBERED)
    assert window_safe(NUMBERED) and codec.delta_window
    history = _long_history(codec)
    new = [{"role": "user", "content": "x"}]
    got = codec.delta_ids(history, new, sampled_eos=True)
    assert codec.decode(got) == f"\n<|im_start|>user {len(history) + 1}\nx<|im_end|>\n<|im_start|>assistant\n"
    assert codec.delta_window is False  # the first comparison with the full rendering turned it off
    assert ChatCodec(tiny_tokenizers["chatml"], chat_template="{% set ns = namespace(x=0) %}" + NUMBERED).delta_window is False


def test_renders_tools_flag(tok, codec, text_codec):
    assert codec.renders_tools and not text_codec.renders_tools
    plain = ChatCodec(tok, tools=TOOLS, chat_template=NUMBERED)  # a template with no tool support
    assert plain.renders_tools is False and plain.parser.name == "json"


def test_frames_fill_env_replies_exactly_as_the_template_renders_them(tiny_tokenizers):
    """The frame fast path (envhub.codec.frames) on both real templates: verbatim (ChatML) and trimmed (Llama)."""
    for name, tools in (("chatml", TOOLS), ("llama3", TOOLS), ("chatml", None)):
        codec = ChatCodec(tiny_tokenizers[name], tools=tools)
        history = [{"role": "user", "content": "start"}, {"role": "assistant", "content": "first"}]
        for i, content in enumerate(["  padded reply \n", "second", "x" * 50, "ünïcode 🙂", ""]):
            new = [{"role": "user", "content": content}]
            fast = codec.delta_text(history, new, sampled_eos=True)
            assert fast == codec.delta_text(history, new, sampled_eos=True, exact=True), (name, content)
            history = history + new + [{"role": "assistant", "content": f"answer {i}"}]
        learned = [f for f in codec._frames.values() if f is not None]
        assert learned and all(f.unverified == 0 for f in learned), name
        assert learned[0].strip == (name == "llama3")
