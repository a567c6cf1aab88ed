"""``TextEncoder``: text -> token ids exactly as ``tokenizer.encode(text, add_special_tokens=False)``, but fast.

The executor tokenizes every env reply (and every prompt). Through the Rust ``tokenizers`` pipeline that is a large
share of a turn's own work (``benchmarks/executor_overhead.py``). For the byte-level BPE tokenizers most chat models
use, this module gets the same ids in a fraction of that by following the pipeline's own structure:

1. **Added tokens split the text first.** The pipeline cuts the raw text at every added token (``<|im_start|>``,
   ``<tool_call>``...; leftmost-longest, before normalization) and handles each piece between them on its own. We
   cut with a Python regex of the token strings, longest first (which is leftmost-longest), and look their ids up.
   Tokens that move the cut (``lstrip``/``rstrip`` eat neighbouring whitespace, ``single_word`` looks at neighbours)
   or tokenizers that do not split special tokens (``encode_special_tokens``) turn this path off.
2. **Each piece is normalized, then split into words.** For an ASCII piece, with a normalizer that leaves ASCII
   unchanged and a pre-tokenizer regex we can reproduce exactly (``envhub.codec.pretok``), the words come from
   Python's ``re``. Added tokens marked ``normalized`` are matched inside the normalized piece, as the pipeline does.
   A non-ASCII piece is encoded by the Rust pipeline on its own (exact: pieces are independent, see 1).
3. **Each word becomes ids on its own.** The BPE model sees one word at a time, so a word's ids are cached (keyed by
   the word, bounded): the per-word cache the Rust BPE model itself keeps, minus the Rust call around it. Nothing
   is cached per text: a new reply made of known words hits, an unseen word costs one model call.

Anything else (SentencePiece/Metaspace, WordPiece, BPE dropout, other regexes) uses the Rust pipeline unchanged.
The fast path is also checked against the Rust pipeline on its first ``CHECK_FIRST`` uses and every
``CHECK_EVERY``-th use after; a disagreement turns it off for good (and is logged), so a gap in the reasoning above
costs speed, never ids. The added tokens are read when the encoder is built (as a ``ChatCodec`` reads its template):
add tokens to a tokenizer before building codecs for it.
"""
from __future__ import annotations

import logging
import re
import weakref
from typing import Any, Callable

from envhub.codec.pretok import ascii_identity_normalizer, ascii_splitter, byte_chars

CHECK_FIRST = 16
CHECK_EVERY = 256
WORD_CACHE = 1 << 16  # words; cleared when full (a cache, not a record: misses only cost a Rust call)

log = logging.getLogger(__name__)
_SHARED: "weakref.WeakKeyDictionary[Any, TextEncoder]" = weakref.WeakKeyDictionary()


class TextEncoder:
    """Encode and decode with one tokenizer: ``encode(text)`` (special tokens in the text are recognized, none are
    added) and ``decode(ids)`` (special tokens kept). Use :meth:`shared` to share the word cache per tokenizer."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.rust_encode, uses_backend = _rust_encoder(tokenizer)
        self.decode: Callable[[list[int]], str] = _decoder(tokenizer)
        self.words: WordPath | None = WordPath.build(tokenizer, self.rust_encode) if uses_backend else None
        self._uses = 0

    @classmethod
    def shared(cls, tokenizer: Any) -> TextEncoder:
        try:
            enc = _SHARED.get(tokenizer)
            if enc is None:
                enc = _SHARED[tokenizer] = cls(tokenizer)
            return enc
        except TypeError:  # not weak-referenceable
            return cls(tokenizer)

    @property
    def fast(self) -> bool:
        """Whether the word path is on (see the module docstring)."""
        return self.words is not None

    def encode(self, text: str) -> list[int]:
        words = self.words
        if words is None:
            return self.rust_encode(text)
        self._uses = n = self._uses + 1
        if n <= CHECK_FIRST or not n % CHECK_EVERY:
            return self._checked(text)
        try:
            return words.encode(text)
        except Exception:  # a word the BPE model cannot encode: let the pipeline raise (or cope) as it would
            return self.rust_encode(text)

    def _checked(self, text: str) -> list[int]:
        want = self.rust_encode(text)
        try:
            got = self.words.encode(text) if self.words is not None else want
        except Exception:
            got = None
        if got != want and self.words is not None:
            self.words = None
            name = getattr(self.tokenizer, "name_or_path", "") or type(self.tokenizer).__name__
            log.warning("envhub: the fast word encoder disagrees with tokenizer %r on %r; using the Rust "
                        "pipeline from now on", name, text[:200])
        return want


class WordPath:
    """Steps 1-3 of the module docstring for one tokenizer. ``build`` returns ``None`` where they do not apply."""

    def __init__(self, model: Any, split_added: Callable | None, split_normalized: Callable | None,
                 added_ids: dict[str, int], findall: Callable[[str], list[str]], table: dict[int, str],
                 rust_encode: Callable[[str], list[int]], raw_tokens: list[str]):
        self.raw_tokens = raw_tokens  # the added tokens the text is cut at first (not ``normalized``)
        self.model, self.split_added, self.split_normalized = model, split_added, split_normalized
        self.added_ids, self.findall, self.table, self.rust_encode = added_ids, findall, table, rust_encode
        self.cache: dict[str, tuple[int, ...]] = {}

    @classmethod
    def build(cls, tokenizer: Any, rust_encode: Callable[[str], list[int]]) -> WordPath | None:
        from tokenizers import pre_tokenizers

        backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
        try:
            model = backend.model
            if type(model).__name__ != "BPE" or getattr(model, "dropout", None):
                return None  # dropout makes a word's ids random: nothing to cache
            if getattr(backend, "encode_special_tokens", False) or backend.truncation or backend.padding:
                return None
            if not ascii_identity_normalizer(backend.normalizer):
                return None
            findall = ascii_splitter(backend.pre_tokenizer)
            if findall is None:
                return None
            byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
            table = byte_chars(lambda s: "".join(w for w, _ in byte_level.pre_tokenize_str(s)))
            added = list(backend.get_added_tokens_decoder().items())
        except Exception:  # an older or unusual tokenizers build: keep the Rust pipeline
            return None
        if any(t.lstrip or t.rstrip or t.single_word for _, t in added):
            return None
        added_ids = {t.content: i for i, t in added if t.content}
        raw = [t.content for _, t in added if t.content and not t.normalized]
        normalized = [t.content for _, t in added if t.content and t.normalized]
        return cls(model, _splitter(raw), _splitter(normalized), added_ids, findall, table, rust_encode, raw)

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        get, findall, learn = self.cache.get, self.findall, self._learn  # (locals: this loop runs per word)
        is_token = False  # re.split with one group alternates: text, token, text, ..., token, text
        for piece in self.split_added(text) if self.split_added is not None else (text,):
            if is_token:
                out.append(self.added_ids[piece])
            elif not piece.isascii():
                out += self.rust_encode(piece)  # normalized, pre-tokenized and modelled on its own, as in the text
            elif self.split_normalized is None:
                for word in findall(piece):
                    ids = get(word)
                    out += ids if ids is not None else learn(word)
            else:  # the normalizer leaves ASCII unchanged: normalized added tokens match the raw piece
                for j, part in enumerate(self.split_normalized(piece)):
                    if j & 1:
                        out.append(self.added_ids[part])
                    else:
                        for word in findall(part):
                            ids = get(word)
                            out += ids if ids is not None else learn(word)
            is_token = not is_token
        return out

    def _learn(self, word: str) -> tuple[int, ...]:
        # a tuple of ints, not a list: the garbage collector stops tracking it, so a full cache costs no GC time
        ids = tuple([t.id for t in self.model.tokenize(word.translate(self.table))])
        if len(self.cache) >= WORD_CACHE:
            self.cache.clear()
        self.cache[word] = ids
        return ids


def _splitter(tokens: list[str]) -> Callable[[str], list[str]] | None:
    """``re.split`` at every occurrence of ``tokens``, leftmost-longest (alternatives longest first), keeping them."""
    if not tokens:
        return None
    alternatives = "|".join(re.escape(t) for t in sorted(set(tokens), key=len, reverse=True))
    return re.compile(f"({alternatives})").split


def _rust_encoder(tokenizer: Any) -> tuple[Callable[[str], list[int]], bool]:
    """The Rust pipeline without transformers' per-call overhead, when it agrees with ``tokenizer.encode``; and
    whether that is what is returned (the word path is only built on top of it)."""
    slow = lambda text: list(tokenizer.encode(text, add_special_tokens=False))  # noqa: E731
    backend = getattr(tokenizer, "backend_tokenizer", None) or getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "encode"):
        return slow, False
    fast = lambda text: backend.encode(text, add_special_tokens=False).ids  # noqa: E731
    sample = "Héllo <|im_end|>\n  wörld 🙂 12345\t{\"a\": [1]}\r\n"
    return (fast, True) if fast(sample) == slow(sample) else (slow, False)


def _decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    slow = lambda ids: tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)  # noqa: E731
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "decode"):
        return slow
    fast = lambda ids: backend.decode(ids, skip_special_tokens=False)  # noqa: E731
    # a sample (the first 256 ids and the special ones), not every id: len(tokenizer) is slow on some tokenizers
    sample = list(range(256)) + list(getattr(tokenizer, "all_special_ids", []) or [])
    try:
        return fast if fast(sample) == slow(sample) else slow  # the raw pipeline only when it agrees
    except Exception:
        return slow
