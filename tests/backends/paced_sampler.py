"""A test instrument for the vLLM tier: a vLLM logits processor that changes nothing but the engine's pace.

Loaded into a test's server with ``--logits-processors paced_sampler:Paced`` (this folder on the server's
``PYTHONPATH``), it sleeps ``ENVHUB_VLLM_STEP_S`` seconds (default 0.01) in every sampling step and returns the logits
untouched, so the tokens and their logprobs are exactly the unpaced server's (vLLM computes logprobs from the raw
logits before any processor, and this one changes none). Why: a test that must act *inside* one generation (a weight
update) races the tiny model, which samples up to thousands of tokens/s on CPU; paced, a generation of a few hundred
tokens lasts seconds, longer than a busy host takes to answer a poll and send the pause.
"""
from __future__ import annotations

import os
import time

from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor


class Paced(LogitsProcessor):
    """``time.sleep(step_s)`` per sampling step, logits unchanged."""

    def __init__(self, vllm_config, device, is_pin_memory) -> None:
        self.step_s = float(os.environ.get("ENVHUB_VLLM_STEP_S", "0.01"))

    def is_argmax_invariant(self) -> bool:
        return False  # vLLM applies argmax-invariant processors only to sampled (non-greedy) steps: pace every step

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        pass

    def apply(self, logits):
        time.sleep(self.step_s)
        return logits
