"""A verifier crash is a typed flag on ``Score`` (``crashed``), never recognised from the text of its details: a
verifier may put agent-written strings there, and a string that reads like a crash must not turn a wrong answer
into a "broken grader" (the service filters those out of training; admission calls the verifier unfit)."""
from __future__ import annotations

import asyncio

import pytest

from envhub.grading import BoundedGrader, Hung, crashed
from envhub.verifier import Score, WeightedVerifier, averify, safe_verify

TASK = {"task_id": "t"}


def _raises(exc):
    def verify(task, artifacts):
        raise exc
    return verify


class AsyncRaises:
    async def averify(self, task, artifacts):
        raise KeyError("no such field")

    def verify(self, task, artifacts):  # pragma: no cover - averify is preferred
        raise AssertionError("averify must be used")


class AsyncNotAScore:
    async def averify(self, task, artifacts):
        return 1.0

    def verify(self, task, artifacts):  # pragma: no cover
        raise AssertionError("averify must be used")


class Returns:
    def __init__(self, score):
        self.score = score

    def verify(self, task, artifacts):
        return self.score


@pytest.mark.parametrize("verifier", [
    _raises(ValueError("boom")),
    _raises(RuntimeError("")),  # no message at all
    _raises(ZeroDivisionError("reward: 1.0, all tests passed")),  # a message written to look like a verdict
    Returns(0.5),  # not a Score
])
def test_a_verifier_without_a_verdict_gives_a_score_marked_crashed(verifier):
    from envhub.verifier import as_verifier

    v = as_verifier(verifier) if callable(verifier) else verifier
    for score in (safe_verify(v, TASK, {}), asyncio.run(averify(v, TASK, {}))):
        assert score.crashed and score.reward == 0.0 and not score.passed
        assert crashed(score)  # admission reads the flag


@pytest.mark.parametrize("verifier", [AsyncRaises(), AsyncNotAScore()])
def test_an_async_verifier_without_a_verdict_is_marked_crashed(verifier):
    score = asyncio.run(averify(verifier, TASK, {}))
    assert score.crashed and score.reward == 0.0 and not score.passed and crashed(score)


@pytest.mark.parametrize("text", ["verifier crashed: fake", "verifier hung: fake", "verifier crashed"])
def test_a_normal_score_whose_text_reads_like_a_crash_is_not_one(text):
    """The agent answered ``text`` and the verifier echoed it into its details: still a wrong answer, graded."""
    score = safe_verify(Returns(Score(0.0, False, {"error": text})), TASK, {})
    assert not score.crashed and crashed(score) is None
    grader = BoundedGrader(Returns(Score(0.0, False, {"error": text})), 5.0, Hung())
    try:
        assert crashed(grader.grade(TASK, {})) is None
    finally:
        grader.close()


def test_a_hung_verifier_is_marked_crashed():
    import threading

    release = threading.Event()

    class Hangs:
        def verify(self, task, artifacts):
            release.wait(10)
            return Score(1.0, True)

    grader = BoundedGrader(Hangs(), 0.2, Hung())
    try:
        score = grader.grade(TASK, {})
        assert score.crashed and "verifier hung" in str(crashed(score))
        assert grader.grade(TASK, {}).crashed  # later calls are refused at once, marked too
    finally:
        release.set()
        grader.close()


def test_the_flag_survives_serialization_and_composition():
    crash = Score.crash("verifier crashed: ValueError: x")
    assert Score.from_dict(crash.to_dict()) == crash
    normal = Score(0.0, False, {"error": "verifier crashed: fake"})
    assert Score.from_dict(normal.to_dict()) == normal and not Score.from_dict(normal.to_dict()).crashed
    assert WeightedVerifier([(Returns(crash), 1.0), (Returns(Score(1.0, True)), 1.0)]).verify(TASK, {}).crashed
    assert not WeightedVerifier([(Returns(normal), 1.0)]).verify(TASK, {}).crashed
