"""#28 item 10: a call's tools key is remembered per distinct tool set, and a remembered key is exactly what
``json.dumps(tools, ensure_ascii=False)`` gives for the tools asked about (a wrong key would render the prompt, pick
the codec and store the trajectory's tools of another tool set)."""
from __future__ import annotations

import copy
import json

import pytest

from envhub.gateway import jsonkey, toolskey
from envhub.gateway.messages import BadRequest
from envhub.gateway.toolskey import tools_key

FN = {"name": "bash", "description": "Run a shell command. Ünïcode kept as is.",
      "parameters": {"type": "object", "properties": {"command": {"type": "string", "maxLength": 100}}}}
BASE = [{"type": "function", "function": FN}]


def variants() -> list:
    """Tool sets equal or nearly equal to BASE, each of which json.dumps writes differently."""
    reordered = [{"function": dict(reversed(list(FN.items()))), "type": "function"}]
    as_float = copy.deepcopy(BASE)
    as_float[0]["function"]["parameters"]["properties"]["command"]["maxLength"] = 100.0
    as_bool = copy.deepcopy(BASE)
    as_bool[0]["function"]["parameters"]["properties"]["command"]["maxLength"] = True
    one = copy.deepcopy(as_bool)
    one[0]["function"]["parameters"]["properties"]["command"]["maxLength"] = 1
    zero, negzero = copy.deepcopy(BASE), copy.deepcopy(BASE)
    zero[0]["function"]["parameters"]["properties"]["command"]["maxLength"] = 0.0
    negzero[0]["function"]["parameters"]["properties"]["command"]["maxLength"] = -0.0
    big = copy.deepcopy(BASE)
    big[0]["function"]["parameters"]["properties"]["command"]["maxLength"] = 2 ** 80
    inf = copy.deepcopy(BASE)
    inf[0]["function"]["parameters"]["properties"]["command"]["maxLength"] = float("inf")
    nan = copy.deepcopy(BASE)
    nan[0]["function"]["parameters"]["properties"]["command"]["maxLength"] = float("nan")
    null = copy.deepcopy(BASE)  # orjson writes NaN and inf as null: the same compact JSON as these three
    null[0]["function"]["parameters"]["properties"]["command"]["maxLength"] = None
    return [BASE, reordered, as_float, as_bool, one, zero, negzero, big, inf, nan, null, None, []]


@pytest.fixture(autouse=True, params=["orjson", "pydantic_core"])
def fresh(request, monkeypatch):
    """Every test here runs with each compact serialiser (jsonkey: orjson when installed, pydantic_core without)."""
    if request.param == "orjson":
        monkeypatch.setattr(jsonkey, "_orjson", pytest.importorskip("orjson"))
    else:
        monkeypatch.setattr(jsonkey, "_orjson", None)
    assert jsonkey.backend() == request.param
    monkeypatch.setattr(toolskey, "_TOOLS_KEYS", toolskey._ToolsKeys())
    return request.param


def _compact_keys(tool_sets) -> set:
    keys = set()
    for tools in tool_sets:
        try:
            keys.add(jsonkey.compact_json(tools))
        except Exception:  # noqa: BLE001, S112 -- not remembered (orjson: an int past 64 bits)
            continue
    return keys


def test_a_remembered_key_is_what_json_dumps_gives():
    """Each variant, asked twice in every order (the second time from memory), gets json.dumps' string."""
    vs = variants()
    for order in (vs, list(reversed(vs)), vs + vs):
        for tools in order:
            want = json.dumps(tools or [], ensure_ascii=False)
            assert tools_key(copy.deepcopy(tools)) == want, tools
    # every distinct compact key remembered once (orjson: NaN, inf and None share one; 2**80 is not remembered)
    assert len(toolskey._TOOLS_KEYS.entries) == len(_compact_keys(v for v in vs if v))


def test_values_that_write_the_same_compact_json_are_told_apart():
    """A set, a tuple and bytes write the compact JSON of a list or a string: each still gets json.dumps' own outcome
    (an error for the set and the bytes, the list's string for the tuple), before and after the list was seen."""
    as_list = [{"type": "function", "function": {"name": "f", "enum": [1, 2]}}]
    as_tuple = [{"type": "function", "function": {"name": "f", "enum": (1, 2)}}]
    as_set = [{"type": "function", "function": {"name": "f", "enum": {1, 2}}}]
    as_str = [{"type": "function", "function": {"name": "f"}}]
    as_bytes = [{"type": "function", "function": {"name": b"f"}}]
    for _ in range(2):
        assert tools_key(as_list) == json.dumps(as_list, ensure_ascii=False)
        assert tools_key(as_tuple) == json.dumps(as_tuple, ensure_ascii=False)
        with pytest.raises(TypeError):
            tools_key(as_set)
        assert tools_key(as_str) == json.dumps(as_str, ensure_ascii=False)
        with pytest.raises(TypeError):
            tools_key(as_bytes)


def test_a_lone_surrogate_is_refused_every_time():
    bad = [{"type": "function", "function": {"name": "f", "description": "\ud800"}}]
    for _ in range(2):
        with pytest.raises(BadRequest, match="lone UTF-16 surrogate"):
            tools_key(bad)


def test_memory_is_bounded():
    for i in range(toolskey._ToolsKeys.MAX * 3):
        tools_key([{"type": "function", "function": {"name": f"f{i}"}}])
    assert len(toolskey._TOOLS_KEYS.entries) == toolskey._ToolsKeys.MAX


def test_break_it_remembered_by_compact_json_alone_a_set_gets_the_lists_key(monkeypatch, fresh):
    """Without the equality check, a value the compact serialiser conflates with another gets that one's string:
    pydantic_core writes a set (json.dumps: TypeError) as a list; orjson writes NaN (json.dumps: NaN) as null."""
    monkeypatch.setattr(toolskey._ToolsKeys, "same", staticmethod(lambda remembered, tools: True))
    first = [{"type": "function", "function": {"name": "f", "enum": [1, 2] if fresh == "pydantic_core" else None}}]
    then = [{"type": "function", "function": {"name": "f", "enum": {1, 2} if fresh == "pydantic_core" else
                                              float("nan")}}]
    tools_key(first)
    assert tools_key(then) == json.dumps(first, ensure_ascii=False)


def test_break_it_remembered_by_a_key_blind_to_order_reordered_tools_get_the_first_string(monkeypatch):
    """Without a key that sees key order (here: sorted JSON), tools equal as dicts but sent in another order get the
    first set's string, which renders another prompt."""
    monkeypatch.setattr(toolskey, "_to_json", lambda v: json.dumps(v, sort_keys=True).encode())
    reordered = variants()[1]
    assert reordered == BASE
    tools_key(BASE)
    assert tools_key(reordered) != json.dumps(reordered, ensure_ascii=False)
