"""Tool-call parsers: decoded model text -> :class:`~envhub.env.Action`, and back.

Each model family writes function calls its own way. A parser knows one way, in both directions::

    parser = get_parser("hermes")
    action = parser.parse('Let me look.\\n<tool_call>\\n{"name": "bash", "arguments": {"cmd": "ls"}}\\n</tool_call>')
    action.text, action.tool_calls   # ("Let me look.", [ToolCall("bash", {"cmd": "ls"})])
    parser.format(action)            # the text a model of this family would emit for the action

Built in:

* ``"hermes"`` -- Qwen2.5 / Hermes: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks, several per
  turn; an unclosed last block (generation stopped on ``</tool_call>`` or cut) still parses, as in vLLM's parser.
* ``"json"`` -- a plain JSON function-call object or list of them, bare or in a fenced code block.
* ``"llama3"`` -- Llama-3.1: ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``; the
  Llama-3.1 template renders one call per assistant turn, so further calls are reported, not run.

Malformed calls never raise: the :class:`Action` keeps the valid calls and says what was wrong in ``parse_error``
(the env answers that with a message the model can act on). Add parsers with :func:`register_parser` or a plugin's
``envhub_tool_parsers`` hook; :func:`auto_parser_name` picks one from a chat template.
"""
from __future__ import annotations

import json
import re
from typing import Any, Protocol, runtime_checkable

from envhub.env import Action, ToolCall


@runtime_checkable
class ToolCallParser(Protocol):
    """Turns decoded assistant text into an :class:`Action` and an action back into the family's text."""

    def parse(self, text: str) -> Action: ...

    def format(self, action: Action) -> str: ...


def _call_from(obj: Any, arg_keys: tuple[str, ...]) -> tuple[ToolCall | None, str | None]:
    """A ``ToolCall`` from one decoded JSON object, or the reason it is not one."""
    if not isinstance(obj, dict):
        return None, f"expected a JSON object with a name, got {type(obj).__name__}"
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, "missing function name"
    args: Any = {}
    for key in arg_keys:
        if key in obj:
            args = obj[key]
            break
    if isinstance(args, str):  # some models emit the OpenAI wire form: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            return None, f"{name}: arguments are a string that is not valid JSON ({e.msg})"
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return None, f"{name}: arguments must be a JSON object, got {type(args).__name__}"
    return ToolCall(name.strip(), args), None


def _loads(text: str) -> tuple[Any, str | None]:
    try:
        return json.loads(text), None
    except json.JSONDecodeError as e:
        return None, f"invalid JSON ({e.msg} at line {e.lineno} column {e.colno})"


def _args_json(args: dict[str, Any]) -> str:
    # Exactly what transformers' ``tojson`` filter writes, so formatted text matches the template's rendering.
    return json.dumps(args, ensure_ascii=False)


class HermesParser:
    """Qwen2.5 / Hermes ``<tool_call>`` blocks. ``Action.text`` is the text outside the well-formed blocks."""

    name = "hermes"
    start, end = "<tool_call>", "</tool_call>"
    _block = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)

    def parse(self, text: str) -> Action:
        if self.start not in text:
            return Action(text)
        calls, errors, kept, last = [], [], [], 0
        for i, m in enumerate(self._block.finditer(text)):
            body = m.group(1) if m.group(1) is not None else m.group(2)
            obj, err = _loads(body.strip())
            call = None
            if err is None:
                call, err = _call_from(obj, ("arguments", "parameters"))
            if call is None:
                errors.append(f"tool call {i + 1}: {err}")
                continue  # the malformed block stays in the text, where the env can quote it back
            kept.append(text[last:m.start()])
            last = m.end()
            calls.append(call)
        kept.append(text[last:])
        content = "".join(kept).strip() if calls else text
        return Action(content, calls, "; ".join(errors) or None)

    def format(self, action: Action) -> str:
        # Qwen2.5's template: content, then "\n<tool_call>\n{...}\n</tool_call>" per call; the generation prompt
        # already ends in "\n", so a call-only turn starts directly with "<tool_call>".
        parts = [action.text] if action.text else []
        for c in action.tool_calls:
            parts.append(f'{self.start}\n{{"name": "{c.name}", "arguments": {_args_json(c.arguments)}}}\n{self.end}')
        return "\n".join(parts)


class JsonParser:
    """Plain JSON function calls: ``{"name": ..., "arguments": {...}}`` or a list of them, bare or fenced.

    Text without a JSON object is a plain answer (no call, no error). Text that *is* JSON (starts with ``{`` or
    ``[``, or sits in a fence) but is not a valid call is a parse error.
    """

    name = "json"
    _fence = re.compile(r"```(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)

    def parse(self, text: str) -> Action:
        fences = list(self._fence.finditer(text))
        if fences:
            chunks = [(m.group(1), m.start(), m.end(), True) for m in fences]
        elif text.strip()[:1] in ("{", "["):
            chunks = [(text.strip(), 0, len(text), True)]
        else:
            chunks = self._embedded(text)
        calls, errors, kept, last = [], [], [], 0
        for body, start, end, strict in chunks:
            obj, err = _loads(body.strip())
            found: list[ToolCall] = []
            if err is None:
                for j, item in enumerate(obj if isinstance(obj, list) else [obj]):
                    call, why = _call_from(item, ("arguments", "parameters"))
                    if call is None:
                        err = f"item {j + 1}: {why}" if isinstance(obj, list) else why
                        break
                    found.append(call)
            if err is not None:
                if strict:
                    errors.append(f"function call: {err}")
                continue
            kept.append(text[last:start])
            last = end
            calls.extend(found)
        kept.append(text[last:])
        content = "".join(kept).strip() if calls else text
        return Action(content, calls, "; ".join(errors) or None)

    @staticmethod
    def _embedded(text: str) -> list[tuple[str, int, int, bool]]:
        """JSON objects with a ``"name"`` key inside prose (not strict: prose with braces is not an error)."""
        dec, out, i = json.JSONDecoder(), [], text.find("{")
        while i != -1:
            try:
                obj, end = dec.raw_decode(text, i)
            except json.JSONDecodeError:
                i = text.find("{", i + 1)
                continue
            if isinstance(obj, dict) and "name" in obj:
                out.append((text[i:end], i, end, False))
            i = text.find("{", end)
        return out

    def format(self, action: Action) -> str:
        objs = [{"name": c.name, "arguments": c.arguments} for c in action.tool_calls]
        if not objs:
            return action.text
        body = json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False)
        return f"{action.text}\n```json\n{body}\n```" if action.text else body


class Llama3Parser:
    """Llama-3.1 JSON calls: ``{"name": ..., "parameters": {...}}``, optionally after ``<|python_tag|>``.

    Several calls separated by ``;`` parse (as vLLM's ``llama3_json`` parser does), but the Llama-3.1 template can
    render only one call per assistant turn, so by default calls beyond ``max_calls`` are dropped and reported in
    ``parse_error``. A call turn carries no other text (the template drops it too).
    """

    name = "llama3"
    python_tag = "<|python_tag|>"

    def __init__(self, max_calls: int | None = 1):
        self.max_calls = max_calls

    def parse(self, text: str) -> Action:
        body = text.strip()
        tagged = body.startswith(self.python_tag)
        if tagged:
            body = body[len(self.python_tag):].strip()
        if not body.startswith("{"):
            if tagged:
                return Action(text, parse_error="expected a JSON function call after <|python_tag|>")
            return Action(text)
        dec, calls, errors, i = json.JSONDecoder(), [], [], 0
        while i < len(body):
            try:
                obj, i = dec.raw_decode(body, i)
            except json.JSONDecodeError as e:
                errors.append(f"tool call {len(calls) + len(errors) + 1}: invalid JSON ({e.msg} at column {e.colno})")
                break
            call, err = _call_from(obj, ("parameters", "arguments"))
            if call is None:
                errors.append(f"tool call {len(calls) + len(errors) + 1}: {err}")
            else:
                calls.append(call)
            while i < len(body) and body[i] in " \t\r\n;":
                i += 1
            if i < len(body) and body[i] != "{":
                errors.append(f"unexpected text after a function call: {body[i:i + 40]!r}")
                break
        if self.max_calls is not None and len(calls) > self.max_calls:
            extra = [c.name for c in calls[self.max_calls:]]
            errors.append(f"this model family makes one tool call per turn; ignored the extra call(s): {extra}")
            calls = calls[: self.max_calls]
        return Action("" if calls else text, calls, "; ".join(errors) or None)

    def format(self, action: Action) -> str:
        if not action.tool_calls:
            return action.text
        return "; ".join(f'{{"name": "{c.name}", "parameters": {_args_json(c.arguments)}}}' for c in action.tool_calls)


_BUILTIN: dict[str, Any] = {"hermes": HermesParser, "qwen": HermesParser, "json": JsonParser, "llama3": Llama3Parser}
_REGISTERED: dict[str, Any] = {}


def register_parser(name: str, parser: Any) -> None:
    """Make ``parser`` (an instance, or a zero-argument class/factory) available as ``get_parser(name)``."""
    _REGISTERED[name] = parser


def _instantiate(p: Any) -> ToolCallParser:
    if isinstance(p, type) or (callable(p) and not hasattr(p, "parse")):
        p = p()
    if not (hasattr(p, "parse") and hasattr(p, "format")):
        raise TypeError(f"a tool-call parser needs parse(text) and format(action); got {p!r}")
    return p


def _from_plugins(name: str) -> Any:
    """Ask plugins (``envhub_tool_parsers`` hook): already-loaded ones first, then every installed one."""
    from envhub.plugins import default_hub

    hub = default_hub()
    for attempt in range(2):
        for found in hub.pm.hook.envhub_tool_parsers():
            if found and name in found:
                return found[name]
        if attempt == 0:
            hub.load_all()
    return None


def get_parser(name: str | ToolCallParser) -> ToolCallParser:
    """A parser by name (registered, built in, or from a plugin), or ``name`` itself when it is a parser."""
    if not isinstance(name, str):
        return _instantiate(name)
    found = _REGISTERED.get(name) or _BUILTIN.get(name) or _from_plugins(name)
    if found is None:
        known = sorted(set(_BUILTIN) | set(_REGISTERED))
        raise KeyError(f"unknown tool-call parser {name!r}; known: {', '.join(known)} (or register_parser())")
    return _instantiate(found)


def auto_parser_name(chat_template: str | None) -> str:
    """Pick the parser a chat template's model family uses: Hermes ``<tool_call>`` tags, Llama-3.1 JSON, or JSON."""
    t = chat_template or ""
    if "<tool_call>" in t:
        return "hermes"
    if "<|python_tag|>" in t or "<|start_header_id|>" in t:
        return "llama3"
    return "json"


def tool_prompt(tools: list[dict[str, Any]], parser: ToolCallParser) -> str:
    """Instructions that state ``tools`` (OpenAI dicts) and one example call in ``parser``'s format, for a model
    whose chat template does not render tools itself."""
    example = tools[0]["function"]
    placeholder = {"string": "...", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}
    props = example.get("parameters", {}).get("properties", {})
    args = {k: placeholder.get(v.get("type") if isinstance(v.get("type"), str) else "string", "...")
            for k, v in props.items()}
    call = parser.format(Action("", [ToolCall(example["name"], args)]))
    specs = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (f"You can call these tools (JSON schemas):\n{specs}\n\nTo call a tool, reply with the call in exactly "
            f"this format, for example:\n{call}\nYou will get the tool's output back. Call `finish` when you are done.")
