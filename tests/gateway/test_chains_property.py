"""Property tests of the exact-token splice and the chain builders (hypothesis).

Random multi-turn sessions of a tool-using agent, whose replies are echoed back the way real harnesses mangle them
(re-serialised arguments, null or dropped content, content parts, extra fields, a mid-list system message), with
retries, auxiliary calls (a title generator) and context compaction, served by a backend whose ids are not the
canonical tokenization of their text (real tiny-model samples in front, byte-level text, the other EOS). Checked:

* every mask-1 token is a token the backend sampled, in place, with its logprob; every call trained exactly once
  (an abandoned retry never);
* every backend prompt is exactly the trainer-visible context before that call (0 mismatches);
* every call's parent is the ground truth of the script (so chain counts match);

and a mutation test: a gateway that re-tokenizes the model's earlier output when it splices is caught.
"""
from __future__ import annotations

import asyncio
import json

import pytest
from gw_helpers import AUX_SYSTEM, ECHOES, TOOLS, NonCanonicalScripted, Recording, agent_policy, echo, invariant_problems
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envhub.backends.base import SamplingParams
from envhub.gateway import ChatRequest, Gateway, build

SYSTEM = {"role": "system", "content": "You are a coding agent."}
MID_SYSTEM = {"role": "system", "content": "Reminder: be brief."}
OPS = ("turn", "turn", "turn", "retry", "aux", "compact")


def play(tokenizer, samples, ops, echoes, mid_system, gateway_cls=Gateway):
    """Drive one session through ``ops``; returns (gateway, session, recorded backend calls, ground-truth parents,
    call ids of abandoned retries)."""
    backend = Recording(NonCanonicalScripted(agent_policy, tokenizer, samples))
    gw = gateway_cls(backend, tokenizer, drift_every=1)
    s = gw.start_session("prop")
    expected: list[int | None] = []   # per call: the index of its parent call
    results = []

    def send(msgs, tools, parent):
        req = ChatRequest("chat", json.loads(json.dumps(msgs)), tools, SamplingParams(max_tokens=400), True)
        results.append(asyncio.run(gw.complete(s, req)))
        expected.append(parent)
        return len(results) - 1

    def opening(user):
        return [SYSTEM] + ([MID_SYSTEM] if mid_system else []) + [{"role": "user", "content": user}]

    history = opening("List the files.")
    main = send(history, TOOLS, None)
    main_request = list(history)
    abandoned = []
    for n, op in enumerate(ops):
        how = echoes[n % len(echoes)]
        reply = results[main].call.reply
        if op == "turn":
            history = main_request + [echo(reply, how)]
            history += [{"role": "tool", "tool_call_id": c["id"], "content": f"out {n}\n"}
                        for c in reply.get("tool_calls") or []] or [{"role": "user", "content": "Go on."}]
            parent = main
            main = send(history, TOOLS, parent)
            main_request = list(history)
        elif op == "retry":  # the harness timed out and sent the same request again
            abandoned.append(results[main].call.call_id)
            main = send(main_request, TOOLS, expected[main])
        elif op == "aux":
            send([{"role": "system", "content": AUX_SYSTEM}, {"role": "user", "content": f"Title for task {n}"}],
                 None, None)
        elif op == "compact":  # Codex: a tool-less summary request over the history, then a rewritten history
            summary = send(main_request + [echo(reply, how), {"role": "user", "content": "CONTEXT CHECKPOINT "
                                                              "COMPACTION: summarise."}], None, None)
            # numbered: the scripted backend cycles through 8 samples, so after enough compactions two summaries
            # can be byte-identical, and an identical request re-sent *is* a retry to the gateway (nothing else
            # tells them apart); a real model's summaries differ
            history = opening(f"Another model started this task and produced summary {n}: "
                              + results[summary].text)
            main = send(history, TOOLS, None)
            main_request = list(history)
    return gw, s, backend.calls, expected, results, set(abandoned)


def check(tokenizer, samples, ops, echoes, mid_system, gateway_cls=Gateway) -> list[str]:
    gw, s, recorded, expected, results, abandoned = play(tokenizer, samples, ops, echoes, mid_system, gateway_cls)
    gw.end_session(s)
    problems = []
    index = {r.call.call_id: i for i, r in enumerate(results)}
    got = [index.get(r.call.parent) if r.call.parent else None for r in results]
    if got != expected:
        problems.append(f"parents {got} != ground truth {expected} (reasons: "
                        f"{[r.call.break_reason for r in results]})")
    try:
        trajs = build(s, "prefix_merging")
    except AssertionError as e:  # the builder's own splice invariant
        return problems + [f"builder: {e}"]
    roots = sum(p is None for p in expected)
    if len({t.details['calls'][0] for t in trajs}) != roots:
        problems.append(f"{len({t.details['calls'][0] for t in trajs})} chain roots, ground truth {roots}")
    problems += invariant_problems(s, trajs, recorded, untrained=abandoned)
    problems += invariant_problems(s, build(s, "per_request"), recorded, untrained=set())
    return problems


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=7),
       echoes=st.lists(st.sampled_from(ECHOES), min_size=1, max_size=7), mid_system=st.booleans())
def test_random_sessions_keep_exact_tokens_and_true_chains(tiny_tokenizer, tiny_samples, ops, echoes, mid_system):
    assert check(tiny_tokenizer, tiny_samples, ops, echoes, mid_system) == []


def test_the_backend_ids_are_really_non_canonical(tiny_tokenizer, tiny_samples):
    """The property test is only as good as its ids: they must differ from what re-tokenizing their text gives."""
    gw, s, recorded, *_ = play(tiny_tokenizer, tiny_samples, ["turn", "turn"], ["verbatim"], False)
    for _, gen in recorded:
        ids = list(gen.token_ids)
        assert tiny_tokenizer.encode(tiny_tokenizer.decode(ids), add_special_tokens=False) != ids


def test_a_splicing_gateway_that_retokenizes_is_caught(tiny_tokenizer, tiny_samples):
    """Mutation: re-tokenize the model's earlier output when splicing (what a re-rendering proxy does)."""

    class Retokenizing(Gateway):
        @staticmethod
        def splice(codec, parent, new):
            history = parent.context + [parent.reply]
            again = codec.encode(codec.decode(parent.sampled_ids))
            return parent.prompt_ids + again + codec.delta_ids(history, new, sampled_eos=codec.ends_turn(again))

    ops, echoes = ["turn", "turn", "aux", "turn"], ["compact_args"]
    assert check(tiny_tokenizer, tiny_samples, ops, echoes, True) == []
    assert check(tiny_tokenizer, tiny_samples, ops, echoes, True, gateway_cls=Retokenizing) != []


@pytest.mark.parametrize("how", ECHOES)
def test_every_echo_quirk_extends_the_chain(tiny_tokenizer, tiny_samples, how):
    gw, s, recorded, expected, results, _ = play(tiny_tokenizer, tiny_samples, ["turn", "turn"], [how], True)
    assert [r.call.parent is not None for r in results] == [False, True, True], [r.call.break_reason for r in results]
    assert gw.stats["drift_checks"] == 2 and gw.stats["drift"] == 2  # non-canonical ids: a re-render would drift
