"""``ChatCodec``: chat template in, token ids out -- without ever re-tokenizing what the model sampled.

The executor keeps one token record per rollout: the prompt, then, turn after turn, the ids the model sampled
(unchanged) and the ids of the env's reply. Re-tokenizing the whole conversation each turn would be simpler and
wrong: text does not round-trip through a tokenizer (``decode(ids)`` re-encodes to *other* ids whenever the model
sampled a non-canonical split, stopped inside a merge, or emitted invalid UTF-8), so the trainer would score tokens
the model never produced. Instead the codec renders *strings* with the real chat template and tokenizes only the new
part::

    codec = ChatCodec(tokenizer, tools=[t.to_openai() for t in env.tools])
    ids = codec.prompt_ids(messages)                      # template(messages) + generation prompt, tokenized once
    gen = await backend.generate(ids, params)             # sampled ids: appended as they are (mask 1)
    msg, action = codec.assistant_message(gen.token_ids)  # decode + parse tool calls
    messages.append(msg)
    new, *_ = await env.astep(action)
    delta = codec.delta_ids(messages, new, sampled_eos=codec.ends_turn(gen.token_ids))   # mask 0
    messages.extend(new)

``delta_ids`` is ``template(history + new + generation prompt)`` minus ``template(history)``, plus whatever the
template puts after an assistant message that the model did not sample (``"\\n"`` after ``<|im_end|>``; the
end-of-turn token itself when generation ended on a stop string or was cut). The rendering of ``history`` must be a
prefix of the longer rendering; templates that rewrite earlier turns (dropping past reasoning, say) raise
:class:`ChatTemplateError` instead of producing wrong tokens. The delta starts right after a special token, where
tokenization restarts, so tokenizing it alone gives exactly the ids the full rendering would have there.
"""
from __future__ import annotations

import hashlib
import json
import weakref
from pathlib import Path
from typing import Any

from envhub.env import Action, Message, ToolSpec
from envhub.codec.encoding import TextEncoder
from envhub.codec.frame_ids import FrameIds
from envhub.codec.frames import Frame, shape_of, window_safe  # noqa: F401 (window_safe re-exported)
from envhub.codec.messages import normalize_messages, tool_dicts
from envhub.codec.toolcall import ToolCallParser, auto_parser_name, get_parser, tool_prompt

_PROBE = "\x00envhub-probe\x00"


MAX_SHARED = 256  # codecs kept per tokenizer (the oldest goes first)
_SHARED: "weakref.WeakKeyDictionary[Any, dict[tuple, ChatCodec]]" = weakref.WeakKeyDictionary()


class ChatTemplateError(ValueError):
    """The chat template cannot extend the token record faithfully (or cannot render the conversation)."""


class ChatCodec:
    """Renders conversations with a tokenizer's chat template and turns model output into actions.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        tools: JSON-schema tools (OpenAI dicts or :class:`~envhub.env.ToolSpec`) rendered into the prompt. With no
            tools, model text is a plain answer and is not parsed for tool calls.
        parser: a :class:`ToolCallParser` or its name; ``"auto"`` picks from the template (see ``auto_parser_name``).
        template_kwargs: extra template variables (``date_string``, ``tools_in_user_message``...).
        chat_template: overrides the tokenizer's template.
        eos_token_ids: overrides the ids that end an assistant turn (default: the template's end-of-turn token,
            the tokenizer's EOS, and the ``eos_token_id`` list of a ``generation_config.json`` next to it).
        delta_window: render only a window of the history for :meth:`delta_ids` (``None``: when the template passes
            :func:`window_safe`, and only after it matched the full rendering on two turns).
    """

    def __init__(self, tokenizer: Any, *, tools: list[dict] | list[ToolSpec] | None = None,
                 parser: str | ToolCallParser = "auto", template_kwargs: dict | None = None,
                 chat_template: str | None = None, eos_token_ids: list[int] | None = None,
                 delta_window: bool | None = None):
        self.tokenizer = tokenizer
        self.tools = tool_dicts(tools)
        self.template_kwargs = dict(template_kwargs or {})
        self.chat_template = chat_template or self._template_of(tokenizer, self.tools)
        self.parser: ToolCallParser = get_parser(auto_parser_name(self.chat_template) if parser == "auto" else parser)
        self._compiled = self._compile(self.chat_template)
        # what apply_chat_template passes besides messages: the special tokens (bos_token...), then user kwargs
        self._render_kwargs = {**(getattr(tokenizer, "special_tokens_map", {}) or {}), **self.template_kwargs}
        self.encoder = TextEncoder.shared(tokenizer)  # the fast, exact word path (envhub.codec.encoding)
        self._encode, self._decode = self.encoder.encode, self.encoder.decode
        self.end_of_turn, _ = self._probe_end_of_turn()
        self.end_of_turn_id = self._single_id(self.end_of_turn)
        ids = [self.end_of_turn_id] if eos_token_ids is None else list(eos_token_ids)
        if eos_token_ids is None:
            ids += [i for i in [getattr(tokenizer, "eos_token_id", None), *self._generation_config_eos()]
                    if isinstance(i, int)]
        self.eos_token_ids: list[int] = list(dict.fromkeys(ids))
        self._eos_set = frozenset(self.eos_token_ids)
        self.delta_window = window_safe(self.chat_template) if delta_window is None else delta_window
        self.renders_tools = bool(self.tools) and self._renders_tools()
        """Whether the template shows ``tools`` to the model at all (SmolLM2's, for one, ignores them)."""
        self._verify_left = 2 if delta_window is None else 0
        self._frames: dict[tuple, Frame | None] = {}  # reply shape -> learned frame (None: not frameable)
        self._frame_ids: dict[tuple, FrameIds | None] = {}  # reply shape -> its split encoding (None: not splittable)

    @classmethod
    def shared(cls, tokenizer: Any, *, tools: list[dict] | None = None, parser: str = "auto") -> ChatCodec:
        """A codec cached per (tokenizer, tools, parser): building one probes the template (milliseconds), and what
        it learns (end-of-turn token, verified window, frames) holds for every conversation with that template."""
        per_tok = _SHARED.setdefault(tokenizer, {})
        # the key keeps the tools' key order: two lists that differ only in it render differently (tojson)
        key = (json.dumps(tool_dicts(tools)), parser if isinstance(parser, str) else id(parser))
        codec = per_tok.get(key)
        if codec is None:
            if len(per_tok) >= MAX_SHARED:  # a client varying its tools on every call must not grow memory
                per_tok.pop(next(iter(per_tok), None), None)
            codec = per_tok[key] = cls(tokenizer, tools=tools, parser=parser)
        return codec

    # ---- rendering -------------------------------------------------------------------------------------------
    @staticmethod
    def _template_of(tokenizer: Any, tools: Any) -> str:
        template = getattr(tokenizer, "chat_template", None)
        if isinstance(template, dict):  # named templates: "tool_use" when tools are given, as transformers does
            template = template.get("tool_use") if tools and "tool_use" in template else template.get("default")
        if not template:
            name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
            raise ChatTemplateError(f"tokenizer {name!r} has no chat template; pass chat_template=... to ChatCodec")
        return template

    @staticmethod
    def _compile(template: str):
        # transformers' own environment (its tojson, raise_exception, strftime_now, trim/lstrip blocks), compiled
        # once: rendering with it is exactly apply_chat_template(tokenize=False), minus per-call overhead.
        from transformers.utils.chat_template_utils import _compile_jinja_template

        return _compile_jinja_template(template)

    def render(self, messages: list[Message], *, add_generation_prompt: bool = False) -> str:
        """The template's text for ``messages`` (with this codec's tools and template kwargs)."""
        try:
            return self._compiled.render(
                messages=normalize_messages(messages), tools=self.tools, documents=None,
                add_generation_prompt=add_generation_prompt, **self._render_kwargs,
            )
        except Exception as e:  # jinja's TemplateError from raise_exception(), or a template bug on odd input
            raise ChatTemplateError(f"the chat template cannot render this conversation: {type(e).__name__}: {e}") from e

    def encode(self, text: str, *, exact: bool = False) -> list[int]:
        """Tokenize rendered text (special tokens in it are recognized; nothing is added around it).

        ``exact=True`` always runs the tokenizer's own pipeline instead of the fast word path
        (``envhub.codec.encoding``): the fidelity check uses it, so that it never grades the fast path by itself."""
        return self.encoder.rust_encode(text) if exact else self._encode(text)

    def decode(self, ids: list[int]) -> str:
        return self._decode(list(ids))

    def _probe_end_of_turn(self) -> tuple[str, str]:
        """Find the token the template closes an assistant turn with, and the text it puts after that token."""
        msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}]
        try:
            text = self.render(msgs)
        except ChatTemplateError:
            text = ""
        tail = text[text.index(_PROBE) + len(_PROBE):] if _PROBE in text else ""
        ids = self.encode(tail) if tail else []
        special = set(getattr(self.tokenizer, "all_special_ids", []) or [])
        added = getattr(self.tokenizer, "get_added_vocab", dict)()  # control tokens not flagged "special" count too
        special |= set(added.values()) if isinstance(added, dict) else set()
        if ids and ids[0] in special:
            eot = self.decode(ids[:1])
            return eot, tail[tail.index(eot) + len(eot):]
        eos = getattr(self.tokenizer, "eos_token", None)
        if eos and eos in tail:
            return eos, tail[tail.index(eos) + len(eos):]
        if eos:
            return eos, ""
        raise ChatTemplateError("cannot tell which token ends an assistant turn in this chat template")

    def _renders_tools(self) -> bool:
        probe = [{"role": "user", "content": "hi"}]
        try:
            with_tools = self.render(probe)
        except ChatTemplateError:
            return True  # cannot tell; assume the template knows what it does
        saved, self.tools = self.tools, None
        try:
            return self.render(probe) != with_tools
        except ChatTemplateError:
            return True
        finally:
            self.tools = saved

    def _single_id(self, token: str) -> int:
        ids = self.encode(token)
        if len(ids) != 1:
            raise ChatTemplateError(f"end-of-turn marker {token!r} is not one token ({ids})")
        return ids[0]

    def _generation_config_eos(self) -> list[int]:
        path = Path(getattr(self.tokenizer, "name_or_path", "") or "") / "generation_config.json"
        try:
            eos = json.loads(path.read_text()).get("eos_token_id")
        except (OSError, ValueError):
            return []
        return eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []

    # ---- the executor's API ----------------------------------------------------------------------------------
    def prompt_ids(self, messages: list[Message], *, exact: bool = False) -> list[int]:
        """The template's rendering of ``messages`` plus the generation prompt, tokenized once (``exact``: see
        :meth:`encode`)."""
        return self.encode(self.render(messages, add_generation_prompt=True), exact=exact)

    def ends_turn(self, token_ids: list[int]) -> bool:
        """Whether sampled ids end with the template's end-of-turn token (pass this as ``delta_ids(sampled_eos=)``).

        Another EOS (``<|endoftext|>`` for a ChatML model) also stops generation, but the template's turn is still
        open, so the delta then supplies the end-of-turn token.
        """
        return bool(token_ids) and token_ids[-1] == self.end_of_turn_id

    def assistant_message(self, token_ids: list[int], *, turn: int | None = None,
                          stop: list[str] | None = None) -> tuple[Message, Action]:
        """Decode sampled ids (without a trailing EOS) and parse tool calls.

        Returns the OpenAI assistant message to append to the conversation, and the :class:`Action` for the env.
        ``stop``: stop strings of the request; text after the first one is dropped (the stop string is kept,
        a ``</tool_call>`` stop must still close the call). Tool-call ids are ``call_<turn>_<i>`` when ``turn`` is
        given, else derived from the text, so replays give the same ids.
        """
        ids = token_ids[:-1] if token_ids and token_ids[-1] in self._eos_set else token_ids
        text = self._decode(ids if type(ids) is list else list(ids))
        if stop:
            cuts = [text.find(s) + len(s) for s in stop if s and s in text]
            if cuts:
                text = text[: min(cuts)]
        action = self.parser.parse(text) if self.tools else Action(text)
        prefix = f"call_{turn}" if turn is not None else "call_" + hashlib.sha1(text.encode("utf-8", "replace")).hexdigest()[:8]
        for i, call in enumerate(action.tool_calls):
            if not call.id:
                call.id = f"{prefix}_{i}"
        return action.to_message(), action

    def delta_text(self, history: list[Message], new_messages: list[Message], *, sampled_eos: bool,
                   add_generation_prompt: bool = True, exact: bool = False) -> str:
        """The text :meth:`delta_ids` tokenizes (see there). ``exact=True`` always renders the whole history."""
        if not history or history[-1].get("role") != "assistant":
            raise ChatTemplateError("delta_ids: history must end with the assistant message of the turn just sampled")
        if self.delta_window and not exact:
            framed = self._framed(history, new_messages, sampled_eos, add_generation_prompt)
            if framed is not None:
                return framed
        short = None if exact or not self.delta_window else self._window_of(history)
        if short is None:
            return self._delta(history, new_messages, sampled_eos, add_generation_prompt)
        text = self._delta(short, new_messages, sampled_eos, add_generation_prompt)
        if self._verify_left > 0:  # trust the window only after it matched the full rendering on real turns
            self._verify_left -= 1
            full = self._delta(history, new_messages, sampled_eos, add_generation_prompt)
            if full != text:
                self.delta_window = False
                return full
        return text

    def _framed(self, history: list[Message], new_messages: list[Message], sampled_eos: bool, gp: bool) -> str | None:
        """The delta by filling a learned template frame (see ``envhub.codec.frames``), or ``None``."""
        key = shape_of(history, new_messages, sampled_eos, gp)
        if key is None:
            return None
        frame = self._frames.get(key)
        if frame is not None and frame.unverified == 0:  # the hot path: a verified frame, nothing else to do
            return frame.fill(new_messages)
        base = self._window_of(history) or history
        if key not in self._frames:
            self._frames[key] = Frame.learn(lambda msgs: self._delta(base, msgs, sampled_eos, gp), new_messages)
        frame = self._frames[key]
        if frame is None:
            return None
        text = frame.fill(new_messages)
        if frame.unverified > 0:  # trust a frame only after it matched the full rendering on real turns
            frame.unverified -= 1
            full = self._delta(history, new_messages, sampled_eos, gp)
            if full != text:
                self._frames[key] = None
                if base is not history and self._delta(base, new_messages, sampled_eos, gp) != full:
                    self.delta_window = False  # the window itself disagrees, not only the frame
                return full
        return text

    def _window_of(self, history: list[Message]) -> list[Message] | None:
        """The opening messages (through the first user message: system and tool blocks live there) plus the last
        assistant message: enough context for a template whose rendering of a message depends only on the opening
        and its neighbours. ``None`` when that is the whole history anyway."""
        first_user = next((i for i, m in enumerate(history) if m.get("role") == "user"), None)
        if first_user is None or first_user + 2 >= len(history):
            return None
        return list(history[: first_user + 1]) + [history[-1]]

    def _delta(self, history: list[Message], new_messages: list[Message], sampled_eos: bool, gp: bool) -> str:
        prefix = self.render(history)
        full = self.render(list(history) + list(new_messages), add_generation_prompt=gp)
        if not full.startswith(prefix):
            at = next((i for i, (a, b) in enumerate(zip(prefix, full)) if a != b), min(len(prefix), len(full)))
            raise ChatTemplateError(
                "this chat template re-renders earlier turns when new messages follow (the conversation so far is "
                f"not a prefix of the longer rendering; first difference at char {at}: {prefix[at:at + 40]!r} vs "
                f"{full[at:at + 40]!r}), so the env's tokens cannot be appended faithfully"
            )
        cut = prefix.rfind(self.end_of_turn)
        if cut < 0:
            raise ChatTemplateError(f"the rendered assistant turn does not end with {self.end_of_turn!r}")
        tail = prefix[cut + len(self.end_of_turn):]
        return ("" if sampled_eos else self.end_of_turn) + tail + full[len(prefix):]

    def delta_ids(self, history: list[Message], new_messages: list[Message], *, sampled_eos: bool,
                  add_generation_prompt: bool = True, exact: bool = False) -> list[int]:
        """The ids that continue the record after the sampled ids of the turn that ends ``history``.

        ``history`` ends with that turn's assistant message; ``new_messages`` are the env's reply. The result is the
        end of the assistant turn the model did not sample (``sampled_eos=False``: the end-of-turn token too), then
        ``new_messages`` as the template renders them after ``history``, then the next generation prompt (unless
        ``add_generation_prompt=False``, for a reply appended after the last turn). Nothing already in the record is
        re-tokenized.

        Cost: rendering the whole history each turn is O(length) per turn. For templates that pass a static locality
        screen (:func:`window_safe`), the codec renders only the opening messages plus the last assistant message
        (``delta_window``), after checking on the first turns that this gives the same text as the full rendering;
        ``exact=True`` forces the full rendering and the tokenizer's own pipeline (the fidelity check uses it). Once
        a reply shape's frame is verified, its fixed special-token runs are encoded once and only the text around
        the contents is encoded per turn (``envhub.codec.frame_ids``).
        """
        key = None
        if self.delta_window and not exact:
            key = shape_of(history, new_messages, sampled_eos, add_generation_prompt)
            split = self._frame_ids.get(key)
            if split is not None and split.unverified == 0 and history and history[-1].get("role") == "assistant":
                return split.ids(new_messages, self._encode)  # the hot path
        ids = self.encode(self.delta_text(history, new_messages, sampled_eos=sampled_eos,
                                          add_generation_prompt=add_generation_prompt, exact=exact), exact=exact)
        if key is not None:
            self._learn_split(key, new_messages, ids)
        return ids

    def _learn_split(self, key: tuple, new_messages: list[Message], ids: list[int]) -> None:
        """Plan the split ids of a verified frame; trust them only after they matched the whole text's ids."""
        frame = self._frames.get(key)
        if frame is None or frame.unverified > 0:
            return
        if key not in self._frame_ids:
            self._frame_ids[key] = FrameIds.plan(frame.pieces, frame.strip, self.encoder.words, self._encode)
        split = self._frame_ids[key]
        if split is not None and split.unverified > 0:
            split.unverified -= 1
            if split.ids(new_messages, self._encode) != ids:
                self._frame_ids[key] = None

    def tool_prompt(self) -> str | None:
        """Tool instructions for a template that does not show ``tools`` to the model (``renders_tools`` is False),
        in this codec's tool-call format; ``None`` when the template renders tools itself (or there are none). The
        executor adds them to the system message, so such a model still learns what it can call and how."""
        return None if not self.tools or self.renders_tools else tool_prompt(self.tools, self.parser)

    def render_action(self, action: Action | str) -> str:
        """The text a model of this family emits for ``action`` (its own tool-call format), without end-of-turn."""
        action = Action.coerce(action)
        return self.parser.format(action) if self.tools or action.tool_calls else action.text

    def action_ids(self, action: Action | str) -> list[int]:
        """``render_action`` tokenized canonically, plus the end-of-turn token: what a golden policy "samples"."""
        return self.encode(self.render_action(action)) + [self.end_of_turn_id]
