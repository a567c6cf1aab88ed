"""LLM judges as verifiers (#30): :class:`JudgeVerifier` (pointwise ``SCORE: N``), :class:`PairwiseJudgeVerifier`
(against the reference, both orders), :class:`JudgeModel` (any envhub backend, deterministic settings) and
:class:`JudgeCache`. Admission's judge checks (attack probes, calibration, position bias) are in
:mod:`envhub.judgeprobes`; ``docs/authoring.md`` ("Judged environments") shows an env using one.

Importing this package loads no torch or transformers: the backend is built when a :class:`JudgeModel` is.
"""
from envhub.judging.engine import JudgeModel, JudgeStats
from envhub.judging.format import JudgeFormatError, parse_score, parse_winner
from envhub.judging.verifier import JudgeCache, JudgeVerifier, PairwiseJudgeVerifier

__all__ = ["JudgeCache", "JudgeFormatError", "JudgeModel", "JudgeStats", "JudgeVerifier", "PairwiseJudgeVerifier",
           "parse_score", "parse_winner"]
