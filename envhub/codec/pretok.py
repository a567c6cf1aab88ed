"""Pre-tokenization of ASCII text in Python, exactly as the Rust ``tokenizers`` regex splits it.

A byte-level BPE tokenizer (GPT-2, Llama-3, Qwen2, SmolLM...) turns a text segment into ids in three steps: a regex
splits it into pre-tokens ("words"), each word's bytes are mapped to printable characters, and the BPE model turns each
word into ids on its own, without looking at its neighbours. The last two steps are a function of the word alone, so
their result can be cached per word (``envhub.codec.encoding`` does). The first is where the Rust pipeline spends
its time: Oniguruma and offset bookkeeping cost several times what Python's ``re`` does per word (what the executor
spends per turn is measured by ``benchmarks/executor_overhead.py``).

Python's ``re`` is not Oniguruma, so the regex is only run here where the two provably agree:

* only the patterns in ``KNOWN`` (the ones real byte-level tokenizers ship), translated mechanically below;
* only on ASCII text, where each class the patterns use is a small finite set that can be written out:
  ``\\p{L}`` = ``[A-Za-z]``, ``\\p{N}`` = ``[0-9]``, ``\\s`` = ``[\\t\\n\\v\\f\\r ]``. That last one is Unicode's
  White_Space, which Oniguruma uses; Python's own ``\\s`` would also match ``\\x1c``-``\\x1f``, so it is never used;
* both engines are backtracking engines with leftmost-first alternation, greedy quantifiers and the same lookahead,
  so with identical classes they make identical choices. ``(?i:...)`` only folds ASCII letters on ASCII input in both.

Every pattern in ``KNOWN`` matches any single character at any position (``\\s+``, ``\\p{L}+``, ``\\p{N}`` and
``[^\\s\\p{L}\\p{N}]+`` alternatives), so the "isolated" split leaves no gaps and ``findall`` is the whole split.
``tests/rollout/test_encoding.py`` checks all of this against the Rust pre-tokenizers on every ASCII pair, on
triples over every character class, and on random strings.
"""
from __future__ import annotations

import json
import re
from typing import Any, Callable

# The regex ByteLevel(use_regex=True) applies itself (tokenizers' byte_level.rs).
GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# Split(...) + ByteLevel(use_regex=False) pipelines: Llama-3 (digits in runs of up to three), Qwen2/2.5/3 (one digit).
LLAMA3 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2 = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
KNOWN = (GPT2, LLAMA3, QWEN2)

_WHITE = r"\t\n\x0b\x0c\r "  # Unicode White_Space restricted to ASCII (no \x1c-\x1f: see the module docstring)
# escape -> (inside a [...] class, outside one); None: not expressible there
_ASCII_CLASSES = {
    r"\p{L}": ("A-Za-z", "[A-Za-z]"),
    r"\p{N}": ("0-9", "[0-9]"),
    r"\s": (_WHITE, f"[{_WHITE}]"),
    r"\S": (None, f"[^{_WHITE}]"),
    r"\r": (r"\r", r"\r"),
    r"\n": (r"\n", r"\n"),
}


def ascii_pattern(pattern: str) -> re.Pattern:
    """``pattern`` (Oniguruma syntax, one of ``KNOWN``) as a Python regex that splits ASCII text identically."""
    out, i, in_class = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            esc = next((e for e in _ASCII_CLASSES if pattern.startswith(e, i)), None)
            inside, outside = _ASCII_CLASSES.get(esc, (None, None))
            text = inside if in_class else outside
            if text is None:
                raise ValueError(f"cannot translate {pattern[i:i + 6]!r} in {pattern!r}")
            out.append(text)
            i += len(esc)
            continue
        in_class = True if c == "[" else False if c == "]" else in_class
        out.append(c)
        i += 1
    return re.compile("".join(out))


def _state(component: Any) -> dict | None:
    """A tokenizers pipeline component's configuration (its pickled JSON), or None when it has none."""
    if component is None:
        return None
    return json.loads(component.__getstate__())


def ascii_splitter(pre_tokenizer: Any) -> Callable[[str], list[str]] | None:
    """``findall`` of the Python regex that pre-tokenizes ASCII text like ``pre_tokenizer`` (a
    ``tokenizers.pre_tokenizers.PreTokenizer``), or ``None`` when the pipeline is not one we can reproduce.

    Accepted: ``ByteLevel(add_prefix_space=False, use_regex=True)`` and ``Sequence([Split(Regex(p), "isolated"),
    ByteLevel(add_prefix_space=False, use_regex=False)])`` with ``p`` in ``KNOWN``. The words it returns are the raw
    text; the byte-to-character mapping is applied by the caller.
    """
    try:
        state = _state(pre_tokenizer)
    except Exception:
        return None
    if not state:
        return None
    if state.get("type") == "ByteLevel":
        if state.get("add_prefix_space") or not state.get("use_regex", True):
            return None
        return ascii_pattern(GPT2).findall
    if state.get("type") != "Sequence" or len(state.get("pretokenizers") or []) != 2:
        return None
    split, byte_level = state["pretokenizers"]
    if (split.get("type") != "Split" or split.get("behavior") != "Isolated" or split.get("invert")
            or byte_level.get("type") != "ByteLevel" or byte_level.get("add_prefix_space")
            or byte_level.get("use_regex", True)):
        return None
    pattern = (split.get("pattern") or {}).get("Regex")
    return ascii_pattern(pattern).findall if pattern in KNOWN else None


_ASCII_IDENTITY = {"NFC", "NFD", "NFKC", "NFKD"}  # Unicode normal forms leave ASCII text unchanged


def ascii_identity_normalizer(normalizer: Any) -> bool:
    """Whether ``normalizer`` leaves every ASCII text unchanged (none, a Unicode normal form, a sequence of those)."""
    try:
        state = _state(normalizer)
    except Exception:
        return False

    def identity(s: dict | None) -> bool:
        if not s:
            return True
        if s.get("type") == "Sequence":
            return all(identity(n) for n in s.get("normalizers") or [])
        return s.get("type") in _ASCII_IDENTITY

    return identity(state)


def byte_chars(ascii_map: Callable[[str], str]) -> dict[int, str]:
    """The ``str.translate`` table of the byte-level alphabet on ASCII, read off the real ByteLevel pre-tokenizer
    (``ascii_map`` maps a string of all 128 ASCII characters, in order) rather than re-derived from GPT-2's code."""
    alphabet = "".join(map(chr, range(128)))
    mapped = ascii_map(alphabet)
    if len(mapped) != 128:
        raise ValueError("the byte-level alphabet does not map ASCII one character per byte")
    return {i: mapped[i] for i in range(128)}
