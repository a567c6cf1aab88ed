"""Admission refuses lenient verifiers by itself, naming the check, and still admits the shipped envs' verifiers."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

import envhub
from envhub.admission import admit
from envhub.grading import Budget
from envhub.verifier import Score

sys.path.insert(0, str(Path(__file__).parent))
from lenient_envs import EXPECTED, FIXTURES, make_hangs, make_no_hack_probes  # noqa: E402


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_lenient_verifier_is_refused_with_the_right_check(name):
    strict = name == "no-hack-probes"
    report = admit(FIXTURES[name](), strict=strict)
    assert not report.fit, f"{name} was admitted FIT"
    named = " | ".join(report.unfit_reasons)
    assert any(r.startswith(check) for check in EXPECTED[name] for r in report.unfit_reasons), named


def test_no_hack_probes_is_a_warning_without_strict():
    report = admit(make_no_hack_probes())
    assert report.fit and report.warnings and report.warnings[0].startswith("hack-probes-declared")
    data = json.loads(report.to_json())
    assert data["checks"][0]["status"] == "warn" and data["warnings"]


def test_unicode_crash_names_the_exception():
    report = admit(FIXTURES["unicode-minus-crash"]())
    reason = next(r for r in report.unfit_reasons if r.startswith("probe:unicode-minus"))
    assert "verifier crashed: ValueError: invalid literal for int()" in reason


def test_a_sound_verifier_whose_failure_text_reads_like_a_crash_is_fit():
    """A crash is the ``Score.crashed`` flag, not its text: a sound verifier that words its wrong-answer verdicts
    "verifier crashed: ..." (or echoes an agent's answer that does) is admitted."""
    from lenient_envs import text_spec

    from envhub.scaffold_template import text_env as T

    def verify(task, a):
        s = T.verify(task, a)
        return s if s.passed else Score(0.0, False, {"error": f"verifier crashed: fake ({s.details.get('reason')})"})

    report = admit(text_spec("sound-crash-text", verify), n=2)
    assert report.fit and report.passed == 2, report.unfit_reasons


def test_a_verifier_raising_on_wrong_answers_is_unfit_whatever_its_message():
    from lenient_envs import text_spec

    from envhub.scaffold_template import text_env as T

    def verify(task, a):
        s = T.verify(task, a)
        if not s.passed:
            raise LookupError("reward 0.0")  # nothing in it says "crash"
        return s

    report = admit(text_spec("raises-on-wrong", verify), n=2)
    assert not report.fit
    assert any(r.startswith("noop") and "verifier crashed: LookupError: reward 0.0" in r
               for r in report.unfit_reasons), report.unfit_reasons


def test_a_hanging_verifier_is_unfit_not_a_hung_admission():
    t0 = time.perf_counter()
    report = admit(make_hangs(), budget=Budget(grade_timeout_s=1.0))
    assert time.perf_counter() - t0 < 30
    assert not report.fit
    reason = next(r for r in report.unfit_reasons if r.startswith("probe:whitespace-answer"))
    assert "verifier hung" in reason and "within 1s" in reason


def test_golden_that_raises_quarantines_its_task_only():
    spec = FIXTURES["no-hack-probes"]()  # a sound verifier
    sound_golden = spec.golden

    def golden(task, messages):
        if task["task_id"] == "sort-003":
            raise RuntimeError("golden bug")
        return sound_golden(task, messages)

    spec.golden = golden
    report = admit(spec)
    assert report.fit, report.unfit_reasons
    assert list(report.quarantined) == ["sort-003"] and "golden bug" in report.quarantined["sort-003"][0]
    checks = {c.name: c.status for t in report.tasks if t.task_id == "sort-003" for c in t.checks}
    assert checks["deterministic"] == "skip" and checks["probe:trailing-text"] == "skip"


def test_report_lists_every_check_per_task_with_its_status():
    data = json.loads(admit(make_no_hack_probes(), n=2).to_json())
    for t in data["tasks"]:
        names = {c["name"]: c["status"] for c in t["checks"]}
        assert {"golden", "noop", "deterministic", "regrade", "probe:trailing-text", "probe:whitespace-answer",
                "probe:unicode-minus", "probe:reward-claim-json", "probe:reward-claim-tools"} <= set(names)
        assert set(names.values()) <= {"pass", "skip"}
    assert data["regrade"]["calls"] >= 2000 and data["regrade"]["must_fail_calls"] > 1000


@pytest.mark.parametrize("kind", ["text", "tool"])
def test_the_scaffold_templates_are_fit(kind):
    from lenient_envs import text_spec, tool_spec
    from envhub.scaffold_template import text_env, tool_env

    spec = text_spec("sound-text", text_env.verify) if kind == "text" else tool_spec("sound-tool", tool_env.verify)
    report = admit(spec)
    assert report.fit and report.passed == 8, report.unfit_reasons


@pytest.mark.parametrize("env_id", ["countdown", "guess-number"])
def test_fast_shipped_envs_stay_fit(env_id):
    report = admit(envhub.get_spec(env_id))
    assert report.fit and report.passed == len(report.tasks), report.unfit_reasons
    statuses = {c.status for t in report.tasks for c in t.checks if c.name.startswith("probe:")}
    assert "pass" in statuses


# swe-gym is not repeated here: tests/environments/test_swe_gym.py::test_admission_admits_every_instance admits
# every one of its instances with the same admission (a superset of these 3), and costs minutes on its own.
@pytest.mark.slow
@pytest.mark.parametrize("env_id", ["math-python", "code-contests"])
def test_sandboxed_shipped_envs_stay_fit(env_id):
    from helpers import bwrap_why_not

    if bwrap_why_not():
        pytest.skip(bwrap_why_not())
    report = admit(envhub.get_spec(env_id), n=3)
    assert report.fit and report.passed == 3, report.unfit_reasons
