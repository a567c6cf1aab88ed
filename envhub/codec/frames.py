"""Template frames: the delta text of an env reply without running the chat template.

Running a Jinja chat template costs far more than joining a few strings, even on a short window
(``benchmarks/executor_overhead.py`` measures the executor's per-turn work); the executor needs the env's reply
rendered every turn. For most templates an env message renders as fixed text around its content
(``<|im_start|>user\\n`` + content + ``<|im_end|>\\n`` ...). A :class:`Frame` learns that fixed text once per *shape*
of reply (the roles and keys of the new messages, whether the model's turn ended on its end-of-turn token, whether
it called tools) by rendering the real template with sentinel contents, then fills in real contents with string
concatenation.

It is only used where it is provably the same as the template:

* every sentinel must appear exactly once, in order, and no other field (``name``, ``tool_call_id``) may be
  rendered (its value would be baked into the frame);
* contents are inserted verbatim, or stripped when the template ``trim``s them (detected by padded sentinels);
* a new frame is checked against the full template rendering on its first uses (``VERIFY_USES``); one mismatch
  disables that shape for good, and the template is used instead.
"""
from __future__ import annotations

from typing import Any, Callable

VERIFY_USES = 2
_SLOT = "\x00envhub-slot-{}\x00"
_PAD = " \n\t"
_SIMPLE_KEYS = {"role", "content", "name", "tool_call_id"}


# Template constructs that make one message's rendering depend on messages far from it (state accumulated across
# the loop, counting from the end, searching for the last user query...): such templates get the full rendering.
_NON_LOCAL = ("namespace(", "loop.length", "loop.revindex", "reverse", "messages[-", "last_query", "loop.nextitem",
              "loop.previtem", "loop.cycle", "selectattr", "rejectattr", "|last", "| last")


def window_safe(chat_template: str) -> bool:
    """Whether ``delta_ids`` may render a window of the history (opening messages + last assistant message)
    instead of all of it: no construct that reaches across the conversation (see ``_NON_LOCAL``)."""
    return not any(pattern in chat_template for pattern in _NON_LOCAL)


def shape_of(history: list[dict[str, Any]], new_messages: list[dict[str, Any]], sampled_eos: bool,
             add_generation_prompt: bool) -> tuple | None:
    """The key frames are cached under, or ``None`` when the reply is not frameable (non-text content, extras).

    Keys are taken in the message's own order (no sort: this runs every turn); the same keys in another order are
    another shape, learned once more, which costs a template rendering and nothing else."""
    parts = []
    for m in new_messages:
        if not isinstance(m.get("content"), str) or not _SIMPLE_KEYS.issuperset(m):
            return None
        parts.append((m.get("role"), tuple(m)))
    calls = history[-1].get("tool_calls") if history else None
    return tuple(parts), len(calls) if calls else 0, sampled_eos, add_generation_prompt


class Frame:
    """Literal text pieces around ``n`` message contents (``pieces[0] + c0 + pieces[1] + ... + c(n-1) + pieces[n]``)."""

    def __init__(self, pieces: list[str], strip: bool):
        self.pieces, self.strip = pieces, strip
        self.unverified = VERIFY_USES

    def fill(self, new_messages: list[dict[str, Any]]) -> str:
        pieces = self.pieces
        if len(pieces) == 2:  # one message, the common case: no list, no join
            content = new_messages[0]["content"]
            return pieces[0] + (content.strip() if self.strip else content) + pieces[1]
        out = [pieces[0]]
        for m, piece in zip(new_messages, pieces[1:]):
            out.append(m["content"].strip() if self.strip else m["content"])
            out.append(piece)
        return "".join(out)

    @classmethod
    def learn(cls, render_delta: Callable[[list[dict[str, Any]]], str],
              new_messages: list[dict[str, Any]]) -> Frame | None:
        """Learn the frame for messages shaped like ``new_messages``; ``render_delta(msgs)`` is the slow path."""
        slots = [_SLOT.format(i) for i in range(len(new_messages))]

        def probe(pad: str) -> str:
            msgs = []
            for i, m in enumerate(new_messages):
                p = {k: v for k, v in m.items()}
                p["content"] = pad + slots[i] + pad
                for k in ("name", "tool_call_id"):
                    if k in p:
                        p[k] = f"\x00envhub-{k}-{i}\x00"
                msgs.append(p)
            return render_delta(msgs)

        try:
            plain, padded = probe(""), probe(_PAD)
        except Exception:
            return None
        if "\x00envhub-name-" in plain or "\x00envhub-tool_call_id-" in plain:
            return None  # the template renders a field other than content: not a pure frame
        if all(_PAD + s + _PAD in padded for s in slots):
            strip = False
        elif all(s in padded and _PAD + s not in padded and s + _PAD not in padded for s in slots):
            strip = True  # the template trims contents (Llama-3.1's `| trim`)
        else:
            return None
        pieces, rest = [], plain
        for s in slots:
            if rest.count(s) != 1:
                return None
            head, rest = rest.split(s)
            pieces.append(head)
        pieces.append(rest)
        return cls(pieces, strip)
