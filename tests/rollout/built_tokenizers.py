"""Small BPE tokenizers trained offline with the pipelines real models ship (and ones the fast encoder must refuse),
wrapped as transformers fast tokenizers with the ChatML template: ``built_tokenizers()`` -> name -> (tokenizer, whether
``TextEncoder`` should take its word path)."""
from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from envhub.testing.chat_templates import CHATML_TEMPLATE
from envhub.codec.pretok import LLAMA3, QWEN2

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def train(pre_tokenizer, *, normalizer=None, added=(), dropout=None, metaspace=False):
    from transformers import PreTrainedTokenizerFast

    from envhub.testing.models import _corpus

    tok = Tokenizer(models.BPE(dropout=dropout, unk_token=None))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.Metaspace() if metaspace else decoders.ByteLevel()
    alphabet = {} if metaspace else {"initial_alphabet": pre_tokenizers.ByteLevel.alphabet()}
    trainer = trainers.BpeTrainer(vocab_size=900, show_progress=False, **alphabet,
                                  special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tok.train_from_iterator(_corpus(), trainer=trainer)
    if added:
        tok.add_tokens(list(added))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML_TEMPLATE
    return fast


def split_then_bytes(pattern: str):
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def built_tokenizers() -> dict:
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return {
        "gpt2": (train(gpt2), True),  # SmolLM2 / GPT-2 style
        "llama3": (train(split_then_bytes(LLAMA3)), True),
        "qwen2-nfc": (train(split_then_bytes(QWEN2), normalizer=normalizers.NFC()), True),
        # a normalized added token, and a raw one that overlaps it (the raw one is cut first)
        "normalized-added": (train(gpt2, added=[AddedToken("<tool_call>", normalized=True),
                                                AddedToken("call>x", normalized=False)]), True),
        # an added token that can straddle a frame boundary: the frame split must refuse, ids stay exact
        "newline-token": (train(gpt2, added=[AddedToken("\n\n", normalized=False)]), True),
        "lstrip-rstrip": (train(gpt2, added=[AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False)]), False),
        "lowercase": (train(gpt2, normalizer=normalizers.Lowercase()), False),
        "dropout": (train(gpt2, dropout=0.5), False),
        "metaspace": (train(pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first"), metaspace=True), False),
        "other-regex": (train(split_then_bytes(r"\p{N}+|[^\p{N}]+")), False),  # not a pattern we know
    }
