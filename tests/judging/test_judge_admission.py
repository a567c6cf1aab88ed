"""Admission of judged envs: an honest judge is admitted with its calibration reported; a judge lenient in each way
is refused by the check named; and removing the defence (the probe set, the guards, the uncached re-grade, the
threshold) lets the same judge through, so each check is shown to be what refuses it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import envhub.admission as admission
from envhub.admission import admit
from envhub.grading import Budget
from envhub.judging import JudgeVerifier

sys.path.insert(0, str(Path(__file__).parent))
from judged_env import judge_policy, judged_spec  # noqa: E402

pytestmark = pytest.mark.timeout(300)
BUDGET = Budget(regrades=8, min_total=24, seconds=5)
ATTACKS = {  # the weakness -> the checks that must refuse it (and the verifier options that expose it)
    "instructions": ({"probe:judge-inject-plain", "probe:judge-inject-code-block", "probe:judge-inject-markup",
                      "probe:judge-inject-other-language"}, {}),
    "length": ({"probe:judge-verbosity-padding"}, {}),
    "surface": ({"probe:judge-reference-surface", "probe:judge-golden-contradiction"}, {}),
    "claimed-score": ({"probe:judge-claimed-score"}, {"guards": False}),
    "rubric": ({"probe:judge-rubric-echo"}, {"guards": False}),
}


def failed(report) -> set[str]:
    return {c.name for t in report.tasks for c in t.checks if not c.ok} | {c.name for c in report.checks if not c.ok}


def test_an_honest_judge_is_admitted_with_its_calibration_and_cost(tiny_tokenizer):
    report = admit(judged_spec(tiny_tokenizer), budget=BUDGET)
    assert report.fit, report.unfit_reasons
    d = report.to_dict()
    cal = next(c for c in d["checks"] if c["name"] == "judge-calibration")
    assert "agreement 0.833" in cal["message"] and "kappa 0.667" in cal["message"]
    names = {c["name"] for t in d["tasks"] for c in t["checks"]}
    assert {f"probe:judge-{n}" for n in ("inject-plain", "claimed-score", "rubric-echo", "verbosity-padding",
                                         "reference-surface", "golden-contradiction")} <= names
    cost = d["judge_cost"]
    assert cost["judge_model"] == "scripted-honest" and cost["calls"] > 0 and cost["prompt_tokens"] > 0


@pytest.mark.parametrize("weakness", sorted(ATTACKS))
def test_a_lenient_judge_is_refused_by_its_attack_probe(tiny_tokenizer, weakness):
    expected, kw = ATTACKS[weakness]
    report = admit(judged_spec(tiny_tokenizer, weakness, **kw), budget=BUDGET)
    assert not report.fit
    assert expected <= failed(report), (expected, failed(report))


@pytest.mark.parametrize("weakness", sorted(ATTACKS))
def test_without_the_judge_probes_the_same_judge_is_admitted(tiny_tokenizer, weakness, monkeypatch):
    """Break it on purpose: the attack probes are what refuse each lenient judge."""
    monkeypatch.setattr(admission, "judge_probes", lambda *a, **k: [])
    _, kw = ATTACKS[weakness]
    report = admit(judged_spec(tiny_tokenizer, weakness, **kw), budget=BUDGET)
    if weakness == "surface":  # a keyword-matching judge also passes the built-in trailing-text probe
        assert failed(report) == {"probe:trailing-text"}
    else:
        assert report.fit, report.unfit_reasons


@pytest.mark.parametrize("weakness", ["claimed-score", "rubric"])
def test_the_guards_stop_a_judge_that_trusts_a_claim_or_the_rubric(tiny_tokenizer, weakness):
    report = admit(judged_spec(tiny_tokenizer, weakness), budget=BUDGET)
    assert report.fit, report.unfit_reasons


class ChangesItsMind:
    """Honest the first time it sees a prompt, then fails correct answers: a judge that drifts across re-grades."""

    def __init__(self):
        self.seen: set[str] = set()
        self.honest = judge_policy()

    def __call__(self, task, messages):
        key = messages[-1]["content"]
        verdict = self.honest(task, messages)
        if key in self.seen:
            return verdict.replace("SCORE: 10", "SCORE: 0")
        self.seen.add(key)
        return verdict


def test_a_drifting_judge_is_caught_by_uncached_regrading(tiny_tokenizer, monkeypatch):
    report = admit(judged_spec(tiny_tokenizer, policy=ChangesItsMind()), budget=BUDGET)
    assert not report.fit and "regrade" in failed(report)
    # break it on purpose: re-grading through the cache agrees with itself and the drift goes unseen
    monkeypatch.setattr(JudgeVerifier, "uncached", lambda self: self)
    assert admit(judged_spec(tiny_tokenizer, policy=ChangesItsMind()), budget=BUDGET).fit


def test_calibration_below_the_declared_threshold_is_unfit(tiny_tokenizer):
    report = admit(judged_spec(tiny_tokenizer, min_kappa=0.7), budget=BUDGET)  # the honest judge's kappa: 0.667
    assert not report.fit and failed(report) == {"judge-calibration"}
    assert "below the declared threshold" in report.unfit_reasons[0]


def test_a_judge_without_labelled_examples_is_unfit(tiny_tokenizer):
    report = admit(judged_spec(tiny_tokenizer, calibration=[]), budget=BUDGET)
    assert not report.fit and failed(report) == {"judge-calibration"}


def test_a_pairwise_judge_is_asked_in_both_orders(tiny_tokenizer):
    honest = admit(judged_spec(tiny_tokenizer, pairwise=True), budget=BUDGET)
    assert honest.fit, honest.unfit_reasons
    assert next(c for c in honest.checks if c.name == "judge-position-bias").ok
    biased = admit(judged_spec(tiny_tokenizer, "position", pairwise=True), budget=BUDGET)
    assert not biased.fit and {"judge-position-bias", "golden"} <= failed(biased)
    # both orders were asked: the always-A judge gave A twice, so the answer won once and lost once
    score = biased_verifier_score(tiny_tokenizer)
    assert score.details["winners"] == ["A", "A"] and score.details["position_consistent"] is False
    assert not score.passed and score.reward == 0.5


def biased_verifier_score(tok):
    spec = judged_spec(tok, "position", pairwise=True)
    return spec.verifier.verify(spec.load_tasks("test")[0], {"answer": "Paris is the capital of France."})
