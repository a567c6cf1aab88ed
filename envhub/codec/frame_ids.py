"""A template frame's delta as token ids: the frame's fixed special-token runs are encoded once, only the text
around each content is encoded per turn.

A ChatML reply frame is ``"\\n<|im_start|>user\\n" + content + "<|im_end|>\\n<|im_start|>assistant\\n"``. Its ids are::

    encode("\\n<|im_start|>")  +  encode("user\\n" + content)  +  encode("<|im_end|>\\n<|im_start|>assistant\\n")
    └──── fixed, once ─────┘     └──── per turn: the mid ────┘     └────────────── fixed, once ──────────────┘

Why that is the same as encoding the whole text: the tokenizer cuts the raw text at added tokens first (leftmost-
longest) and encodes each piece between them on its own (``envhub.codec.encoding``, step 1). Each mid runs from
the last added token of the piece before a content to the first added token of the piece after it, so it is one
such piece (or several, if the content holds added tokens, which encoding the mid finds the same way) *provided the
cuts in the whole text fall where they fall in the parts*. They do unless an added token can occur across a
boundary between a piece and a content; ``plan`` rules that out for any content by checking that no added token has
a proper prefix that ends a piece followed by content or a proper suffix that starts a piece preceded by content.
Added tokens that move cuts (``lstrip``/``rstrip``/``single_word``) already keep the word path, hence this, off.
"""
from __future__ import annotations

from typing import Any, Callable

VERIFY_USES = 2  # split ids compared with the whole text's ids on a frame's first uses


class FrameIds:
    """``fixed[0] + encode(tails[0] + c0 + heads[1]) + fixed[1] + ... + fixed[n]`` for a frame of ``n`` contents."""

    def __init__(self, fixed: list[list[int]], tails: list[str], heads: list[str], strip: bool):
        self.fixed, self.tails, self.heads, self.strip = fixed, tails, heads, strip
        self.unverified = VERIFY_USES

    @classmethod
    def plan(cls, pieces: list[str], strip: bool, words: Any, encode: Callable[[str], list[int]]) -> FrameIds | None:
        """Split a frame's ``pieces`` at their added tokens (``words``: the encoder's ``WordPath``), or ``None`` when
        a piece has none (the mid would not end there) or a token could straddle a boundary."""
        if words is None or words.split_added is None or len(pieces) < 2:
            return None
        cut = []  # (text before the piece's first added token, first token .. last token, text after the last)
        for piece in pieces:
            parts = words.split_added(piece)  # [text, token, text, ..., token, text]
            if len(parts) < 3:
                return None  # no added token in this piece: the mid would run on into the next content
            head, tail = parts[0], parts[-1]
            cut.append((head, piece[len(head):len(piece) - len(tail)], tail))
        last = len(pieces) - 1
        for i, piece in enumerate(pieces):
            for token in words.raw_tokens:
                for k in range(1, len(token)):
                    if (i < last and piece.endswith(token[:k])) or (i > 0 and piece.startswith(token[k:])):
                        return None
        fixed = [encode(core) for _, core, _ in cut]
        fixed[0] = encode(cut[0][0] + cut[0][1])  # the text before the first token starts the delta: fixed too
        fixed[last] = encode(cut[last][1] + cut[last][2])  # and the text after the last token ends it
        return cls(fixed, [tail for _, _, tail in cut[:-1]], [head for head, _, _ in cut[1:]], strip)

    def ids(self, new_messages: list[dict[str, Any]], encode: Callable[[str], list[int]]) -> list[int]:
        fixed, tails, heads, strip = self.fixed, self.tails, self.heads, self.strip
        if len(fixed) == 2:  # one message, the common case
            content = new_messages[0]["content"]
            return fixed[0] + encode(tails[0] + (content.strip() if strip else content) + heads[0]) + fixed[1]
        out = list(fixed[0])
        for i, m in enumerate(new_messages):
            content = m["content"].strip() if strip else m["content"]
            out += encode(tails[i] + content + heads[i])
            out += fixed[i + 1]
        return out
