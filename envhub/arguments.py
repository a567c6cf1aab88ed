"""Checking tool-call arguments against a tool's JSON schema, with messages a model can act on."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from envhub.types import ToolSpec

_JSON_TYPES: dict[str, Union[type, tuple[type, ...]]] = {
    "string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list,
}


def check_arguments(spec: "ToolSpec", arguments: Any) -> str | None:
    """Check tool-call arguments against the tool's JSON schema (required keys, unknown keys, basic types, enums).

    Returns a message the model can act on, or ``None`` when the arguments are fine.
    """
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    props = spec.parameters.get("properties", {})
    missing = [k for k in spec.parameters.get("required", []) if k not in arguments]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    unknown = [k for k in arguments if k not in props]
    if unknown and spec.parameters.get("additionalProperties", False) is False:
        return f"unknown argument(s): {', '.join(unknown)}; expected: {', '.join(props) or 'none'}"
    for key, value in arguments.items():
        schema = props.get(key, {})
        want = schema.get("type")
        types = want if isinstance(want, list) else [want] if want else []
        ok = not types or any(
            t == "null" and value is None
            or t in _JSON_TYPES and isinstance(value, _JSON_TYPES[t]) and not (t in ("integer", "number") and isinstance(value, bool))
            for t in types
        )
        if not ok:
            return f"argument {key!r} must be of type {want}, got {type(value).__name__}"
        if "enum" in schema and value not in schema["enum"]:
            return f"argument {key!r} must be one of {schema['enum']}, got {value!r}"
    return None
