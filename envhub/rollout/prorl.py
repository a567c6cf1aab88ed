"""ProRL Agent's reply fields, cut from envhub's exact tokens: what NeMo-RL's and verl's ProRL clients read.

envhub's trajectory keeps its tokens as two flat lists, ``prompt_ids`` and ``response_ids`` (with
``response_mask`` and ``response_logprobs``). ProRL Agent's server (``openhands/nvidia/utils.py``,
``process_messages_from_agent_state``) sends them *per message* instead, and its trainer-side clients rebuild the
flat lists by concatenating ``messages[i]["token_ids"]``:

* NeMo-RL's ``ProRLEnvironment.Results2BatchedDataDict`` splits the messages at the **first** assistant message:
  ``prompt_ids = cat(token_ids before it)``, ``response_ids = cat(token_ids from it on)``, and turns each
  assistant message's ``logprobs`` into ``generation_logprobs``.
* verl's ProRL/OpenHands converter drops messages after the **last** assistant message (and asserts the last one
  is the assistant's), marks every assistant message's tokens as loss tokens (``loss_mask``), and reads
  ``logprobs`` (zeros where a message has none).

So :func:`prorl_messages` cuts envhub's lists along the turns the executor recorded
(``Episode.turns``: which ``response_ids`` each model call sampled) and guarantees, for every reply that has an
assistant message::

    concat(m["token_ids"] for m in messages) == prompt_ids + response_ids          (exact, no re-tokenization)
    concat over assistant messages                == the ids where response_mask == 1
    concat(m["logprobs"] or zeros)               == [0.0] * len(prompt_ids) + response_logprobs

* The prompt's ids all ride on the **first** message (the others carry ``[]``): whatever the prompt holds (a
  system message, few-shot assistant turns), a client splitting at the first assistant message gets exactly
  ``prompt_ids`` as its prompt.
* Each assistant message carries ``token_ids`` (what the model sampled), ``logprobs`` (their logprobs) and
  ``input_ids`` (the context it was sampled from: ``prompt_ids + response_ids[:start]``), as ProRL's does.
* The env's tokens between two model calls (the tool/user reply, rendered by the chat template) ride on the first
  message after the assistant's; ``logprobs`` and ``input_ids`` are ``None`` on non-assistant messages, as ProRL's.
  Should an env reply produce template tokens but no message, a ``{"role": "user", "content": ""}`` message marked
  ``"envhub_template_only": true`` carries them, so no token is lost or mis-masked.
* Messages after the last assistant message are cut (ProRL trims them; verl asserts it). They never carry tokens
  (envhub's executor adds the env's reply to ``response_ids`` only when the model is called again), and they stay
  in the reply as ``trailing_messages`` so envhub's own client rebuilds the full text log. A trajectory with no
  assistant message (failed before the first model call) has ``messages == []``, as ProRL's failed jobs do: ProRL's
  clients then retry or pad from a sibling trajectory.
"""
from __future__ import annotations

import json
import re
import secrets
from typing import Any

#: keys the ProRL reply adds to each message; envhub's client strips them to get the plain text log back
TOKEN_KEYS = ("token_ids", "input_ids", "logprobs", "versions", "envhub_template_only")


def prorl_messages(messages: list[dict[str, Any]], turns: list[tuple[int, int, int]], prompt_ids: list[int],
                   response_ids: list[int], response_logprobs: list[float],
                   response_versions: list[int] | None = None) -> tuple[list[dict], list[dict]]:
    """``(messages with ProRL's token fields, trimmed to the last assistant message; the trailing messages)``.

    With ``response_versions``, each assistant message also carries ``versions``: the weight version that sampled
    each of its ``token_ids`` (envhub's addition; ProRL's clients ignore keys they do not know).

    ``turns``: one ``(index in messages, start, end)`` per model call, ``response_ids[start:end]`` being what it
    sampled (``Episode.turns``). Raises ``ValueError`` when the turns do not tile the ids (a bug, not bad input).
    """
    if not turns:
        return [], [dict(m) for m in messages]
    first_turn, last_index = turns[0][0], turns[-1][0]
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages[:first_turn]):  # the prompt: all its ids on its first message
        out.append({**m, "token_ids": list(prompt_ids) if i == 0 else [], "input_ids": None, "logprobs": None})
    if first_turn == 0:  # no prompt message at all (cannot happen with a chat template, but keep ids exact)
        out.append({"role": "system", "content": "", "token_ids": list(prompt_ids), "input_ids": None,
                    "logprobs": None, "envhub_template_only": True})
    for k, (index, start, end) in enumerate(turns):
        if k and start < turns[k - 1][2]:
            raise ValueError(f"turn {k} starts at {start}, inside the previous turn")
        out.append({**messages[index], "token_ids": response_ids[start:end], "input_ids": prompt_ids + response_ids[:start],
                    "logprobs": [float(x) for x in response_logprobs[start:end]]})
        if response_versions:
            out[-1]["versions"] = [int(v) for v in response_versions[start:end]]
        nxt = turns[k + 1] if k + 1 < len(turns) else None
        env_ids = response_ids[end:nxt[1]] if nxt else response_ids[end:]
        env_msgs = messages[index + 1:nxt[0]] if nxt else []
        if nxt is None and env_ids:
            raise ValueError(f"{len(env_ids)} response ids after the last model call")
        for j, m in enumerate(env_msgs):
            out.append({**m, "token_ids": env_ids if j == 0 else [], "input_ids": None, "logprobs": None})
        if env_ids and not env_msgs:
            out.append({"role": "user", "content": "", "token_ids": env_ids, "input_ids": None, "logprobs": None,
                        "envhub_template_only": True})
    return out, [dict(m) for m in messages[last_index + 1:]]


def text_log(messages: list[dict[str, Any]], trailing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plain message log back from a ProRL-shaped reply (what envhub's ``Trajectory.messages`` holds)."""
    return [{k: v for k, v in m.items() if k not in TOKEN_KEYS} for m in messages
            if not m.get("envhub_template_only")] + list(trailing)


def prorl_fields(traj: Any, turns: list[tuple[int, int, int]]) -> dict[str, Any]:
    """The fields a ProRL reply has beyond envhub's: per-message tokens and ProRL's outcome flags.

    =================  ====================================================================================
    ``score``          the reward (ProRL's clients train on ``score``: NeMo-RL's ``total_reward``)
    ``end_properly``   the episode ended on its own (``finish_reason == "done"``); NeMo-RL's ``truncated`` is
                       ``not end_properly``, so a length/turn cut or a failure is truncated
    ``finish``         the agent finished the task itself (ProRL: its last action was ``finish``): here, the env
                       terminated the episode (``finish_reason == "done"``)
    ``success``        the rollout ran to its end without a failure (ProRL's run result), same test
    =================  ====================================================================================
    """
    if not traj.ok:
        # ProRL's clients train on every assistant message's tokens: a failed episode (error, timeout, cancelled)
        # gets none, as ProRL's own failed jobs (its text log rides in ``trailing_messages``; see Trajectory.loss_mask)
        messages, trailing = [], [dict(m) for m in traj.messages]
    else:
        messages, trailing = prorl_messages(traj.messages, turns, traj.prompt_ids, traj.response_ids,
                                            traj.response_logprobs, traj.response_versions)
    done = traj.finish_reason == "done"
    return {"messages": messages, "trailing_messages": trailing, "score": float(traj.reward),
            "end_properly": done, "finish": done, "success": done}


def encode_with_shared_contexts(result: dict[str, Any], dumps: Any) -> str:
    """``dumps(result)``, with each assistant message's ``input_ids`` written as a prefix of one encoding of
    ``prompt_ids + response_ids``.

    ``input_ids`` repeat the growing context at every turn, so a long multi-turn reply holds turns x context ids;
    encoding each list again costs many times the flat reply's time on a long trajectory
    (``benchmarks/prorl_reply.py`` prints the ratio). Each is a prefix of the context, so its JSON text is a prefix
    of the context's JSON text (cut at a comma): the context is encoded once and the prefixes are sliced from it. A
    message whose ``input_ids`` is not such a prefix is encoded as it is. The placeholders carry a random nonce, so
    no content an env or a model wrote can be taken for one. With fewer than two ``input_ids`` it is plain
    ``dumps``.
    """
    messages = result.get("messages")
    context = (result.get("prompt_ids") or []) + (result.get("response_ids") or [])
    if not messages or sum(isinstance(m.get("input_ids"), list) and bool(m["input_ids"]) for m in messages) < 2:
        return dumps(result)  # one context or none: nothing is shared, the plain encoding is cheaper
    nonce = secrets.token_hex(8)
    shared, lengths = [], set()
    for m in messages:
        ids = m.get("input_ids")
        if isinstance(ids, list) and ids and len(ids) <= len(context) and ids == context[:len(ids)]:
            shared.append({**m, "input_ids": f"\x00{nonce}:{len(ids)}\x00"})
            lengths.add(len(ids))
        else:
            shared.append(m)
    text = dumps({**result, "messages": shared})
    ctx = json.dumps(context, separators=(",", ":"))
    commas = [mt.start() for mt in re.finditer(",", ctx)] if lengths else []
    cut = {n: (ctx[:commas[n - 1]] + "]" if n < len(context) else ctx) for n in lengths}
    return re.sub('"\\\\u0000' + nonce + r':(\d+)\\u0000"', lambda mt: cut[int(mt.group(1))], text)
