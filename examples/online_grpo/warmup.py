"""A format warm-up: teach the tiny random model the *shape* of a reply before RL teaches it the task.

A freshly initialised model never ends its turn within a few tokens (its end-of-turn token is one of ~700), and a
reply cut by the token budget is not an action (the executor grades it as an unfinished episode: reward 0), so RL
from random weights would see no reward at all. Real pipelines start RL from a model that already follows the chat
format (an SFT checkpoint); this is that step in miniature: a few supervised steps on replies of eight *random*
digits followed by the end-of-turn token. The digits are drawn independently of the prompt, so after the warm-up
the reward is that of guessing (about 0.33: one digit in ten is the shown one) and copying the shown digit is left
for RL to learn.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import echo_digit


def format_warmup(model_path: Path, cache: Path, *, steps: int = 20, batch: int = 16, lr: float = 3e-3,
                  seed: int = 0) -> Path:
    """Train ``model_path`` on the reply format and save it under ``cache`` (reused when already there, keyed on
    the settings); return its directory."""
    out = cache / f"{model_path.name}-echo-format-{steps}x{batch}-lr{lr:g}-s{seed}"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    model.train()
    rng = random.Random(seed)
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        seqs, masks = [], []
        for _ in range(batch):
            prompt = tok.apply_chat_template([{"role": "user", "content": echo_digit.prompt_text(rng.randrange(10))}],
                                             add_generation_prompt=True, tokenize=False)
            prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]
            reply = "".join(str(rng.randrange(10)) for _ in range(echo_digit.COPIES))
            reply_ids = tok(reply, add_special_tokens=False)["input_ids"] + [eos]
            seqs.append(prompt_ids + reply_ids)
            masks.append([0] * len(prompt_ids) + [1] * len(reply_ids))
        width = max(map(len, seqs))
        ids = torch.tensor([s + [eos] * (width - len(s)) for s in seqs])
        labels = torch.tensor([[t if m else -100 for t, m in zip(s, mk)] + [-100] * (width - len(s))
                               for s, mk in zip(seqs, masks)])
        attn = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
        loss = model(input_ids=ids, attention_mask=attn, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(model_path, tmp)  # the tokenizer and generation config as they are
    model.save_pretrained(tmp)
    tmp.replace(out)
    return out
