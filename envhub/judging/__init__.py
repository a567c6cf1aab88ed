"""LLM judges as verifiers (#30): :class:`JudgeVerifier` (pointwise ``SCORE: N``), :class:`PairwiseJudgeVerifier`
(against the reference, both orders), :class:`JudgeModel` (any envhub backend, deterministic settings) and
:class:`JudgeCache`; an :class:`AnswerContract` bounds what the judge reads, a :class:`ChoiceGate` makes it say which
fact an answer states before it scores. Admission's judge checks (attack probes, calibration, position bias) are in
:mod:`envhub.judgeprobes`; ``docs/authoring.md`` ("Judged environments") shows an env using one.

Importing this package loads no torch or transformers: the backend is built when a :class:`JudgeModel` is.
"""
from envhub.judging.choice import ChoiceGate
from envhub.judging.contract import AnswerContract
from envhub.judging.engine import JudgeModel, JudgeStats
from envhub.judging.format import JudgeFormatError, parse_score, parse_winner
from envhub.judging.verifier import JudgeCache, JudgeVerifier, PairwiseJudgeVerifier

__all__ = ["AnswerContract", "ChoiceGate", "JudgeCache", "JudgeFormatError", "JudgeModel", "JudgeStats", "JudgeVerifier",
           "PairwiseJudgeVerifier", "parse_score", "parse_winner"]
