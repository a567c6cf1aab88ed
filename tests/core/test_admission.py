"""Admission rejects untrustworthy verifiers and quarantines bad tasks, with reasons, never crashing."""
import json
import random

import pytest

import envhub
from envhub import EnvSpec, Response, Score, TextEnv
from envhub.admission import admit
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
