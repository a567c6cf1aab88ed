"""The key of a call's tool set (:func:`tools_key`): what a call's chain, codec and trajectory are keyed on."""
from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from envhub.gateway.jsonkey import compact_json
from envhub.gateway.messages import unicode_text

def tools_key(tools: list[dict[str, Any]] | None) -> str:
    """The tools as rendered: JSON in the request's own key order (never sorted: a template that ``tojson``s a tool
    renders its keys in that order, and the trajectory stores this string for the fidelity check to re-render).

    Remembered per distinct tool set (:class:`_ToolsKeys`): an agent sends the same tools with every call, and
    serialising ten tools again was ~4 % of the gateway's CPU per call (#28 item 10).

    Args:
        tools: OpenAI function tools, or ``None``.

    Returns:
        The JSON string (``"[]"`` for no tools).

    Raises:
        BadRequest: a tool holding a lone UTF-16 surrogate (no tokenizer could render it).
    """
    return _TOOLS_KEYS.get(tools)


class _ToolsKeys:
    """``json.dumps(tools, ensure_ascii=False)``, remembered by the tools' compact JSON (:mod:`envhub.gateway.jsonkey`:
    orjson, ~1/15 of the time, or ``pydantic_core``, ~1/4). A hit must be exact, and the compact JSON alone is not a
    key for every Python value (``{1, 2}``, ``(1, 2)`` and ``[1, 2]`` all write ``[1,2]``, ``b"x"`` writes ``"x"``), so a hit also requires the
    tools to equal the remembered JSON parsed back: ``==`` tells a set, tuple, bytes or any non-JSON object from a
    list or string, and the compact JSON tells what ``==`` does not (key order, ``1`` from ``1.0`` from ``true``,
    ``-0.0`` from ``0.0``); NaN equals nothing and is serialised every time. What passes both serialises to the
    same string. Bounded: a client varying its tools on every call gets an entry per call, oldest first out."""

    MAX = 64

    def __init__(self) -> None:
        self.entries: OrderedDict[bytes, tuple[Any, str]] = OrderedDict()

    def get(self, tools: list[dict[str, Any]] | None) -> str:
        if not tools:
            return "[]"
        try:
            raw = _to_json(tools)
        except Exception:  # not serialisable there (a lone surrogate, an unknown type): json.dumps decides
            raw = None
        hit = self.entries.get(raw) if raw is not None else None
        if hit is not None and self.same(hit[0], tools):
            return hit[1]
        key = unicode_text(json.dumps(tools, ensure_ascii=False), "tools")
        if raw is not None:
            self.entries[raw] = (json.loads(key), key)
            if len(self.entries) > self.MAX:
                self.entries.popitem(last=False)
        return key

    @staticmethod
    def same(remembered: Any, tools: Any) -> bool:
        return bool(remembered == tools)


def _to_json(value: Any) -> bytes:
    return compact_json(value)  # orjson when installed, else pydantic_core (jsonkey: why either is exact here)


_TOOLS_KEYS = _ToolsKeys()
