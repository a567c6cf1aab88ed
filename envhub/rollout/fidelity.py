"""The token-fidelity check: does a :class:`Trajectory` hold exactly what the model sampled and what the env said?

A trainer learns from ``prompt_ids + response_ids`` weighted by ``response_mask`` and ``response_logprobs``. If any
sampled id was re-tokenized, any env token is marked as the model's, or a logprob sits one position off, the
gradient is silently wrong. :func:`check_trajectory` proves the opposite, turn by turn:

1. ``response_ids``, ``response_mask`` and ``response_logprobs`` have one entry per token; the mask is 0/1;
   logprobs are finite, 0.0 on env tokens and at most 0 on sampled ones.
2. ``prompt_ids`` are the chat template's rendering of the opening messages (plus generation prompt), tokenized
   by the tokenizer's own pipeline (never the executor's fast word path, which the check must not grade itself).
3. The record alternates: the ids of assistant turn *k* (mask 1), then the env's reply to it (mask 0); an
   assistant message the model did not sample (:func:`sampled_turns`) is part of the prompt or the env's reply. With
   ``generations`` (what the backend returned), each turn's ids and logprobs must equal the sampled ones exactly.
4. Each env span decodes to the template's rendering of the env messages after that turn (re-rendered from
   ``traj.messages`` with :meth:`ChatCodec.delta_text`) and, with ``strict=True``, has exactly the ids of that
   text through the tokenizer's own pipeline.

The result is a list of problems (empty: faithful). ``Trajectory.check`` calls this; :func:`check_file` checks a
JSON-lines file, a JSON list, a parquet file or a ``datasets`` directory of trajectories (``envhub check-trajectory``).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable

from envhub.codec.chat import ChatCodec, ChatTemplateError
from envhub.rollout.versions import version_problems
from envhub.rollout.trajectory import Trajectory

MAX_SHOWN = 60  # chars of text shown around a mismatch


class FidelityError(AssertionError):
    """A trajectory failed the token-fidelity check; ``problems`` lists why."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("trajectory is not faithful:\n  - " + "\n  - ".join(problems))


def _codec(tokenizer_or_codec: Any, tools: Any) -> ChatCodec:
    if isinstance(tokenizer_or_codec, ChatCodec):
        return tokenizer_or_codec
    return ChatCodec(tokenizer_or_codec, tools=tools)


def _gen_parts(g: Any) -> tuple[list[int], list[float] | None]:
    if isinstance(g, dict):
        return list(g["token_ids"]), g.get("logprobs")
    if isinstance(g, (list, tuple)) and (not g or isinstance(g[0], int)):
        return list(g), None
    return list(g.token_ids), getattr(g, "logprobs", None)


def _first_diff(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _show(s: str, at: int) -> str:
    return repr(s[max(0, at - 10): at + MAX_SHOWN])


def _run(mask: list[int], start: int, value: int) -> int:
    end = start
    while end < len(mask) and mask[end] == value:
        end += 1
    return end


def tools_of(traj: Trajectory) -> list[dict] | None:
    """The tool schemas a trajectory was rendered with, from ``details["tools"]``.

    Store them as a JSON *string* (``json.dumps(tools)``): key order changes the rendered prompt, and
    ``Trajectory.to_row`` writes ``details`` with sorted keys. A list is accepted too (exact in memory / JSON lines).
    """
    t = traj.details.get("tools") if isinstance(traj.details, dict) else None
    return json.loads(t) if isinstance(t, str) else t


def sampled_turns(traj: Trajectory) -> list[int] | str:
    """Indices of the assistant messages the model sampled (or why the record's own list is malformed).

    Every assistant message, unless the trajectory says which: the gateway's trajectories carry
    ``details["turns"]`` (``[message index, start, end]`` per model call), because a harness may put assistant
    messages of its own into the history (Qwen Code opens with "Got it. Thanks for the context!", which no model
    sampled). Those are context: they must then sit in the prompt or an env span, rendered by the template, mask 0."""
    msgs = traj.messages
    listed = traj.details.get("turns") if isinstance(traj.details, dict) else None
    if not listed:
        return [i for i, m in enumerate(msgs) if m.get("role") == "assistant"]
    idx = [t[0] for t in listed]
    if any(not isinstance(i, int) or not 0 <= i < len(msgs) or msgs[i].get("role") != "assistant" for i in idx) \
            or idx != sorted(set(idx)):
        return f"details['turns'] names {idx}, not increasing indices of assistant messages in messages"
    return idx


def assert_faithful(traj: Trajectory | dict[str, Any], tokenizer_or_codec: Any, **kwargs: Any) -> None:
    """:func:`check_trajectory`, raising :class:`FidelityError` (with every problem) when there is any."""
    problems = check_trajectory(traj, tokenizer_or_codec, **kwargs)
    if problems:
        raise FidelityError(problems)


def check_trajectory(traj: Trajectory | dict[str, Any], tokenizer_or_codec: Any, *, generations: list[Any] | None = None,
                     tools: list[dict] | None = None, strict: bool = True) -> list[str]:
    """Problems that make ``traj`` unfaithful (empty list: it is faithful). See the module docstring.

    Args:
        traj: a :class:`Trajectory` or its dict / dataset row.
        tokenizer_or_codec: the :class:`ChatCodec` the rollout used, or its tokenizer (then ``tools`` are needed
            if the rollout had tools; ``traj.details["tools"]`` is used when present, see :func:`tools_of`).
        generations: what the backend returned per turn (``Generation`` objects, dicts with ``token_ids`` and
            ``logprobs``, or plain id lists); when given, each must sit unchanged at its position.
        strict: also require env spans to be the codec's exact ids (not only the same text).
    """
    if not isinstance(traj, Trajectory):
        traj = Trajectory.from_row(traj) if isinstance(traj.get("messages"), str) else Trajectory.from_dict(traj)
    if tools is None and not isinstance(tokenizer_or_codec, ChatCodec):
        tools = tools_of(traj)
    codec = _codec(tokenizer_or_codec, tools)
    ids, mask, lps = list(traj.response_ids), list(traj.response_mask), list(traj.response_logprobs)
    problems: list[str] = []

    # 1. one mask value and one logprob per token, sane values
    if not (len(ids) == len(mask) == len(lps)):
        return [f"lengths differ: {len(ids)} response ids, {len(mask)} mask values, {len(lps)} logprobs"]
    bad_mask = [i for i, m in enumerate(mask) if m not in (0, 1)]
    if bad_mask:
        problems.append(f"mask values must be 0 or 1 (positions {bad_mask[:5]})")
    for i, (m, lp) in enumerate(zip(mask, lps)):
        if not isinstance(lp, (int, float)) or not math.isfinite(lp):
            problems.append(f"logprob at position {i} is not a finite number: {lp!r}")
        elif m == 0 and lp != 0.0:
            problems.append(f"env token at position {i} has logprob {lp} (must be 0.0): a shifted logprob or mask?")
        elif m == 1 and lp > 1e-4:
            problems.append(f"sampled token at position {i} has logprob {lp} > 0")
        if len(problems) > 20:
            break
    problems += version_problems(traj)

    # 2. the prompt
    msgs = traj.messages
    turns = sampled_turns(traj)
    if isinstance(turns, str):
        return problems + [turns]
    opening = msgs[: turns[0]] if turns else msgs
    try:
        want = codec.prompt_ids(opening, exact=True)
    except ChatTemplateError as e:
        return problems + [f"cannot render the opening messages: {e}"]
    if list(traj.prompt_ids) != want:
        at = _first_diff(list(traj.prompt_ids), want)
        problems.append(
            f"prompt_ids differ from the template's rendering of the {len(opening)} opening message(s) at token {at} "
            f"({len(traj.prompt_ids)} vs {len(want)} tokens): got {_show(codec.decode(list(traj.prompt_ids)[at:]), 0)}, "
            f"want {_show(codec.decode(want[at:]), 0)}"
        )

    # 3-4. walk the turns
    gens = [_gen_parts(g) for g in generations] if generations is not None else None
    pos = 0
    for k, ai in enumerate(turns):
        # the model's span
        if gens is not None:
            if k >= len(gens):
                problems.append(f"{len(turns)} assistant messages but only {len(gens)} generations")
                break
            g_ids, g_lps = gens[k]
            end = pos + len(g_ids)
            if ids[pos:end] != g_ids:
                at = pos + _first_diff(ids[pos:end], g_ids)
                problems.append(f"turn {k}: sampled ids changed at response position {at} (want {len(g_ids)} ids "
                                f"{g_ids[:8]}..., found {ids[pos:pos + 8]}...): re-tokenized or shifted?")
                return problems
            if any(m != 1 for m in mask[pos:end]):
                problems.append(f"turn {k}: a sampled token is masked 0 (positions {pos}..{end - 1})")
            if g_lps is not None and any(abs(a - b) > 1e-6 for a, b in zip(lps[pos:end], g_lps)):
                at = pos + next(i for i, (a, b) in enumerate(zip(lps[pos:end], g_lps)) if abs(a - b) > 1e-6)
                problems.append(f"turn {k}: logprob at position {at} is {lps[at]}, the backend gave {g_lps[at - pos]}")
        else:
            end = _run(mask, pos, 1)
            if end == pos and pos < len(ids):
                # a backend always returns at least one token (EOS included) before the env answers
                problems.append(f"turn {k}: no sampled tokens before the env span at {pos} (a sampled token masked 0?)")
        sampled = ids[pos:end]
        pos = end
        last = k == len(turns) - 1
        if pos >= len(ids):
            if not last:
                problems.append(f"the record ends after turn {k} but messages hold {len(turns)} assistant turns")
            break
        # the env's span after it
        env_end = _run(mask, pos, 0)
        got = ids[pos:env_end]
        new = msgs[ai + 1: turns[k + 1] if not last else len(msgs)]
        eos = codec.ends_turn(sampled)
        try:
            options = [codec.delta_ids(msgs[: ai + 1], new, sampled_eos=eos, exact=True)]
            if last:  # a reply appended after the final turn may come without a generation prompt
                options.append(codec.delta_ids(msgs[: ai + 1], new, sampled_eos=eos, add_generation_prompt=False,
                                               exact=True))
        except ChatTemplateError as e:
            problems.append(f"turn {k}: cannot re-render the env reply: {e}")
            break
        if got not in options:
            got_text, want_text = codec.decode(got), codec.decode(options[0])
            if got_text not in {codec.decode(o) for o in options}:
                at = next((i for i, (a, b) in enumerate(zip(got_text, want_text)) if a != b),
                          min(len(got_text), len(want_text)))
                problems.append(
                    f"turn {k}: env span at response positions {pos}..{env_end - 1} does not decode to the template's "
                    f"rendering of the {len(new)} env message(s): got {_show(got_text, at)}, want {_show(want_text, at)}"
                )
            elif strict:
                problems.append(f"turn {k}: env span at {pos}..{env_end - 1} has the right text but other ids "
                                f"(re-tokenized): {got[:12]} vs {options[0][:12]}")
        pos = env_end
    if pos < len(ids) and not problems:
        problems.append(f"{len(ids) - pos} response tokens after the last turn the messages account for")
    if gens is not None and len(gens) > len(turns):
        problems.append(f"{len(gens)} generations but only {len(turns)} assistant messages")
    return problems


def iter_trajectories(path: str | Path) -> Iterable[Trajectory]:
    """Trajectories from a ``.jsonl`` file (one per line), a ``.json`` list, a ``.parquet`` file, or a ``datasets``
    directory written with ``save_to_disk`` (or holding parquet files)."""
    p = Path(path)
    if p.is_dir():
        import datasets

        if (p / "dataset_info.json").exists() or (p / "dataset_dict.json").exists():
            ds = datasets.load_from_disk(str(p))
            if isinstance(ds, datasets.DatasetDict):
                ds = datasets.concatenate_datasets(list(ds.values()))
        else:
            files = sorted(str(f) for f in p.rglob("*.parquet"))
            if not files:
                raise FileNotFoundError(f"{p} holds no saved dataset and no parquet files")
            ds = datasets.load_dataset("parquet", data_files=files, split="train")
        for row in ds:
            yield Trajectory.from_row(row)
    elif p.suffix == ".parquet":
        import datasets

        for row in datasets.load_dataset("parquet", data_files=str(p), split="train"):
            yield Trajectory.from_row(row)
    elif p.suffix == ".json":
        try:
            items = json.loads(p.read_text())
        except ValueError as e:
            raise TrajectoryFileError(f"{p}: not valid JSON ({e})") from None
        if not isinstance(items, list):
            raise TrajectoryFileError(f"{p}: a .json trajectory file holds a list of trajectories, got "
                                      f"{type(items).__name__}")
        for i, d in enumerate(items):
            yield _parse(d, f"{p}: item {i}")
    else:
        with p.open() as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                except ValueError as e:
                    cut = "" if line.endswith("\n") else " (the last line, unterminated: a write cut short?)"
                    raise TrajectoryFileError(f"{p}:{lineno}: not valid JSON ({e}){cut}") from None
                yield _parse(d, f"{p}:{lineno}")


class TrajectoryFileError(ValueError):
    """A saved trajectory that cannot be read back; the message names the file and line (or item) and why."""


def _parse(d: Any, where: str) -> Trajectory:
    """One stored trajectory (a dict, or a ``datasets`` row with JSON-text columns) -> :class:`Trajectory`, or a
    :class:`TrajectoryFileError` saying at ``where`` what is wrong with it."""
    if not isinstance(d, dict):
        raise TrajectoryFileError(f"{where}: a trajectory is a JSON object, got {type(d).__name__}")
    missing = [k for k in ("env_id", "task_id") if k not in d]
    if missing:
        raise TrajectoryFileError(f"{where}: not a trajectory (no {' and no '.join(missing)}; keys: "
                                  f"{', '.join(sorted(d)[:12]) or 'none'})")
    try:
        traj = Trajectory.from_row(d) if isinstance(d.get("messages"), str) else Trajectory.from_dict(d)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise TrajectoryFileError(f"{where}: not a trajectory ({type(e).__name__}: {e})") from None
    for name in ("prompt_ids", "response_ids", "response_mask", "response_logprobs", "response_versions"):
        value = getattr(traj, name, [])  # getattr: a field this Trajectory may not have yet (versions)
        if not isinstance(value, list) or not all(isinstance(x, (int, float)) for x in value):
            raise TrajectoryFileError(f"{where}: {name} must be a list of numbers, got {str(value)[:60]}")
    if not isinstance(traj.messages, list) or not all(isinstance(m, dict) for m in traj.messages):
        raise TrajectoryFileError(f"{where}: messages must be a list of objects")
    if not isinstance(traj.details, dict):
        raise TrajectoryFileError(f"{where}: details must be an object")
    return traj


def check_file(path: str | Path, tokenizer: Any, *, tools: list[dict] | None = None,
               strict: bool = True, limit: int | None = None) -> dict[int, list[str]]:
    """Check every trajectory in ``path`` (see :func:`iter_trajectories`); ``{index: problems}`` for bad ones.

    ``tokenizer``: a tokenizer, a :class:`ChatCodec`, or a model name/path (``resolve_model``). Tools come from
    ``tools`` or, per trajectory, from ``details["tools"]`` (see :func:`tools_of`).
    """
    if isinstance(tokenizer, (str, Path)):
        from envhub.testing.models import load_tokenizer

        tokenizer = load_tokenizer(tokenizer)
    codecs: dict[str, ChatCodec] = {}
    bad: dict[int, list[str]] = {}
    for i, traj in enumerate(iter_trajectories(path)):
        if limit is not None and i >= limit:
            break
        if isinstance(tokenizer, ChatCodec):
            codec = tokenizer
        else:
            t = tools if tools is not None else tools_of(traj)
            key = json.dumps(t)
            codec = codecs.get(key) or codecs.setdefault(key, ChatCodec(tokenizer, tools=t))
        problems = check_trajectory(traj, codec, strict=strict)
        if problems:
            bad[i] = problems
    return bad
