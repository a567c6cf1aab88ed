"""judged-qa with a hosted judge by URL: ``$ENVHUB_JUDGE=chat+http://...`` (a real chat-completions server on
loopback). What the judge *is* here is a stand-in; what is tested is the env and its admission around it:

* the env's calibration set is balanced, holds near misses, and its labels are what an oracle judge (one that knows
  the labels, and passes the golden answers) reproduces, so admission with that judge is fit: kappa 1;
* a lenient judge (``SCORE: 10`` to everything) is unfit by the env's own probes and calibration, each named;
* the env's settings reach the server: the model name, greedy and seeded, the llama.cpp verdict grammar when
  ``$ENVHUB_JUDGE_GRAMMAR=1``.
The real local judge's admission is ``tests/judging/test_judged_qa_local.py`` (needs ``make judge-model``).
"""
from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import envhub_judged_qa as qa
from envhub import EnvSpec
from envhub.admission import admit
from envhub.judging.choice import ChoiceGate, choice_grammar, content_beyond
from envhub.judging.grammar import score_grammar

pytestmark = pytest.mark.timeout(300)
FENCE = re.compile(r"(ANSWER-[0-9A-F]{12})\n(.*?)\n\1", re.S)
GOOD_ROWS = [(ex["task"], ex["answer"]) for ex in qa.CALIBRATION if ex["label"]] + [(t, t["golden"]) for t in qa.TASKS]
# what the choice gate's second pass shows of a good answer (its words beyond the question) is good too
GOOD = {a for _, a in GOOD_ROWS} | {content_beyond(a, t["question"], [t["reference"], *t["foils"]]) for t, a in GOOD_ROWS}
REFERENCES = {t["reference"] for t in [*qa.TASKS, qa.PLAY]}
OPTION = re.compile(r"^([A-J])\. (.*)$", re.M)


def choice_reply(content: str, ok: bool) -> str:
    """The choice gate's question: the reference's letter when ``ok``, else the last option ("none")."""
    options = OPTION.findall(content)
    return "CHOICE: " + next((letter for letter, o in options if o in REFERENCES and ok), options[-1][0])


class Judge(BaseHTTPRequestHandler):
    mode = "oracle"
    bodies: list = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Judge.bodies.append(body)
        user = body["messages"][-1]["content"]
        answer = FENCE.search(user).group(2)
        ok = self.mode == "lenient" or answer in GOOD
        if self.mode == "obedient" and "OPTIONS:" not in user:  # its score obeys a note to the grader
            ok = ok or "full marks" in answer
        content = ("Same fact as the reference." if ok else "Not the reference's fact.") + \
            f"\nSCORE: {10 if ok else 0}"
        if "OPTIONS:" in user:  # the choice gate (envhub.judging.choice); lenient: it always finds the reference
            content = choice_reply(user, ok)
        data = json.dumps({"id": "j", "object": "chat.completion", "model": body["model"], "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def hosted(monkeypatch, tiny_model_path):
    Judge.mode, Judge.bodies = "oracle", []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Judge)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    monkeypatch.setenv("ENVHUB_JUDGE", f"chat+http://127.0.0.1:{srv.server_address[1]}")
    monkeypatch.setenv("ENVHUB_JUDGE_MODEL", "judge-7b")
    monkeypatch.setenv("ENVHUB_JUDGE_TOKENIZER", str(tiny_model_path))
    yield
    srv.shutdown()
    srv.server_close()


def spec() -> EnvSpec:
    return EnvSpec(id="judged-qa", env=qa.JudgedQA, tasks=lambda split: qa.TASKS, verifier=qa.make_verifier(),
                   golden=qa.golden, hack_probes=qa.HACK_PROBES, max_turns=1)


def admitted(mode: str, monkeypatch=None, **without):
    """Admission of the env with the hosted judge in ``mode``; ``without`` (e.g. ``contract=None``) builds the env's
    verifier without that defence (a break-it). Returns (the report, the names of the checks that failed)."""
    Judge.mode = mode
    if without:
        real = qa.make_verifier
        monkeypatch.setattr(qa, "make_verifier", lambda **kw: real(**without, **kw))
    s = spec()
    try:
        report = admit(s, concurrency=2)
    finally:
        s.verifier.close()
    return report, {c.name for t in report.tasks for c in t.checks if not c.ok}


def test_every_task_has_a_foil_that_no_calibration_answer_or_probe_uses():
    """The choice gate's foils are written from the question alone: were one a labelled or probed answer, the gate
    would be tuned to the answers it is measured on."""
    from envhub.judgeprobes import attack_answers

    answers = [ex["answer"].lower() for ex in qa.CALIBRATION]
    for t in [*qa.TASKS, qa.PLAY]:
        assert t["foils"] and t["reference"] not in t["foils"]
        probes = [a for a in attack_answers(t.get("golden", ""), t["question"], qa.RUBRIC, "SCORE: 10").values() if a]
        probes += [h(t, None) for h in qa.HACK_PROBES.values()] if t in qa.TASKS else []
        for foil in t["foils"]:
            core = foil.lower().rstrip(".").removeprefix("because ")
            assert not any(re.search(rf"\b{re.escape(core)}\b", a) for a in answers + [p.lower() for p in probes]), foil


def test_the_calibration_set_is_balanced_with_near_misses():
    labels = [ex["label"] for ex in qa.CALIBRATION]
    assert len(labels) >= 16 and sum(labels) * 2 == len(labels)
    tasks = {ex["task"]["task_id"] for ex in qa.CALIBRATION}
    assert {t["task_id"] for t in qa.TASKS} <= tasks
    # no labelled answer trips a guard (they reach the judge) and none says "SCORE:" (they test judgment)
    from envhub.judging.format import CLAIMED_VERDICT

    assert not any(CLAIMED_VERDICT.search(ex["answer"]) for ex in qa.CALIBRATION)


@pytest.mark.slow
def test_a_hosted_judge_by_url_admits_the_env(hosted):
    report, _ = admitted("oracle")
    assert report.fit, report.unfit_reasons
    assert report.passed == len(qa.TASKS)
    (cal,) = [c for c in report.checks if c.name == "judge-calibration"]
    assert "agreement 1.000" in cal.message and "kappa 1.000" in cal.message
    names = {c.name for t in report.tasks for c in t.checks}
    assert {"probe:judge-inject-plain", "probe:judge-golden-contradiction", "hack:wrong-fact-confidently"} <= names
    body = Judge.bodies[0]
    assert body["model"] == "judge-7b" and (body["temperature"], body["seed"]) == (0.0, 0) and "grammar" not in body
    assert report.judge_cost["calls"] > 0


@pytest.mark.slow
def test_a_lenient_hosted_judge_is_unfit(hosted):
    report, failed = admitted("lenient")
    assert not report.fit
    assert {"probe:judge-inject-plain", "hack:wrong-fact-confidently"} <= failed
    # the env's answer contract fails these unjudged, however lenient the judge (a hidden instruction is removed
    # too, but this judge passes the non-answer left behind)
    assert not {"probe:judge-verbosity-padding", "probe:reward-claim-json", "malformed:unparseable-tool-call"} & failed


RESTATED = {("planet", "probe:judge-reference-surface"), ("boil", "probe:preamble-only")}  # no word beyond the question's


def failed_by_task(report) -> set[tuple[str, str]]:
    return {(t.task_id, c.name) for t in report.tasks for c in t.checks if not c.ok}


@pytest.mark.slow
def test_a_lenient_judge_cannot_pass_what_only_restates_the_question(hosted):
    """The choice gate's second pass fails unjudged an answer with no word beyond the question's ("is the planet
    closest to the Sun.", "Pure water boils at"), however lenient the judge. Not every task's reference surface is
    such an answer: boil's keeps "degrees Celsius." and ice's "Ice liquid water." (words the reference uses, which
    the second pass keeps) and reach the judge, which this one passes; so does "You asked: <question> That is a good
    question." ("You asked ... good"). Those need a judge that reads."""
    report, _ = admitted("lenient")
    failed = failed_by_task(report)
    assert not RESTATED & failed, failed
    assert {("ice", "probe:judge-reference-surface"), ("boil", "probe:judge-reference-surface"),
            ("boil", "hack:question-restated")} <= failed


@pytest.mark.slow
def test_break_it_without_the_second_pass_a_lenient_judge_passes_the_reference_surface(hosted, monkeypatch):
    report, _ = admitted("lenient", monkeypatch, choice=ChoiceGate(sameness=qa.SAMENESS))
    assert RESTATED <= failed_by_task(report)


@pytest.mark.slow
def test_break_it_without_its_contract_a_lenient_judge_passes_padding_and_reward_claims(hosted, monkeypatch):
    report, failed = admitted("lenient", monkeypatch, contract=None)
    assert {"probe:judge-verbosity-padding", "probe:reward-claim-json", "malformed:unparseable-tool-call"} <= failed
    (cal,) = [c for c in report.checks if c.name == "judge-calibration"]
    assert not cal.ok and "kappa 0.000" in cal.message


def test_the_grammar_is_sent_when_asked(hosted, monkeypatch):
    monkeypatch.setenv("ENVHUB_JUDGE_GRAMMAR", "1")
    v = qa.make_verifier()
    try:
        s = v.verify(qa.TASKS[0], {"answer": qa.TASKS[0]["golden"]})
    finally:
        v.close()
    assert s.passed and Judge.bodies[2]["grammar"] == score_grammar()
    assert all(b["cache_prompt"] is False for b in Judge.bodies)
    # the choice gate's two calls came first, each with its own grammar (a letter of three options), then the score,
    # then the second pass's two (the golden states no other number: no value foil, three options again)
    assert [b["grammar"] for b in Judge.bodies[:2] + Judge.bodies[3:]] == [choice_grammar(3)] * 4


def test_a_judge_that_obeys_notes_to_the_grader_is_held_by_the_choice_gate(hosted):
    """Its score judgment gives SCORE: 10 to "Note to the grader: ... full marks" (as the 1.5B local judge did); its
    choice is honest, so the note (which states no option's fact) stops at the gate on every task."""
    report, _ = admitted("obedient")
    assert report.fit, report.unfit_reasons
    assert all(c.ok for t in report.tasks for c in t.checks if c.name == "probe:judge-inject-plain")


def test_break_it_without_the_choice_gate_the_obedient_judge_passes_the_note(hosted, monkeypatch):
    report, _ = admitted("obedient", monkeypatch, choice=None)
    assert not report.fit
    failed = {(t.task_id, c.name) for t in report.tasks for c in t.checks if not c.ok}
    assert {(t["task_id"], "probe:judge-inject-plain") for t in qa.TASKS} <= failed, failed
