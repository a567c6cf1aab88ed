"""``JudgeVerifier``: a verifier whose grade is an LLM judge's, held to the same guarantees as a programmatic one.

::

    judge = JudgeVerifier("smollm2", rubric="Correct iff it states the same fact as the reference.",
                          question_key="question", reference_key="reference")
    score = judge.verify(task, {"answer": "Paris"})
    score.details  # judge_model, rubric_sha256, prompt_sha256, raw_judgment, parsed_score, cached

What holds, and where:

* **Deterministic settings** (:class:`~envhub.judging.engine.JudgeModel`): greedy, temperature 0, a fixed seed.
  Admission still re-grades without the cache (:meth:`uncached`): a judge that drifts is unfit.
* **Strict verdicts** (:mod:`envhub.judging.format`): a malformed, ambiguous or refused judgment, a timeout or a
  backend error is a *crashed* score (``Score.crashed``, ``details["judge_failure"]`` names the kind), never a pass
  and never a 0 a trainer would learn from.
* **Guards before the judge** (``guards=True``): an empty or over-long answer fails, an answer carrying the judge's own verdict
  syntax (``SCORE:``/``WINNER:``) fails, an answer echoing eight or more consecutive words of the rubric fails.
  They cost nothing and close the two attacks a judge is worst at (a claimed score, the rubric read back).
* **An answer contract** (``contract=``, :mod:`envhub.judging.contract`): hidden markup, code and JSON removed before
  the judge reads, a word budget; what it removes is in ``details["contract_removed"]``.
* **A question-blind choice gate** (``choice=``, :mod:`envhub.judging.choice`): before the pointwise judgment, the
  judge must pick the reference out of the task's foils and "none", without the question, in every rotation; with
  ``beyond_question`` again from the answer's words beyond the question's (none left: it fails unjudged), with
  ``answer_values`` the answer's other numbers offered as options too. That second pass has its own cache key.
* **A cache** keyed by (judge, rubric, task, answer) (:class:`JudgeCache`): re-grading and admission do not pay twice.
  Crashed judgments are not cached (a timeout may not recur).
* **What admission reads** (duck-typed, like ``hack_probes``): ``judged``, ``calibration`` (labelled examples),
  ``min_agreement``/``min_kappa``, ``claim_line``, ``pairwise``, :meth:`uncached`, :meth:`judge_stats`.
"""
from __future__ import annotations

import asyncio
import copy
import json
import re
import threading
from pathlib import Path
from typing import Any, Callable

from envhub.judging.choice import ChoiceGate, choice_grammar, content_beyond
from envhub.judging.contract import AnswerContract
from envhub.judging.engine import JudgeModel
from envhub.judging.format import (CLAIMED_VERDICT, FORMAT_VERSION, JudgeFormatError, pair_messages, parse_score,
                                   parse_winner, prompt_hash, score_messages, sha)
from envhub.verifier import Score

ECHO_WORDS = 8  # an answer holding this many consecutive rubric words reads the rubric back


class JudgeCache:
    """Judgments by key (judge, rubric, task, answer, format version); in memory, and appended to a JSON-lines file
    when ``path`` is given (reloaded on start, so a second admission of the same env pays nothing)."""

    def __init__(self, path: str | Path | None = None):
        self.path = Path(path) if path else None
        self._data: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        if self.path and self.path.exists():
            for line in self.path.read_text().splitlines():
                if line.strip():
                    row = json.loads(line)
                    self._data[row["key"]] = row["score"]

    @staticmethod
    def key(judge: str, rubric: str, task: str, answer: str) -> str:
        return sha(json.dumps([FORMAT_VERSION, judge, sha(rubric), sha(task), sha(answer)]))

    def get(self, key: str) -> Score | None:
        with self._lock:
            hit = self._data.get(key)
        return Score.from_dict(copy.deepcopy(hit)) if hit is not None else None

    def put(self, key: str, score: Score) -> None:
        with self._lock:
            self._data[key] = score.to_dict()
            if self.path:
                with self.path.open("a") as f:
                    f.write(json.dumps({"key": key, "score": score.to_dict()}) + "\n")

    def __len__(self) -> int:
        return len(self._data)


class JudgeVerifier:
    """A pointwise judge: ``SCORE: N`` out of ``scale``; reward ``N / scale``, passed when ``N >= pass_score``.

    Args:
        judge: a :class:`JudgeModel`, or what builds one (a backend or a ``make_backend`` string; ``tokenizer``,
            ``name``, ``max_tokens``, ``seed``, ``api_model`` go to it).
        rubric: what a correct answer must do (hashed into every judgment and the cache key).
        question_key / task_text: the task as the judge reads it: a task-row key, or a function of the row.
        reference_key: the task-row key of the reference answer (``None``: the rubric alone).
        answer_key: the artifact the judge grades.
        calibration: labelled examples ``{"task": row, "answer": str, "label": bool}`` admission grades;
            ``min_agreement`` / ``min_kappa`` are the env's declared thresholds (below either: unfit).
        timeout_s: one judgment, at most (then a crashed score).
        max_answer_chars: a longer answer fails unjudged (a judge's context is finite; 1 MB of text is no answer).
        strict: the verdict parser's strictness (``False`` only to show what it defends against).
        contract: the env's :class:`~envhub.judging.contract.AnswerContract` (markup, code and JSON removed, a word
            budget), applied after the guards: the judge reads what it leaves, or the answer fails unjudged.
        choice: a :class:`~envhub.judging.choice.ChoiceGate`: the answer must first pass the question-blind
            reference choice (needs ``reference_key`` and the tasks' foils); then the judgment as usual; then, with
            ``ChoiceGate(beyond_question=True)``, the choice again from what the answer says beyond the question.
    """

    judged = True
    pairwise = False
    blocking = True

    def __init__(self, judge: JudgeModel | Any, rubric: str, *, question_key: str = "question",
                 task_text: Callable[[dict[str, Any]], str] | None = None, reference_key: str | None = "reference",
                 answer_key: str = "answer", scale: int = 10, pass_score: int = 7, timeout_s: float = 120.0,
                 cache: JudgeCache | None = None, calibration: list[dict[str, Any]] | None = None,
                 min_agreement: float = 0.8, min_kappa: float = 0.6, guards: bool = True, strict: bool = True,
                 max_answer_chars: int = 4000, contract: AnswerContract | None = None,
                 choice: ChoiceGate | None = None, **judge_kw: Any):
        if not rubric.strip():
            raise ValueError("JudgeVerifier needs a non-empty rubric")
        if not 0 < pass_score <= scale:
            raise ValueError(f"pass_score must be in 1..{scale}, got {pass_score}")
        self.judge = judge if isinstance(judge, JudgeModel) else JudgeModel(judge, **judge_kw)
        self.rubric, self.rubric_sha = rubric, sha(rubric)
        self.question_key, self._task_text = question_key, task_text
        self.reference_key, self.answer_key = reference_key, answer_key
        self.scale, self.pass_score, self.timeout_s = scale, pass_score, timeout_s
        self.cache = cache if cache is not None else JudgeCache()
        self.calibration = list(calibration or [])
        self.min_agreement, self.min_kappa = min_agreement, min_kappa
        self.guards, self.strict, self.max_answer_chars = guards, strict, max_answer_chars
        self.contract = contract
        if choice is not None and not reference_key:
            raise ValueError("a choice gate offers the reference among its options: give reference_key")
        self.choice = choice
        self.__name__ = f"{type(self).__name__}({self.judge.name})"
        words = re.findall(r"\w+", rubric.lower())
        self._rubric_shingles = {" ".join(words[i:i + ECHO_WORDS]) for i in range(len(words) - ECHO_WORDS + 1)}

    @property
    def claim_line(self) -> str:
        """A verdict in this judge's own format claiming full marks (what the claimed-score probe writes)."""
        return f"SCORE: {self.scale}"

    def task_text(self, task: dict[str, Any]) -> str:
        return self._task_text(task) if self._task_text else str(task.get(self.question_key, ""))

    def reference(self, task: dict[str, Any]) -> str | None:
        ref = task.get(self.reference_key) if self.reference_key else None
        return None if ref is None else str(ref)

    def uncached(self) -> JudgeVerifier:
        """This verifier without its cache (same model, same stats): what admission re-grades with."""
        view = copy.copy(self)
        view.cache = JudgeCache()
        view._no_cache = True  # type: ignore[attr-defined]
        return view

    def judge_stats(self) -> dict[str, Any]:
        return {"judge_model": self.judge.name, **self.judge.stats.to_dict()}

    # ---- grading -----------------------------------------------------------------------------------------------
    def guard(self, answer: str, context: str = "") -> str | None:
        """Why ``answer`` fails without asking the judge, or None (see the module docstring). Rubric phrases that
        ``context`` (the task and its reference) also holds are not an echo: a reference-guided rubric may quote the
        reference, and a correct answer may too."""
        if not answer.strip():
            return "empty answer"
        if len(answer) > self.max_answer_chars:
            return f"answer of {len(answer)} characters, over the judge's limit of {self.max_answer_chars}"
        if CLAIMED_VERDICT.search(answer):
            return "the answer carries the judge's verdict format (a claimed score or verdict)"
        words = re.findall(r"\w+", answer.lower())
        allowed = re.findall(r"\w+", context.lower())
        allowed_shingles = {" ".join(allowed[i:i + ECHO_WORDS]) for i in range(len(allowed) - ECHO_WORDS + 1)}
        for i in range(len(words) - ECHO_WORDS + 1):
            shingle = " ".join(words[i:i + ECHO_WORDS])
            if shingle in self._rubric_shingles and shingle not in allowed_shingles:
                return f"the answer echoes the rubric ({ECHO_WORDS}+ consecutive rubric words)"
        return None

    def verify(self, task: dict[str, Any], artifacts: dict[str, Any]) -> Score:
        answer = str((artifacts or {}).get(self.answer_key, "") or "")
        task_text, reference = self.task_text(task), self.reference(task)
        base: dict[str, Any] = {"judge_model": self.judge.name, "rubric_sha256": self.rubric_sha}
        if self.guards and (why := self.guard(answer, f"{task_text}\n{reference or ''}")):
            return Score(0.0, False, {**base, "reason": why, "guard": True})
        removed: list[str] | None = None
        if self.contract is not None:
            answer, removed, why = self.contract.apply(answer)
            if why:
                return Score(0.0, False, {**base, "contract_removed": removed, "reason": why, "contract": True})
        if removed is not None:
            base["contract_removed"] = removed
        foils = [str(f) for f in (task.get(self.choice.foils_key) or [])] if self.choice is not None else []
        content = None
        if self.choice is not None and self.choice.beyond_question:  # free, so before any judge call
            content = content_beyond(answer, task_text, [reference or "", *foils])
            if not re.search(r"\w", content):
                return Score(0.0, False, {**base, "beyond_content": content, "beyond_question": True,
                                          "reason": "the answer states nothing beyond the question's own words"})
        # keyed by what the judge reads (the answer after the contract): the same text is the same judgment
        context: list[Any] = [task_text, reference]
        if self.choice is not None:  # the gate's options and version are part of what was judged
            context += ["choice-gate-1", self.choice.sameness, task.get(self.choice.foils_key)]
        key = JudgeCache.key(self.judge.name, self.rubric, json.dumps(context), answer)
        score = self._cached(key, base, lambda: self._grade(task, task_text, reference, answer))
        if content is None or not score.passed or score.crashed:
            return score
        # the beyond-question pass has its own cache key (what it reads is the content, not the answer): adding it
        # to an env leaves the first pass's kept verdicts valid. Its version names the rules of content_beyond and
        # value_foils: bump it when either changes (the value foils are computed from the key's content and reference)
        assert self.choice is not None and reference is not None
        key2 = JudgeCache.key(self.judge.name, self.rubric, json.dumps(
            [task_text, reference, "beyond-question-1", self.choice.sameness, foils, self.choice.answer_values]),
            content)
        gate = self.choice
        beyond = self._cached(key2, base, lambda: self._beyond(gate, content, reference, foils))
        details = {**score.details, **beyond.details, "cached": bool(score.details.get("cached"))
                   and bool(beyond.details.get("cached"))}
        if beyond.crashed or not beyond.passed:
            if not beyond.crashed:
                details["reason"] = (f"choice gate, beyond the question: picked {details['beyond_picks'][-1]}, not "
                                     "the reference (what the answer adds to the question does not state its fact)")
            return Score(0.0, False, details, crashed=beyond.crashed)
        return Score(score.reward, score.passed, details)

    def _cached(self, key: str, base: dict[str, Any],
                grade: Callable[[], tuple[float, bool, dict[str, Any]]]) -> Score:
        """One judged stage: its kept verdict, or ``grade()`` (kept unless it crashed: a timeout may not recur)."""
        if not getattr(self, "_no_cache", False) and (hit := self.cache.get(key)) is not None:
            self.judge.stats.add(cache_hits=1)
            hit.details["cached"] = True
            if "contract_removed" in base:
                hit.details["contract_removed"] = base["contract_removed"]
            return hit
        try:
            reward, passed, details = grade()
        except Exception as e:  # a format error, a timeout, a backend error: no verdict
            self.judge.stats.add(failures=1)
            kind = getattr(e, "kind", "timeout" if isinstance(e, TimeoutError) else "backend")
            details = {**base, **getattr(e, "details", {}), "judge_failure": kind,
                       "error": f"judge failure ({kind}): {type(e).__name__}: {e}"}
            return Score(0.0, False, details, crashed=True)
        score = Score(reward, passed, {**base, **details, "cached": False})
        self.cache.put(key, score)
        return score

    def _beyond(self, gate: ChoiceGate, content: str, reference: str,
                foils: list[str]) -> tuple[float, bool, dict[str, Any]]:
        if not foils:
            raise JudgeFormatError("unparsable", "the choice gate needs the task's foils")
        grammar = "grammar" in self.judge.params.extra
        held, details = gate.run_beyond(lambda m, d: self.judge.ask(m, self.timeout_s, extra=d), content, reference,
                                        foils, lambda n: {"grammar": choice_grammar(n)} if grammar else None)
        return float(held), held, details

    async def averify(self, task: dict[str, Any], artifacts: dict[str, Any]) -> Score:
        return await asyncio.to_thread(self.verify, task, artifacts)

    def _ask(self, messages: list[dict[str, Any]]) -> tuple[str, str]:
        raw = self.judge.ask(messages, self.timeout_s)
        return raw, prompt_hash(messages)

    def _grade(self, task: dict[str, Any], task_text: str, reference: str | None,
               answer: str) -> tuple[float, bool, dict[str, Any]]:
        """The choice gate (when there is one), then :meth:`_judgment`; an answer the gate stops is not judged."""
        if self.choice is None:
            return self._judgment(task_text, reference, answer)
        if reference is None:
            raise JudgeFormatError("unparsable", "the task row has no reference answer to offer among the choices")
        foils = self.choice.foils(task)
        # a grammar-decoded judge (llama.cpp) gets the choice's grammar instead of the verdict's for these calls
        decoding = ({"grammar": choice_grammar(len(foils) + 2)} if "grammar" in self.judge.params.extra else None)
        held, gate = self.choice.run(lambda m, d: self.judge.ask(m, self.timeout_s, extra=d), answer, reference,
                                     foils, decoding)
        if not held:
            return 0.0, False, {**gate, "reason": f"choice gate: picked {gate['choice_picks'][-1]}, not the "
                                "reference (the judge did not read the reference's fact in the answer)"}
        reward, passed, details = self._judgment(task_text, reference, answer)
        return reward, passed, {**gate, **details}

    def _judgment(self, task_text: str, reference: str | None, answer: str) -> tuple[float, bool, dict[str, Any]]:
        raw, phash = self._ask(score_messages(task_text, self.rubric, reference, answer, self.scale))
        try:
            value = parse_score(raw, self.scale, strict=self.strict)
        except JudgeFormatError as e:
            e.details = {"raw_judgment": raw, "prompt_sha256": phash}  # type: ignore[attr-defined]
            raise
        return value / self.scale, value >= self.pass_score, {
            "prompt_sha256": phash, "raw_judgment": raw, "parsed_score": value, "scale": self.scale}

    def close(self) -> None:
        self.judge.close()


class PairwiseJudgeVerifier(JudgeVerifier):
    """A pairwise judge: the answer against the task's reference, asked in **both orders** (``WINNER: A|B|TIE``).

    Each order counts 1 when the answer is at least as good as the reference. Reward is the mean of the two;
    passed only when both orders say so. Orders that disagree are a position-biased judgment
    (``details["position_consistent"] = False``): it never passes, and admission's ``judge-position-bias`` check
    makes the verifier unfit when too many of its judgments are (``max_position_flips``).
    """

    pairwise = True

    def __init__(self, judge: Any, rubric: str, *, max_position_flips: float = 0.1, **kw: Any):
        super().__init__(judge, rubric, **kw)
        if not self.reference_key:
            raise ValueError("a pairwise judge compares with the reference: give reference_key")
        self.max_position_flips = max_position_flips

    @property
    def claim_line(self) -> str:
        return "WINNER: A\nWINNER: B"

    def _judgment(self, task_text: str, reference: str | None, answer: str) -> tuple[float, bool, dict[str, Any]]:
        if reference is None:
            raise JudgeFormatError("unparsable", "the task row has no reference answer to compare with")
        raws, hashes, winners = [], [], []
        for a, b in ((answer, reference), (reference, answer)):
            raw, phash = self._ask(pair_messages(task_text, self.rubric, a, b))
            raws.append(raw)
            hashes.append(phash)
            try:
                winners.append(parse_winner(raw))
            except JudgeFormatError as e:
                e.details = {"raw_judgment": raws, "prompt_sha256": hashes}  # type: ignore[attr-defined]
                raise
        ok = [winners[0] in ("A", "TIE"), winners[1] in ("B", "TIE")]
        consistent = ok[0] == ok[1]
        return sum(ok) / 2, all(ok), {"prompt_sha256": hashes, "raw_judgment": raws, "winners": winners,
                                      "parsed_score": sum(ok), "position_consistent": consistent}
