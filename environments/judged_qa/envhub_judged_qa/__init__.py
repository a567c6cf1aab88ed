"""Judged QA: a short open answer to a factual question, graded by an LLM judge against the task's reference answer.

The grader is :class:`envhub.judging.JudgeVerifier` with a reference-guided rubric and labelled calibration
examples (:data:`CALIBRATION`, balanced, with near misses: a wrong value in the right unit, the right number in the
wrong unit, the neighbouring planet, the inverted reason, a hedge, a right answer with a false claim added).
Its published answer contract (:data:`CONTRACT`, :mod:`envhub.judging.contract`): the answer is one sentence of
prose, at most :data:`MAX_WORDS` words (the task text says so); comments, hidden elements, tags, code and JSON are
removed before the judge reads it, and an answer over the budget, or with nothing left, fails unjudged.
Its choice gate (:mod:`envhub.judging.choice`): before grading, the judge must pick the reference out of the task's
foil (a plausible wrong answer) and "none", without seeing the question, in both orders; then again from what the
answer says beyond the question's own words (an answer that only restates or trails off from the question fails
unjudged), with the answer's other numbers offered as options too (an answer stating two values states several).
Admission holds the judge to its calibration (agreement and Cohen's kappa at least :data:`MIN_AGREEMENT` /
:data:`MIN_KAPPA`) and to the judge-attack probes of :mod:`envhub.judgeprobes`.

Which judge (:func:`make_judge`), decided when the plugin loads:

* ``$ENVHUB_JUDGE`` set: a hosted judge by URL, ``chat+http://host:port`` (any OpenAI-compatible chat endpoint;
  ``$ENVHUB_JUDGE_MODEL`` names the model, ``$OPENAI_API_KEY`` authenticates, ``$ENVHUB_JUDGE_GRAMMAR=1`` sends the
  llama.cpp verdict grammar when the server is llama.cpp's);
* otherwise the local judge: Qwen2.5-Coder-1.5B-Instruct (GGUF, sha256-pinned) in llama.cpp on the CPU, with the
  verdict grammar (:mod:`envhub.judging.llamacpp`; install it with ``make judge-model``). Not installed, every
  judgment is a crashed score naming the fix, and admission says the verifier is unfit.
"""
from __future__ import annotations

import os

import envhub
from envhub import EnvSpec, Response, TextEnv

RUBRIC = ("Score 10 if the answer states the same fact as the reference answer (the same value and unit, the same "
          "person or planet, or the same reason), in any wording. Score 0 if it states a different or wrong fact, "
          "hedges between options, adds a false claim, or does not answer.")
MIN_AGREEMENT, MIN_KAPPA = 0.8, 0.6
MAX_WORDS = 40  # "one sentence": the longest labelled good answer has 16 words
TASKS = [
    {"task_id": "boil", "question": "At what temperature does pure water boil at sea level, in degrees Celsius?",
     "reference": "100 degrees Celsius.", "foils": ["0 degrees Celsius."],
     "golden": "Pure water boils at 100 degrees Celsius at sea level."},
    {"task_id": "planet", "question": "Which planet of the solar system is closest to the Sun?",
     "reference": "Mercury.", "foils": ["Earth."], "golden": "Mercury is the planet closest to the Sun."},
    {"task_id": "ice", "question": "Why does ice float on liquid water?",
     "reference": "Because ice is less dense than liquid water.",
     "foils": ["Because ice contains trapped air bubbles."],
     "golden": "Ice floats because it is less dense than liquid water."},
]
PLAY = {"task_id": "play", "question": "Who wrote the play Romeo and Juliet?", "reference": "William Shakespeare.",
        "foils": ["Ben Jonson."]}
# Each task's foil is a plausible wrong answer for the choice gate (envhub.judging.choice), written from the question
# alone: none is a calibration answer or an admission probe's text, so neither measures the foils it was fitted to.
SAMENESS = "The same fact means the same value and unit, the same person or planet, or the same reason, in any wording."
_BOIL, _PLANET, _ICE = TASKS
# Labelled by hand against the rubric: 9 good, 9 bad; every bad one is a near miss.
CALIBRATION = [{"task": t, "answer": a, "label": ok} for t, a, ok in [
    (_BOIL, "100 degrees Celsius.", True),
    (_BOIL, "At sea level it boils at 100 °C, which is 212 °F.", True),
    (_BOIL, "Water boils at 90 degrees Celsius at sea level.", False),
    (_BOIL, "It boils at 100 degrees Fahrenheit.", False),
    (_PLANET, "Mercury.", True),
    (_PLANET, "The closest planet to the Sun is Mercury.", True),
    (_PLANET, "Venus is the planet closest to the Sun.", False),
    (_PLANET, "Mercury or Venus, I am not sure which.", False),
    (_PLANET, "Mercury, which is also the largest planet of the solar system.", False),
    (_ICE, "Ice is less dense than liquid water, so it floats.", True),
    (_ICE, "Water expands when it freezes, so ice has a lower density than the liquid and floats.", True),
    (_ICE, "Ice floats because it is colder than the water around it.", False),
    (_ICE, "Ice floats because it is denser than liquid water.", False),
    (PLAY, "William Shakespeare wrote it.", True),
    (PLAY, "Shakespeare.", True),
    (PLAY, "Christopher Marlowe wrote Romeo and Juliet.", False),
    (PLAY, "It was written by Charles Dickens.", False),
    (PLAY, "Romeo and Juliet is by Shakespeare, the English playwright.", True),
]]
HACK_PROBES = {
    "wrong-fact-confidently": lambda task, m: {"boil": "Pure water boils at 90 degrees Celsius at sea level.",
                                               "planet": "Venus is the planet closest to the Sun.",
                                               "ice": "Ice floats because it is denser than liquid water."}[task["task_id"]],
    "question-restated": lambda task, m: f"You asked: {task['question']} That is a good question.",
}


class JudgedQA(TextEnv):
    blocking = False  # the env only records the answer; the judge runs in the verifier

    def start(self, task):
        return task["question"] + f" Answer in one sentence (at most {MAX_WORDS} words)."

    def respond(self, action):
        return Response(done=True, artifacts={"answer": action.text})


def golden(task, messages):
    return task["golden"]


def make_judge():
    """The hosted judge named by ``$ENVHUB_JUDGE``, else the local GGUF judge (see the module docstring)."""
    url = os.environ.get("ENVHUB_JUDGE", "").strip()
    if url:
        from envhub.judging import JudgeModel
        from envhub.judging.grammar import verdict_decoding

        decoding = verdict_decoding() if os.environ.get("ENVHUB_JUDGE_GRAMMAR") == "1" else None
        return JudgeModel(url, tokenizer=os.environ.get("ENVHUB_JUDGE_TOKENIZER", "smollm2"),
                          api_model=os.environ.get("ENVHUB_JUDGE_MODEL") or None, decoding=decoding)
    from envhub.judging.llamacpp import local_judge

    return local_judge()


def make_verifier(judge=None, **kw):
    """The env's :class:`~envhub.judging.JudgeVerifier` (``judge``: default :func:`make_judge`)."""
    from envhub.judging import JudgeVerifier
    from envhub.judging.choice import ChoiceGate
    from envhub.judging.contract import AnswerContract

    kw = {"calibration": CALIBRATION, "min_agreement": MIN_AGREEMENT, "min_kappa": MIN_KAPPA, "timeout_s": 280.0,
          "contract": AnswerContract(max_words=MAX_WORDS),
          "choice": ChoiceGate(sameness=SAMENESS, beyond_question=True, answer_values=True), **kw}
    judge = judge if judge is not None else make_judge()
    if "cache" not in kw and type(judge.backend).__name__ == "LlamaCppBackend" and judge.backend.gguf.is_file():
        # the local judge's verdicts are kept beside its model: a second admission (``registry add`` after a
        # trial run) pays only for its re-grades, which go around the cache
        from envhub.judging import JudgeCache

        path = judge.backend.gguf.parent.parent / "cache" / "judged-qa.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        kw["cache"] = JudgeCache(path)
    return JudgeVerifier(judge, RUBRIC, question_key="question", reference_key="reference", **kw)


@envhub.hookimpl
def envhub_register(registry):
    registry.register(EnvSpec(
        id="judged-qa", version="0.1.0", env=JudgedQA, tasks=lambda split: TASKS, verifier=make_verifier(),
        golden=golden, hack_probes=HACK_PROBES, max_turns=1,
        summary="Short open answers to factual questions, graded by an LLM judge against a reference.",
        tags=["judged", "qa", "single-turn"],
    ))
