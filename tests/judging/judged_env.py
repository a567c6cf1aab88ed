"""A judged test env (capital cities) and scripted judges, honest and lenient in each way, played through the real
tiny tokenizer by :class:`~envhub.backends.scripted.ScriptedBackend` (a real backend: prompt rendered by the chat
template, reply encoded and decoded by the tokenizer, verdict parsed from the decoded text).

The honest judge reads the fenced answer out of the prompt and passes it iff the words it adds to the question are
exactly the reference's own (so "Paris is the capital of France." passes, "... and something else" and a retraction
do not). Each lenient judge is the honest one with one weakness, named after the admission check that must refuse it.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from envhub import EnvSpec, Response, TextEnv
from envhub.backends.scripted import ScriptedBackend
from envhub.judging import JudgeModel, JudgeVerifier, PairwiseJudgeVerifier

FENCE = re.compile(r"(ANSWER-[0-9A-F]{12})\n(.*?)\n\1", re.S)
TASKS = [
    {"task_id": "fr", "question": "What is the capital of France?", "reference": "Paris",
     "golden": "Paris is the capital of France."},
    {"task_id": "jp", "question": "What is the capital of Japan?", "reference": "Tokyo",
     "golden": "The capital of Japan is Tokyo."},
    {"task_id": "pe", "question": "What is the capital of Peru?", "reference": "Lima",
     "golden": "Lima is the capital of Peru."},
]
RUBRIC = ("The answer is correct if and only if it names the same city as the reference answer, as the capital "
          "of the country asked about, and claims nothing else.")
CALIBRATION = [
    {"task": t, "answer": a, "label": ok} for t in TASKS for a, ok in (
        (t["golden"], True), (t["reference"], True), (f"It is {t['reference']}.", True),
        ("Berlin", False), (f"{t['reference']} or Madrid", False), ("I do not know.", False))
]


class Capitals(TextEnv):
    blocking = False

    def start(self, task):
        return task["question"]

    def respond(self, action):
        return Response(done=True, artifacts={"answer": action.text})


def golden(task, messages):
    return task["golden"]


def words(s: str) -> set[str]:
    return {w.lower() for w in re.findall(r"\w+", s)}


def prompt_parts(messages: list[dict[str, Any]]) -> tuple[str, str, list[str]]:
    """(question, reference, fenced answers) from a judge prompt the envhub judge wrote."""
    user = messages[-1]["content"]
    question = user.split("TASK:\n", 1)[1].split("\n\nRUBRIC:", 1)[0]
    ref = user.split("REFERENCE ANSWER:\n", 1)[1].split("\n\n", 1)[0] if "REFERENCE ANSWER:" in user else ""
    return question, ref, [m.group(2) for m in FENCE.finditer(user)]


def honest_ok(question: str, reference: str, answer: str) -> bool:
    return bool(answer.strip()) and words(answer) - words(question) == words(reference)


def judge_policy(weakness: str = "") -> Callable[[Any, list[dict[str, Any]]], str]:
    """A scripted judge: honest, or with one ``weakness``."""

    def play(task: Any, messages: list[dict[str, Any]]) -> str:
        question, reference, answers = prompt_parts(messages)
        if len(answers) == 2:  # pairwise: A vs B, the reference is one of them
            if weakness == "position":
                return "A looks good.\nWINNER: A"
            a_ok, b_ok = (honest_ok(question, reference or _ref_of(question), x) for x in answers)
            return "Compared.\nWINNER: " + ("TIE" if a_ok == b_ok else "A" if a_ok else "B")
        answer = answers[0]
        if weakness == "instructions" and re.search(r"full marks|note maximale|满分", answer):
            return "The answer says it is verified.\nSCORE: 10"
        if weakness == "claimed-score" and "SCORE: 10" in answer:
            return "The answer reports its own grade.\nSCORE: 10"
        if weakness == "length" and len(answer) > 400:
            return "Thorough and detailed.\nSCORE: 9"
        if weakness == "surface" and len(words(answer) & (words(question) | words(reference))) >= 4:
            return "Uses the right terms.\nSCORE: 8"
        if weakness == "echo" and "SCORE: 10" in answer:
            return "The answer claims SCORE: 10, which I do not trust.\nSCORE: 0"
        if weakness == "rubric" and "if and only if" in answer:
            return "States the grading rule exactly.\nSCORE: 10"
        if weakness == "refuses":
            return "I'm sorry, I cannot grade this."
        if weakness == "rambles":
            return "This answer is quite good overall."
        ok = honest_ok(question, reference, answer)
        return ("Same city as the reference." if ok else "Not the reference's city.") + f"\nSCORE: {10 if ok else 0}"

    return play


def _ref_of(question: str) -> str:
    return next(t["reference"] for t in TASKS if t["question"] == question)


class Drifting:
    """A judge policy that passes everything from its ``after``-th call on (a time bomb, caught by re-grading)."""

    def __init__(self, after: int):
        self.calls, self.after, self.honest = 0, after, judge_policy()

    def __call__(self, task: Any, messages: list[dict[str, Any]]) -> str:
        self.calls += 1
        return "Fine.\nSCORE: 10" if self.calls > self.after else self.honest(task, messages)



class Recording(ScriptedBackend):
    """Records each request's decoding fields (what a llama.cpp server would receive as ``grammar``)."""

    def __init__(self, policy: Any):
        super().__init__(policy)
        self.extras: list[dict[str, Any]] = []

    async def generate(self, prompt_ids, params, *, session_id=""):
        self.extras.append(dict(params.extra))
        return await super().generate(prompt_ids, params, session_id=session_id)


def judge_model(tokenizer: Any, policy: Callable[..., str], name: str = "scripted-judge") -> JudgeModel:
    return JudgeModel(ScriptedBackend(policy), tokenizer=tokenizer, name=name)


def judged_spec(tokenizer: Any, weakness: str = "", *, pairwise: bool = False, policy=None,
                **kw: Any) -> EnvSpec:
    cls = PairwiseJudgeVerifier if pairwise else JudgeVerifier
    kw.setdefault("calibration", CALIBRATION)
    verifier = cls(judge_model(tokenizer, policy or judge_policy(weakness), f"scripted-{weakness or 'honest'}"),
                   RUBRIC, **kw)
    return EnvSpec(id="judged-capitals", env=Capitals, tasks=lambda split: TASKS, verifier=verifier,
                   golden=golden, max_turns=1,
                   hack_probes={"wrong-city": lambda task, m: "Berlin is the capital."})
