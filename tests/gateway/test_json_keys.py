"""#28 item 10: the opening cache keys a chain's opening by its messages' compact JSON (orjson when installed, else
pydantic_core: :mod:`envhub.gateway.jsonkey`) and serves a hit only when the messages equal that JSON parsed back.
A hit must be exactly what rendering the messages gives, whichever serialiser made the key: here the "render" is a
stand-in codec that writes ``json.dumps`` of the messages as its ids, so any two contexts ``json.dumps`` tells apart
render apart, and any wrong hit shows."""
from __future__ import annotations

import copy
import json

import pytest

from envhub.gateway import jsonkey
from envhub.gateway.calls import OpeningCache

pytestmark = pytest.mark.timeout(60)


class JsonCodec:
    """A codec whose rendering is ``json.dumps`` of the messages (as byte values), counting its renders."""

    def __init__(self) -> None:
        self.renders = 0

    def prompt_ids(self, context):
        self.renders += 1
        return list(json.dumps(context, ensure_ascii=False).encode())


@pytest.fixture(params=["orjson", "pydantic_core"])
def serialiser(request, monkeypatch):
    if request.param == "orjson":
        monkeypatch.setattr(jsonkey, "_orjson", pytest.importorskip("orjson"))
    else:
        monkeypatch.setattr(jsonkey, "_orjson", None)
    assert jsonkey.backend() == request.param
    return request.param


BASE = [{"role": "system", "content": "Be brief. Ünïcode kept."},
        {"role": "user", "content": "Fix f.py.", "meta": {"a": 1, "b": [1, 2]}}]


def variants() -> list:
    """Openings equal or nearly equal to BASE that json.dumps writes differently (or refuses), and some that the
    compact serialisers write alike: NaN, inf and None (orjson), a tuple and a list (both), bytes and str
    (pydantic_core)."""
    out = [BASE]

    def meta(value):
        v = copy.deepcopy(BASE)
        v[1]["meta"]["a"] = value
        return v

    out += [meta(v) for v in (1.0, True, 0.0, -0.0, 2 ** 80, float("inf"), float("nan"), None, (1, 2), [1, 2],
                              "x", b"x", {"b": 1, "a": 2}, {"a": 2, "b": 1})]
    out.append([dict(reversed(list(m.items()))) for m in BASE])  # same dicts, keys in another order
    return out


def _outcome(render, context):
    """The ids ``render(context)`` gives, or the type of its error."""
    try:
        return ("ids", render(context))
    except Exception as e:  # noqa: BLE001 -- the outcome compared, whatever it is
        return ("error", type(e).__name__)


def _rendered(context):
    return _outcome(JsonCodec().prompt_ids, context)


def _cached(cache, codec, context, tk="tools"):
    return _outcome(lambda c: cache.ids(codec, tk, c), context)


def test_every_hit_is_what_rendering_gives(serialiser):
    """Each variant asked in several orders, twice: the cache's answer (or error) is a fresh render's."""
    vs = variants()
    for order in (vs, list(reversed(vs)), vs + vs):
        cache, codec = OpeningCache(), JsonCodec()
        for context in order:
            assert _cached(cache, codec, context) == _rendered(context), (serialiser, context)
        assert cache.tokens == sum(len(ids) for _, ids in cache.entries.values())


def test_a_repeated_opening_is_rendered_once(serialiser):
    cache, codec = OpeningCache(), JsonCodec()
    for _ in range(5):
        assert cache.ids(codec, "t", copy.deepcopy(BASE)) == JsonCodec().prompt_ids(BASE)
    assert (codec.renders, cache.hits) == (1, 4)
    assert cache.ids(codec, "other tools", copy.deepcopy(BASE)) and codec.renders == 2  # the tools are in the key


def test_an_opening_json_dumps_alone_can_write_is_still_cached(serialiser):
    """An int past 64 bits (orjson refuses it) falls back to json.dumps' string as the key, as before."""
    big = copy.deepcopy(BASE)
    big[1]["meta"]["a"] = 2 ** 80
    cache, codec = OpeningCache(), JsonCodec()
    for _ in range(3):
        assert cache.ids(codec, "t", copy.deepcopy(big)) == JsonCodec().prompt_ids(big)
    assert codec.renders == 1


def test_a_value_that_never_equals_itself_is_rendered_every_time(serialiser):
    nan = copy.deepcopy(BASE)
    nan[1]["meta"]["a"] = float("nan")
    cache, codec = OpeningCache(), JsonCodec()
    for _ in range(3):
        assert cache.ids(codec, "t", nan) == JsonCodec().prompt_ids(nan)
    assert codec.renders == 3 and len(cache.entries) == 1  # replaced, not piled up


def test_the_bound_holds_when_an_entry_is_replaced(serialiser):
    cache, codec = OpeningCache(max_tokens=400), JsonCodec()
    for i in range(20):
        v = copy.deepcopy(BASE)
        v[1]["meta"]["a"] = float("nan") if i % 2 else i
        cache.ids(codec, "t", v)
        assert cache.tokens == sum(len(ids) for _, ids in cache.entries.values()) <= 400


def test_orjson_is_the_serialiser_when_installed():
    pytest.importorskip("orjson")
    assert jsonkey.backend() == "orjson"


def test_break_it_a_key_without_the_equality_check_serves_another_rendering(serialiser, monkeypatch):
    """Trusting the compact key alone, a conflated value gets the other one's ids: orjson writes NaN as null;
    pydantic_core writes bytes as a string (json.dumps refuses bytes)."""
    monkeypatch.setattr(OpeningCache, "same", staticmethod(lambda remembered, context: True))
    first, then = copy.deepcopy(BASE), copy.deepcopy(BASE)
    first[1]["meta"]["a"], then[1]["meta"]["a"] = (None, float("nan")) if serialiser == "orjson" else ("x", b"x")
    cache, codec = OpeningCache(), JsonCodec()
    cache.ids(codec, "t", first)
    assert _cached(cache, codec, then, "t") != _rendered(then)


def test_break_it_remembering_the_compact_key_parsed_back_lets_none_pass_for_nan(monkeypatch):
    """What is remembered must be ``json.dumps``' value: orjson's key parsed back holds None where the opening held
    NaN, and a later opening with None would be served NaN's rendering."""
    monkeypatch.setattr(jsonkey, "_orjson", pytest.importorskip("orjson"))
    from envhub.gateway import calls

    monkeypatch.setattr(calls, "remembered", lambda value: json.loads(jsonkey.compact_json(value)))
    nan, none = copy.deepcopy(BASE), copy.deepcopy(BASE)
    nan[1]["meta"]["a"], none[1]["meta"]["a"] = float("nan"), None
    cache, codec = OpeningCache(), JsonCodec()
    cache.ids(codec, "t", nan)
    assert _cached(cache, codec, none, "t") != _rendered(none)
