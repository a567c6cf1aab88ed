"""Tool-call parsers: Hermes/Qwen tags, plain JSON, Llama-3.1 JSON; malformed input gives a marked Action."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envhub.env import Action, ToolCall
from envhub.codec import toolcall
from envhub.codec.toolcall import auto_parser_name, get_parser, register_parser
from envhub.testing.models import CHATML_TEMPLATE, LLAMA3_TEMPLATE


# ---- hermes ------------------------------------------------------------------------------------------------------
def test_hermes_several_calls_and_content():
    text = ('I will look first.\n<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "finish", "arguments": {"answer": "42"}}\n</tool_call>')
    a = get_parser("hermes").parse(text)
    assert a.parse_error is None
    assert [(c.name, c.arguments) for c in a.tool_calls] == [("bash", {"cmd": "ls"}), ("finish", {"answer": "42"})]
    assert a.text == "I will look first."


def test_hermes_unclosed_last_block_parses():
    # generation stopped on the "</tool_call>" stop string with the stop string cut, or cut by length
    a = get_parser("hermes").parse('<tool_call>\n{"name": "bash", "arguments": {"cmd": "pwd"}}\n')
    assert a.tool_calls == [ToolCall("bash", {"cmd": "pwd"})]


def test_hermes_no_tags_is_plain_text_unchanged():
    text = "  The answer is {42}.\n"
    a = get_parser("hermes").parse(text)
    assert (a.text, a.tool_calls, a.parse_error) == (text, [], None)


@pytest.mark.parametrize("body,why", [
    ('{"name": "bash", "arguments": {"cmd": "ls"', "invalid JSON"),
    ('{"arguments": {"cmd": "ls"}}', "missing function name"),
    ('{"name": "", "arguments": {}}', "missing function name"),
    ('{"name": "bash", "arguments": [1, 2]}', "must be a JSON object"),
    ('{"name": "bash", "arguments": "not json"}', "not valid JSON"),
    ('["bash"]', "expected a JSON object"),
])
def test_hermes_malformed_keeps_valid_calls_and_explains(body, why):
    text = f'<tool_call>\n{{"name": "finish", "arguments": {{}}}}\n</tool_call>\n<tool_call>\n{body}\n</tool_call>'
    a = get_parser("hermes").parse(text)
    assert [c.name for c in a.tool_calls] == ["finish"]
    assert a.parse_error and why in a.parse_error and "tool call 2" in a.parse_error
    assert body in a.text  # the malformed block stays visible


def test_hermes_arguments_as_json_string_and_parameters_key():
    p = get_parser("hermes")
    a = p.parse('<tool_call>{"name": "bash", "arguments": "{\\"cmd\\": \\"ls\\"}"}</tool_call>')
    assert a.tool_calls == [ToolCall("bash", {"cmd": "ls"})]
    assert p.parse('<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>').tool_calls == [ToolCall("f", {"x": 1})]
    assert p.parse('<tool_call>{"name": "f"}</tool_call>').tool_calls == [ToolCall("f", {})]


# ---- json --------------------------------------------------------------------------------------------------------
def test_json_bare_object_list_and_fence():
    p = get_parser("json")
    assert p.parse('{"name": "finish", "arguments": {"answer": "7"}}').tool_calls == [ToolCall("finish", {"answer": "7"})]
    a = p.parse('[{"name": "a", "arguments": {}}, {"name": "b", "parameters": {"x": [1]}}]')
    assert [(c.name, c.arguments) for c in a.tool_calls] == [("a", {}), ("b", {"x": [1]})]
    a = p.parse('Sure.\n```json\n{"name": "bash", "arguments": {"cmd": "ls"}}\n```\nDone.')
    assert a.tool_calls == [ToolCall("bash", {"cmd": "ls"})] and a.text == "Sure.\n\nDone."


def test_json_embedded_in_prose_and_plain_prose():
    p = get_parser("json")
    a = p.parse('I call {"name": "bash", "arguments": {"cmd": "ls"}} now')
    assert a.tool_calls == [ToolCall("bash", {"cmd": "ls"})] and a.parse_error is None
    a = p.parse("x = {1, 2} and f(y) {")  # braces in prose are not calls, and not errors
    assert a.tool_calls == [] and a.parse_error is None and a.text == "x = {1, 2} and f(y) {"


@pytest.mark.parametrize("text", ['{"name": "bash", "arguments": ', '{"arguments": {}}', "[1, 2]",
                                  '```json\n{"name": 3}\n```', '{"name": "f", "arguments": 5}'])
def test_json_malformed_is_marked(text):
    a = get_parser("json").parse(text)
    assert a.tool_calls == [] and a.parse_error and a.parse_error.startswith("function call:")


# ---- llama3 ------------------------------------------------------------------------------------------------------
def test_llama3_call_python_tag_and_separators():
    p = get_parser("llama3")
    assert p.parse('{"name": "bash", "parameters": {"cmd": "ls"}}').tool_calls == [ToolCall("bash", {"cmd": "ls"})]
    assert p.parse('<|python_tag|>{"name": "f", "parameters": {}}').tool_calls == [ToolCall("f", {})]
    a = p.parse('{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}')
    assert [c.name for c in a.tool_calls] == ["a"] and "one tool call per turn" in a.parse_error
    assert [c.name for c in toolcall.Llama3Parser(max_calls=None).parse(
        '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {}}').tool_calls] == ["a", "b"]


def test_llama3_plain_text_and_errors():
    p = get_parser("llama3")
    assert p.parse("The answer is 4.").tool_calls == [] and p.parse("The answer is 4.").parse_error is None
    assert "invalid JSON" in p.parse('{"name": "a", "parameters": {').parse_error
    assert "after <|python_tag|>" in p.parse("<|python_tag|>print(1)").parse_error
    assert "missing function name" in p.parse('{"parameters": {}}').parse_error
    assert "unexpected text" in p.parse('{"name": "a", "parameters": {}} and more').parse_error


# ---- round trip, registry, auto ----------------------------------------------------------------------------------
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
_names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,15}", fullmatch=True)
_args = st.dictionaries(st.text(max_size=8), _json_values, max_size=4)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(["hermes", "json", "llama3"]),
       text=st.text(max_size=30).filter(
           lambda s: "<tool_call>" not in s and "```" not in s and "{" not in s and not s.strip().startswith("[")),
       calls=st.lists(st.tuples(_names, _args), min_size=0, max_size=3))
def test_format_then_parse_round_trips(name, text, calls):
    p = get_parser(name)
    if name == "llama3":
        calls = calls[:1]
        if calls:
            text = ""  # a Llama-3.1 call turn carries no other text
    action = Action(text.strip() if calls else text, [ToolCall(n, a) for n, a in calls])
    out = p.parse(p.format(action))
    assert out.parse_error is None
    assert [(c.name, c.arguments) for c in out.tool_calls] == calls
    assert out.text == action.text


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(["hermes", "json", "llama3"]), text=st.text(max_size=80))
def test_parsers_never_raise(name, text):
    for t in (text, "<tool_call>" + text, "{" + text, "<|python_tag|>" + text, "```json\n" + text + "```"):
        a = get_parser(name).parse(t)
        assert isinstance(a, Action) and all(isinstance(c.arguments, dict) for c in a.tool_calls)


def test_register_and_get_custom_parser():
    class Upper:
        def parse(self, text):
            return Action(text.upper())

        def format(self, action):
            return action.text

    register_parser("upper-test", Upper)
    try:
        assert get_parser("upper-test").parse("hi").text == "HI"
        assert isinstance(get_parser(Upper()), Upper)
    finally:
        toolcall._REGISTERED.pop("upper-test")
    with pytest.raises(KeyError, match="unknown tool-call parser 'nope'"):
        get_parser("nope")
    with pytest.raises(TypeError):
        get_parser(object())


def test_parser_from_plugin_hook():
    """A plugin module implementing ``envhub_tool_parsers`` contributes parsers by name."""
    import types

    from envhub.plugins import default_hub

    mod = types.ModuleType("envhub_parser_plugin_test")

    class Shout:
        def parse(self, text):
            return Action(text + "!")

        def format(self, action):
            return action.text

    mod.envhub_tool_parsers = lambda: {"shout-test": Shout}
    from envhub.hookspecs import hookimpl

    mod.envhub_tool_parsers = hookimpl(mod.envhub_tool_parsers)
    pm = default_hub().pm
    pm.register(mod)
    try:
        assert get_parser("shout-test").parse("hey").text == "hey!"
    finally:
        pm.unregister(mod)


def test_auto_parser_from_template():
    assert auto_parser_name(CHATML_TEMPLATE) == "hermes"
    assert auto_parser_name(LLAMA3_TEMPLATE) == "llama3"
    assert auto_parser_name("{{ messages }}") == "json"
    assert auto_parser_name(None) == "json"
