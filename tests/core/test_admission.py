"""Admission rejects untrustworthy verifiers and quarantines bad tasks, with reasons, never crashing."""
import json
import random

import pytest

import envhub
from envhub import EnvSpec, Response, Score, TextEnv
from envhub.admission import admit
from envhub.grading import Budget
from helpers import make_dist, run_cli

TASKS = [{"task_id": f"t{i}", "answer": str(i * 7)} for i in range(6)]


class Quiz(TextEnv):
    blocking = False

    def start(self, task):
        return "What is the answer?"

    def respond(self, action):
        return Response(done=True, artifacts={"answer": action.text.strip()})


def sound(task, artifacts):
    return artifacts.get("answer") == task["answer"]


def spec(**kw):
    base = dict(id="quiz", env=Quiz, tasks=lambda split: TASKS, verifier=sound, golden=lambda t, m: t["answer"])
    base.update(kw)
    return EnvSpec(**base)


def test_sound_verifier_is_fit_and_admits_everything():
    report = admit(spec(hack_probes={"wrong-number": lambda t, m: "-1"}))
    assert report.fit and report.passed == len(TASKS) and not report.quarantined
    names = {c.name for c in report.tasks[0].checks}
    assert {"golden", "noop", "deterministic", "hack:wrong-number", "malformed:empty", "malformed:huge",
            "malformed:binary-garbage", "malformed:unknown-tool", "malformed:wrong-argument-types",
            "malformed:unparseable-tool-call"} <= names


def test_verifier_that_passes_the_noop_is_unfit():
    report = admit(spec(verifier=lambda t, a: True))
    assert not report.fit
    assert any("noop check failed on 6 task(s)" in r for r in report.unfit_reasons)
    assert all("noop: passed with reward 1.0 but must fail" in r for rs in report.quarantined.values() for r in rs
               if r.startswith("noop"))


def test_golden_failure_quarantines_only_that_task():
    report = admit(spec(golden=lambda t, m: t["answer"] if t["task_id"] != "t3" else "wrong"))
    assert report.fit and report.passed == 5
    assert list(report.quarantined) == ["t3"] and "golden solution failed" in report.quarantined["t3"][0]


def test_crashing_verifier_is_reported_per_task():
    def flaky(task, artifacts):
        if task["task_id"] == "t2":
            raise RuntimeError("grader exploded")
        return sound(task, artifacts)

    report = admit(spec(verifier=flaky))
    assert "t2" in report.quarantined and "grader exploded" in " ".join(report.quarantined["t2"])
    assert report.passed == 5


def test_nondeterministic_verifier_is_unfit():
    rng = random.Random(0)
    report = admit(spec(verifier=lambda t, a: Score(rng.random(), a.get("answer") == t["answer"])))
    assert not report.fit and any(r.startswith("deterministic") for r in report.unfit_reasons)


def test_replay_with_the_goldens_artifacts_is_graded_once_as_the_first_regrade():
    """The replay's second grading and the re-grading's first golden call are one call on the same artifacts: made
    once (a sandboxed grader runs the tests once fewer per task), and the replay check still reads its verdict."""
    answers = []

    def counting(task, artifacts):
        answers.append(artifacts.get("answer"))
        return sound(task, artifacts)

    report = admit(spec(verifier=counting), n=1, budget=Budget(regrades=3, min_total=0))
    checks = {c.name: c for c in report.tasks[0].checks}
    assert checks["deterministic"].ok and checks["regrade"].ok and report.tasks[0].regrade_calls == 3
    # first grading, then the rotation's golden (golden, must-fail, must-fail): 2, where grading the replay apart
    # made 3
    assert answers.count(TASKS[0]["answer"]) == 2, answers


def test_a_verdict_that_changes_on_the_second_grading_fails_the_replay_check():
    seen = []

    def forgetful(task, artifacts):  # passes the golden's answer the first time only
        seen.append(artifacts.get("answer"))
        return sound(task, artifacts) and seen.count(artifacts.get("answer")) == 1

    report = admit(spec(verifier=forgetful), n=1, budget=Budget(regrades=3, min_total=0))
    checks = {c.name: c for c in report.tasks[0].checks}
    assert not report.fit and not checks["regrade"].ok
    assert not checks["deterministic"].ok and "replay with seed" in checks["deterministic"].message


@pytest.mark.parametrize("case", ["no re-grading", "golden fails"])
def test_the_replay_is_graded_apart_when_no_regrade_grades_the_golden(case):
    answers = []

    def counting(task, artifacts):
        answers.append(artifacts.get("answer"))
        return sound(task, artifacts)

    golden = (lambda t, m: t["answer"]) if case == "no re-grading" else (lambda t, m: "wrong")
    budget = Budget(regrades=0, min_total=0) if case == "no re-grading" else Budget(regrades=3, min_total=0)
    report = admit(spec(verifier=counting, golden=golden), n=1, budget=budget)
    checks = {c.name: c for c in report.tasks[0].checks}
    assert checks["deterministic"].ok and checks["deterministic"].status == "pass"
    assert answers.count(TASKS[0]["answer"] if case == "no re-grading" else "wrong") == 2, answers


def test_env_that_raises_on_malformed_input_is_unfit():
    class Fragile(Quiz):
        def respond(self, action):
            if not action.text:
                raise ValueError("empty action")
            return super().respond(action)

    report = admit(spec(env=Fragile))
    assert not report.fit
    reasons = " ".join(r for rs in report.quarantined.values() for r in rs)
    assert "malformed:empty: raised ValueError: empty action" in reasons


def test_hack_probe_that_passes_makes_the_verifier_unfit():
    lenient = lambda t, a: t["answer"] in a.get("answer", "")
    report = admit(spec(verifier=lenient, hack_probes={"spray": lambda t, m: " ".join(str(i) for i in range(100))}))
    assert not report.fit and any("hack:spray" in r for r in report.unfit_reasons)


def test_probes_a_verifier_carries_are_played_for_every_env_using_it():
    """A grader shared by several envs brings its own hack probes (swe-gym's test runner: the answer-key reader):
    an env that declares none still plays them, and one that passes makes the verifier unfit."""
    class Shared:  # sound but for one back door, which only its own probe knows
        hack_probes = {"back-door": lambda t, m: "open sesame"}

        def verify(self, task, artifacts):
            ok = artifacts.get("answer") in (task["answer"], "open sesame")
            return Score(float(ok), ok)

    report = admit(spec(verifier=Shared()))
    assert not report.fit and any("hack:back-door" in r for r in report.unfit_reasons), report.unfit_reasons
    assert next(c for c in report.checks if c.name == "hack-probes-declared").ok


def test_report_json_round_trips():
    data = json.loads(admit(spec(), n=2).to_json())
    assert data["tasks_total"] == 2 and data["tasks_admitted"] == 2 and data["fit"] is True


@pytest.mark.parametrize("env_id", ["countdown", "guess-number"])
def test_first_party_envs_are_admitted(env_id):
    report = admit(envhub.get_spec(env_id))
    assert report.fit and report.passed == len(report.tasks) >= 30, report.quarantined


BAD_PLUGIN = '''
import envhub
from envhub import EnvSpec, Response, TextEnv

class Env(TextEnv):
    def start(self, task): return "anything"
    def respond(self, action): return Response(done=True, artifacts={"answer": action.text})

@envhub.hookimpl
def envhub_register(registry):
    registry.register(EnvSpec(id="too-kind", env=Env, tasks=lambda split: [{"task_id": "a"}, {"task_id": "b"}],
                              verifier=lambda t, a: True, golden=lambda t, m: "x"))
'''


def test_cli_validate_rejects_a_bad_plugin_with_exit_code_and_report(tmp_path):
    make_dist(tmp_path, "too-kind", {"too-kind": "too_kind"}, {"too_kind": BAD_PLUGIN})
    out = tmp_path / "report.json"
    r = run_cli("validate", "too-kind", "--json", str(out), site=tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "UNFIT" in r.stdout and "quarantined" in r.stdout
    data = json.loads(out.read_text())
    assert data["fit"] is False and data["tasks_admitted"] == 0 and set(data["quarantined"]) == {"a", "b"}
