"""Helpers for the gateway tests: a scripted agent policy, backends that return non-canonical ids and record what
they were given, and the token invariants every trajectory the gateway builds must satisfy."""
from __future__ import annotations

import json
from typing import Any

from envhub.backends.base import Generation, LLMBackend
from envhub.backends.scripted import ScriptedBackend
from envhub.env import Action, ToolCall

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
                                         "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                                                        "required": ["command"]}}}
TOOLS = [BASH]
AUX_SYSTEM = "You are a title generator. Reply with a title only."


def agent_policy(task: Any, messages: list[dict]) -> Action:
    """A tool-using agent: a bash call per turn (its command names the turn), a final answer after three; a title
    when asked by the aux system prompt; a summary when asked to compact."""
    if messages and messages[0].get("role") == "system" and AUX_SYSTEM in messages[0]["content"]:
        return Action("Title: listing files")
    last = messages[-1].get("content") or ""
    if "COMPACTION" in last:
        return Action("Summary: listed files, found a.txt.")
    turns = sum(m.get("role") == "assistant" for m in messages)
    if turns >= 3:
        return Action(f"Done after {turns} turns: café ✓")
    return Action(f"Step {turns}: looking", [ToolCall("bash", {"command": f"echo {turns} && ls"})])


class Recording(LLMBackend):
    """Wraps a backend; remembers every (prompt ids, generation) pair it served, in order."""

    name = "recording"

    def __init__(self, inner: LLMBackend):
        self.inner, self.calls = inner, []
        self.name = inner.name

    def open_session(self, session_id, **kw):
        self.inner.open_session(session_id, **kw)

    def close_session(self, session_id):
        self.inner.close_session(session_id)

    async def generate(self, prompt_ids, params, *, session_id=""):
        gen = await self.inner.generate(prompt_ids, params, session_id=session_id)
        self.calls.append((list(prompt_ids), gen))
        return gen


class NonCanonicalScripted(ScriptedBackend):
    """The scripted agent, but its ids are not the canonical tokenization of its text: the text before the tool call
    is one token per UTF-8 byte, real tiny-model samples (a pool drawn once) are put in front, and every second turn ends on ``<|endoftext|>`` instead of the template's ``<|im_end|>``. Logprobs
    are distinct negative numbers, so a shifted or lost logprob shows."""

    def __init__(self, policy, tokenizer, samples: list[list[int]] | None = None):
        super().__init__(policy)
        self.tok, self.samples, self.turn = tokenizer, samples or [], 0

    async def generate(self, prompt_ids, params, *, session_id=""):
        from rollout_sim import byte_ids

        session = self._sessions[session_id]
        action = Action.coerce(self.policy(session.task, session.messages))
        codec = session.codec
        text = codec.render_action(action)
        cut = text.find("<tool_call>") if "<tool_call>" in text else len(text)
        head, tail = text[:cut], text[cut:]
        ids = list(self.samples[self.turn % len(self.samples)]) if self.samples else []
        ids += byte_ids(self.tok, head) + (codec.encode(tail) if tail else [])
        self.turn += 1
        ids.append(self.tok.convert_tokens_to_ids("<|endoftext|>" if self.turn % 2 else "<|im_end|>"))
        lps = [-0.5 - 0.001 * (k + 7 * self.turn) for k in range(len(ids))]
        return Generation(ids, lps, "stop")


def invariant_problems(session, trajs, recorded: list[tuple[list[int], Generation]],
                       untrained: set[str] = frozenset()) -> list[str]:
    """The token invariants, against what the backend really got and returned (``recorded``, in call order):

    * for every call of every trajectory, the trajectory's tokens before it are exactly the prompt the backend was
      given (generation context == training context), and its sampled ids follow unchanged;
    * the mask-1 tokens of all trajectories are exactly the sampled tokens of every call but ``untrained`` (each
      trained once), each with its sampled logprob.
    """
    problems: list[str] = []
    ok_calls = [c for c in session.calls if c.ok]
    if len(ok_calls) != len(recorded):
        return [f"{len(ok_calls)} finished calls but the backend served {len(recorded)}"]
    served = {c.call_id: recorded[i] for i, c in enumerate(ok_calls)}
    trained: dict[str, int] = {}
    for t in trajs:
        ids, p = list(t.prompt_ids) + list(t.response_ids), len(t.prompt_ids)
        spans = set()
        for cid in t.details["calls"]:
            prompt, gen = served[cid]
            n, g = len(prompt), list(gen.token_ids)
            if ids[:n] != prompt:
                problems.append(f"{cid}: the trajectory's context before this call is not the backend's prompt")
                continue
            if ids[n:n + len(g)] != g:
                problems.append(f"{cid}: the sampled ids are not in the trajectory unchanged")
                continue
            span = range(n - p, n - p + len(g))
            if any(t.response_mask[i] for i in span):
                trained[cid] = trained.get(cid, 0) + 1
                for j, i in enumerate(span):
                    if t.response_mask[i] != 1 or t.response_logprobs[i] != gen.logprobs[j]:
                        problems.append(f"{cid}: token {j} mask {t.response_mask[i]} logprob "
                                        f"{t.response_logprobs[i]} (sampled {gen.logprobs[j]})")
                        break
            spans.update(span)
        stray = [i for i, m in enumerate(t.response_mask) if m and i not in spans]
        if stray:
            problems.append(f"{t.details['calls']}: mask-1 tokens that no call sampled at {stray[:5]}")
    for c in ok_calls:
        want = 0 if c.call_id in untrained else 1
        if trained.get(c.call_id, 0) != want:
            problems.append(f"{c.call_id}: trained in {trained.get(c.call_id, 0)} trajectories, expected {want}")
    return problems


def context_problems(session, recorded) -> list[str]:
    """Every recorded call's backend prompt equals the gateway's record (the trainer-visible context)."""
    out = []
    calls = [c for c in session.calls if c.ok]
    for c in calls:
        if not any(prompt == c.prompt_ids and list(g.token_ids) == c.sampled_ids for prompt, g in recorded):
            out.append(f"{c.call_id}: no backend call had this prompt and output")
    return out


def echo(message: dict, how: str) -> dict:
    """An assistant message as a harness echoes it (see ../shared/research §3)."""
    m = json.loads(json.dumps(message))
    if how == "compact_args":
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.dumps(json.loads(c["function"]["arguments"]), separators=(",", ":"))
    elif how == "pretty_args":
        for c in m.get("tool_calls") or []:
            c["function"]["arguments"] = json.dumps(json.loads(c["function"]["arguments"]), indent=2, sort_keys=True)
    elif how == "null_content" and m.get("tool_calls"):
        m["content"] = None
    elif how == "drop_content" and m.get("tool_calls"):
        m.pop("content", None)
        m["provider_specific_fields"] = {"refusal": None}
    elif how == "parts":
        m["content"] = [{"type": "text", "text": m.get("content") or ""}]
    elif how == "extra_fields":
        m["reasoning_content"] = None
        m["annotations"] = []
    return m


ECHOES = ("verbatim", "compact_args", "pretty_args", "null_content", "drop_content", "parts", "extra_fields")
