"""A value's compact JSON as a memo key (#28 item 10): the tools key (:mod:`envhub.gateway.toolskey`) and the
opening cache (:class:`envhub.gateway.calls.OpeningCache`) remember what they computed by the JSON of what it was
computed from, and serialising that JSON on every call was the cost they were there to save (ten tools: ~35 µs by
``pydantic_core.to_json``, ~5 µs by orjson; a 64 KB context: ~320 µs by ``json.dumps``, ~13 µs by orjson).

:func:`compact_json` uses orjson when it is installed and ``pydantic_core`` (the serve extra's) otherwise. Neither
writes exactly what ``json.dumps`` writes, and each conflates values that ``json.dumps`` or ``==`` tells apart
(orjson writes NaN and infinities as ``null``; both write a tuple as a list and accept dataclasses ``json.dumps``
refuses), so a key alone never decides a hit: a memo keeps the value as ``json.dumps`` wrote it, parsed back
(:func:`remembered`), and a hit also requires the value asked about to equal it (:func:`same`). ``==`` tells a tuple, a set, bytes or any non-JSON
object from what JSON parses to, NaN equals nothing (a value holding one is never served from memory), and the key
tells what ``==`` does not: key order, ``1`` from ``1.0`` from ``true``, ``-0.0`` from ``0.0``. What passes both is
the same JSON value, written the same way by ``json.dumps``.
"""
from __future__ import annotations

import json
from typing import Any

try:  # optional: the fastest serialiser where installed; pydantic_core (serve extra) otherwise
    import orjson as _orjson
except ImportError:  # pragma: no cover - exercised by forcing the fallback in tests/gateway/test_json_keys.py
    _orjson = None  # type: ignore[assignment]

_pydantic_to_json: Any = None


def backend() -> str:
    """Which serialiser :func:`compact_json` uses: ``"orjson"``, ``"pydantic_core"`` or ``"none"``."""
    if _orjson is not None:
        return "orjson"
    return "pydantic_core" if _pydantic() is not None else "none"


def compact_json(value: Any) -> bytes:
    """``value``'s compact JSON in its own key order, as a memo key (not a wire format: see the module docstring).

    Raises:
        Exception: whatever the serialiser raises for a value it cannot write (a lone surrogate, an int past 64 bits
            for orjson, an unknown type); ImportError when neither serialiser is installed. The caller then does
            without the memo.
    """
    if _orjson is not None:
        return _orjson.dumps(value)
    to_json = _pydantic()
    if to_json is None:
        raise ImportError("neither orjson nor pydantic_core is installed")
    return to_json(value, inf_nan_mode="constants")


def remembered(value: Any) -> Any:
    """What a memo keeps to compare later values with (:func:`same`): ``value`` through ``json.dumps`` and back.
    Not the compact key parsed back: orjson wrote NaN as ``null``, and a NaN remembered as None would let a later
    None pass. A copy, so that a caller editing its own objects afterwards cannot change what is remembered.

    Raises:
        TypeError, ValueError: ``json.dumps`` refuses ``value`` (a set, bytes, a lone surrogate is fine): not
            remembered, as ``json.dumps`` keys never held it either.
    """
    return json.loads(json.dumps(value, ensure_ascii=False))


def same(remembered_value: Any, value: Any) -> bool:
    """Whether ``value`` is the remembered JSON value (called only when their keys are equal)."""
    return bool(remembered_value == value)


def _pydantic() -> Any:
    global _pydantic_to_json
    if _pydantic_to_json is None:  # imported at the first use, not with the package
        try:
            from pydantic_core import to_json as _pydantic_to_json
        except ImportError:  # pragma: no cover
            _pydantic_to_json = False
    return _pydantic_to_json or None
