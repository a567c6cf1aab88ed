"""Helpers for the fidelity tests: non-canonical tokenizations and the executor's token assembly, step by step.

``assemble`` does what the executor does with a ``ChatCodec`` (prompt, sampled ids unchanged with mask 1, delta ids
with mask 0), from a script of already-sampled generations and env replies, so the fidelity check and independent
oracles can be run on real templates and real tokenizers without a model in the loop.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

from envhub.backends.base import Generation
from envhub.codec.chat import ChatCodec, normalize_messages
from envhub.rollout.trajectory import Trajectory

TOOLS = [
    {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                      "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}},
                                                     "required": ["cmd"]}}},
    {"type": "function", "function": {"name": "finish", "description": "Give the final answer.",
                                      "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}}}},
]


@lru_cache(maxsize=1)
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, which byte-level BPE vocabularies are written in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_ids(tok: Any, text: str) -> list[int]:
    """``text`` as one token per UTF-8 byte: the least canonical tokenization there is (same text, other ids)."""
    table = _bytes_to_unicode()
    return [tok.convert_tokens_to_ids(table[b]) for b in text.encode("utf-8")]


def split_ids(codec: ChatCodec, text: str, cuts: list[int]) -> list[int]:
    """Encode ``text`` in pieces cut at character offsets ``cuts``: merges never cross a cut, so ids differ from
    the canonical ones whenever a cut falls inside a merge."""
    out, last = [], 0
    for c in sorted({min(max(c, 0), len(text)) for c in cuts}) + [len(text)]:
        if c > last:
            out += codec.encode(text[last:c])
            last = c
    return out


@dataclass
class Turn:
    """One sampled generation and what the env answers to it (``reply(action) -> messages``; ``None``: the episode
    ends after this turn with no reply appended)."""

    ids: list[int]
    logprobs: list[float]
    reply: Callable[[Any], list[dict]] | None = None
    stop: list[str] = field(default_factory=list)
    finish_reason: str = "stop"


def assemble(codec: ChatCodec, opening: list[dict], turns: list[Turn], *, env_id: str = "sim",
             final_reply_gp: bool | None = None) -> tuple[Trajectory, list[Generation], list[dict]]:
    """Build the trajectory the executor would build; returns it, the generations, and per-turn env replies."""
    messages = [dict(m) for m in opening]
    prompt = codec.prompt_ids(messages)
    ids: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    gens: list[Generation] = []
    replies: list[dict] = []
    finish, truncated = "done", False
    for k, t in enumerate(turns):
        gens.append(Generation(list(t.ids), list(t.logprobs), t.finish_reason))
        ids += t.ids
        mask += [1] * len(t.ids)
        lps += list(t.logprobs)
        msg, action = codec.assistant_message(t.ids, turn=k, stop=t.stop)
        messages.append(msg)
        if t.finish_reason == "length":
            finish, truncated = "length", True
            break
        if t.reply is None:
            break
        new = t.reply(action)
        last = k == len(turns) - 1
        if last and final_reply_gp is None:
            messages.extend(new)  # the final env reply is recorded in messages but not in tokens
            break
        delta = codec.delta_ids(messages, new, sampled_eos=codec.ends_turn(t.ids),
                                add_generation_prompt=not last or bool(final_reply_gp))
        replies.append({"turn": k, "messages": new, "ids": delta})
        ids += delta
        mask += [0] * len(delta)
        lps += [0.0] * len(delta)
        messages.extend(new)
    traj = Trajectory(env_id=env_id, task_id="t0", prompt_ids=prompt, response_ids=ids, response_mask=mask,
                      response_logprobs=lps, num_turns=len(gens), finish_reason=finish, truncated=truncated,
                      messages=messages)
    return traj, gens, replies


def oracle_env_text(tok: Any, tools: Any, history: list[dict], new: list[dict], end_of_turn: str,
                    sampled_eos: bool, add_generation_prompt: bool = True) -> str:
    """The env span's text computed with transformers' public ``apply_chat_template`` (not the codec's renderer)."""
    kw = {"tools": tools} if tools else {}
    before = tok.apply_chat_template(normalize_messages(history), tokenize=False, **kw)
    after = tok.apply_chat_template(normalize_messages(history + new), tokenize=False,
                                    add_generation_prompt=add_generation_prompt, **kw)
    assert after.startswith(before)
    tail = before[before.rindex(end_of_turn) + len(end_of_turn):]
    return ("" if sampled_eos else end_of_turn) + tail + after[len(before):]
