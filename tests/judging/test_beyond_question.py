"""The choice gate's second pass (:mod:`envhub.judging.choice`, ``beyond_question`` and ``answer_values``): the judge
must find the reference in what the answer says *beyond the question's own words*, and an answer that states
another number is offered that number as an option. Scripted judges played through the real tiny tokenizer.

* **Stated, not evoked**: a judge that completes fragments (it picks the fact it knows whenever the TEXT carries the
  question's cue words, as Qwen2.5-Coder-1.5B did with "Pure water boils at" and "is the planet closest to the
  Sun.") passes a fragment through the first pass; with the second, a fragment that only restates the question fails
  unjudged, and one that adds filler fails at the judge, which no longer sees the cue. Break-its: without the pass,
  or with a pass that reads the whole answer, the fragment passes.
* **One value**: "8, 9 legs" states the reference's 8; offered "9 legs." too it states two options, and its right
  pick is "none". Break-it: without ``answer_values`` it passes.
* **What beats it** (kept, so a change that closes it shows): the question paraphrased ("French seat of
  government") evokes without its words; a second value written as a word ("nine") is no number.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import pytest

from envhub.judging import JudgeCache, JudgeModel, JudgeVerifier
from envhub.judging import verifier as verifier_mod
from envhub.judging.choice import (MAX_VALUE_FOILS, NONE_OPTION, ChoiceGate, choice_grammar, content_beyond, stem,
                                   value_foils)
from envhub.judging.grammar import score_grammar

sys.path.insert(0, str(Path(__file__).parent))
from judged_env import Recording  # noqa: E402

pytestmark = pytest.mark.timeout(120)
RUBRIC = "Correct if and only if the answer states the same fact as the reference answer."
FR = {"task_id": "fr", "question": "What is the capital of France?", "reference": "Paris", "foils": ["Lyon"],
      "golden": "Paris is the capital of France."}
SPIDER = {"task_id": "spider", "question": "How many legs does a spider have?", "reference": "8 legs.",
          "foils": ["6 legs."], "golden": "A spider has 8 legs."}
FENCE = re.compile(r"(ANSWER-[0-9A-F]{12})\n(.*?)\n\1", re.S)
OPTION = re.compile(r"^([A-J])\. (.*)$", re.M)
# what a completing judge "knows": cue words in the TEXT -> the fact it fills in (no question needed)
CUES = {frozenset({"capital", "france"}): "Paris", frozenset({"french", "government"}): "Paris"}


def words(s: str) -> set[str]:
    return {w.lower() for w in re.findall(r"\w+", s)}


def chooser(completes: bool = False, malformed_on: str | None = None):
    """A scripted chooser. It reads: the one fact option all of whose words the TEXT has (several or none: the last
    option). ``completes``: if the TEXT carries a cue it knows, it picks that fact instead (a fragment completer).
    ``malformed_on``: replies prose for that TEXT."""

    def choose(messages: list[dict[str, Any]]) -> str:
        user = messages[-1]["content"]
        text = FENCE.search(user).group(2)
        if text == malformed_on:
            return "It says Paris, I think."
        options = OPTION.findall(user)
        facts = [(letter, o) for letter, o in options if o != NONE_OPTION]
        if completes:
            for cue, fact in CUES.items():
                if cue <= words(text) and (hit := [letter for letter, o in facts if o == fact]):
                    return f"CHOICE: {hit[0]}"
        stated = [letter for letter, o in facts if words(o) <= words(text)]
        return f"CHOICE: {stated[0] if len(stated) == 1 else options[-1][0]}"

    return choose


def lenient(task: Any, messages: list[dict[str, Any]]) -> str:
    return "Looks right.\nSCORE: 10"


def verifier(tok: Any, choose: Any, *, gate: ChoiceGate | None = None, cache: JudgeCache | None = None,
             decoding: dict[str, Any] | None = None) -> JudgeVerifier:
    def play(task: Any, messages: list[dict[str, Any]]) -> str:
        return choose(messages) if "OPTIONS:" in messages[-1]["content"] else lenient(task, messages)

    gate = gate if gate is not None else ChoiceGate(beyond_question=True, answer_values=True)
    judge = JudgeModel(Recording(play), tokenizer=tok, name="scripted-beyond", decoding=decoding)
    return JudgeVerifier(judge, RUBRIC, choice=gate, cache=cache)


def grade(v: JudgeVerifier, answer: str, task: dict[str, Any] = FR):
    try:
        return v.verify(task, {"answer": answer})
    finally:
        v.close()


# ---- what the second pass reads ------------------------------------------------------------------------------
@pytest.mark.parametrize("answer, question, keep, want", [
    ("Paris is the capital of France.", FR["question"], ["Paris", "Lyon"], "Paris."),
    ("The capital of France is", FR["question"], ["Paris", "Lyon"], ""),
    ("Pure water boiling at", "At what temperature does pure water boil?", ["100 degrees."], ""),
    ("Paris is.", "Is Paris or Lyon the capital?", ["Paris", "Lyon"], "Paris."),  # an option the question names
    ("A spider has 8, 9 legs.", SPIDER["question"], ["8 legs.", "6 legs."], "has 8, 9 legs."),
])
def test_content_beyond_the_question(answer, question, keep, want):
    assert content_beyond(answer, question, keep) == want


def test_stem_folds_inflections_but_not_short_words():
    assert [stem(w) for w in ("Boils", "boiling", "boiled", "planets", "is", "has", "red")] == \
        ["boil", "boil", "boil", "planet", "is", "has", "red"]


@pytest.mark.parametrize("content, reference, want", [
    ("has 8, 9 legs.", "8 legs.", ["9 legs."]),
    ("8 legs, that is 8.0 legs", "8 legs.", []),  # the same number, written otherwise
    ("Paris, 75001", "Paris", []),  # no number in the reference: nothing to replace
    ("between 3 and 5", "3 to 4", []),  # several: which one another number replaces is unknown
    ("1 2 3 4 5 6", "8 legs.", [f"{n} legs." for n in (1, 2, 3)]),  # at most MAX_VALUE_FOILS
])
def test_value_foils(content, reference, want):
    assert value_foils(content, reference) == want and len(want) <= MAX_VALUE_FOILS


def test_answer_values_needs_the_second_pass():
    with pytest.raises(ValueError, match="beyond_question"):
        ChoiceGate(answer_values=True)


# ---- honest judging through both passes ----------------------------------------------------------------------
@pytest.mark.parametrize("task", [FR, SPIDER])
def test_an_honest_reader_passes_the_golden_through_both_passes(tiny_tokenizer, task):
    v = verifier(tiny_tokenizer, chooser())
    s = grade(v, task["golden"], task)
    assert s.passed and not s.crashed, s.details
    assert s.details["choice_picks"] == s.details["beyond_picks"] == ["reference", "reference"]
    assert s.details["beyond_foils"] == [] and v.judge.stats.calls == 5  # 2 choices, the score, 2 choices


# ---- stated, not evoked --------------------------------------------------------------------------------------
def test_a_fragment_that_restates_the_question_fails_unjudged(tiny_tokenizer):
    v = verifier(tiny_tokenizer, chooser(completes=True))
    s = grade(v, "The capital of France is")
    assert not s.passed and not s.crashed and s.details["beyond_content"] == ""
    assert "nothing beyond the question" in s.details["reason"] and v.judge.stats.calls == 0


def test_break_it_without_the_second_pass_the_completer_passes_the_fragment(tiny_tokenizer):
    s = grade(verifier(tiny_tokenizer, chooser(completes=True), gate=ChoiceGate()), "The capital of France is")
    assert s.passed and s.details["choice_picks"] == ["reference", "reference"]


FILLED = "The capital of France is, roughly, the obvious one."


def test_a_fragment_with_filler_fails_at_the_judge_without_the_cue(tiny_tokenizer):
    v = verifier(tiny_tokenizer, chooser(completes=True))
    s = grade(v, FILLED)
    assert not s.passed and not s.crashed, s.details
    assert s.details["choice_picks"] == ["reference", "reference"]  # the first pass was completed
    assert s.details["beyond_content"] == ", roughly, obvious one." and s.details["beyond_picks"] == ["none"]


def test_break_it_a_second_pass_reading_the_whole_answer_is_completed_too(tiny_tokenizer, monkeypatch):
    monkeypatch.setattr(verifier_mod, "content_beyond", lambda answer, question, keep: answer)
    s = grade(verifier(tiny_tokenizer, chooser(completes=True)), FILLED)
    assert s.passed and s.details["beyond_picks"] == ["reference", "reference"]


# ---- one value -----------------------------------------------------------------------------------------------
def test_a_second_value_is_offered_and_the_answer_states_several(tiny_tokenizer):
    v = verifier(tiny_tokenizer, chooser())
    s = grade(v, "A spider has 8, 9 legs.", SPIDER)
    assert not s.passed and not s.crashed
    assert s.details["choice_picks"] == ["reference", "reference"]  # the task's options alone: it states 8
    assert s.details["beyond_foils"] == ["9 legs."] and s.details["beyond_picks"] == ["none"]


def test_break_it_without_answer_values_the_second_value_passes(tiny_tokenizer):
    gate = ChoiceGate(beyond_question=True)
    s = grade(verifier(tiny_tokenizer, chooser(), gate=gate), "A spider has 8, 9 legs.", SPIDER)
    assert s.passed and s.details["beyond_foils"] == []


def test_each_call_of_the_second_pass_has_its_options_grammar(tiny_tokenizer):
    v = verifier(tiny_tokenizer, chooser(), decoding={"grammar": score_grammar(), "cache_prompt": False})
    backend = v.judge.backend
    s = grade(v, "A spider has 8 legs, or 9.", SPIDER)
    assert not s.passed and s.details["beyond_foils"] == ["9 legs."]
    grammars = [e["grammar"] for e in backend.extras]
    assert grammars[:3] == [choice_grammar(3)] * 2 + [score_grammar()] and grammars[3] == choice_grammar(4)


# ---- what beats it (known limits, kept as tests) -------------------------------------------------------------
def test_known_limit_a_paraphrased_question_still_evokes(tiny_tokenizer):
    s = grade(verifier(tiny_tokenizer, chooser(completes=True)), "It is the French seat of government.")
    assert s.passed and s.details["beyond_picks"] == ["reference", "reference"]


def test_known_limit_a_second_value_in_words_is_no_number(tiny_tokenizer):
    s = grade(verifier(tiny_tokenizer, chooser()), "A spider has 8 or nine legs.", SPIDER)
    assert s.passed and s.details["beyond_foils"] == []


# ---- failures, and the cache ---------------------------------------------------------------------------------
def test_a_malformed_reply_in_the_second_pass_is_a_crash_never_a_pass(tiny_tokenizer):
    s = grade(verifier(tiny_tokenizer, chooser(malformed_on="Paris.")), FR["golden"])
    assert s.crashed and not s.passed and s.details["judge_failure"] == "unparsable"
    assert s.details["choice_picks"] == ["reference", "reference"] and s.details["parsed_score"] == 10


def test_the_first_pass_keeps_its_verdicts_when_the_second_is_added(tiny_tokenizer):
    cache = JudgeCache()
    grade(verifier(tiny_tokenizer, chooser(), gate=ChoiceGate(), cache=cache), FR["golden"])
    v = verifier(tiny_tokenizer, chooser(), cache=cache)
    try:
        s = v.verify(FR, {"answer": FR["golden"]})
        again = v.verify(FR, {"answer": FR["golden"]})
        fresh = v.uncached().verify(FR, {"answer": FR["golden"]})
    finally:
        v.close()
    assert s.passed and not s.details["cached"] and v.judge.stats.cache_hits >= 1
    assert again.passed and again.details["cached"]
    assert fresh.passed and not fresh.details["cached"]
    assert v.judge.stats.calls == 2 + 5  # the second pass once, then the uncached view's five; `again` paid nothing
