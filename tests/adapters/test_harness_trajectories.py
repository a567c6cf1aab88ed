"""A real harness episode — Codex CLI solving a swe-gym task with the golden, in bwrap, its model calls through the
gateway — trained by both adapters' real classes: OpenRLHF gets one action range per model call of the main chain
(at the tokens the backend sampled), veRL the same positions in its response mask, both with the verifier's reward.
(The harness tier runs the episodes; this is the same episode handed to the trainers.)"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.trainers
pytest.importorskip("openrlhf", reason="needs the trainers venv (make test-trainers)")
sys.path.insert(0, str(Path(__file__).parent.parent / "gateway"))

from gw_helpers import Recording  # noqa: E402


def test_a_codex_episode_trains_exactly_its_sampled_tokens_in_both_adapters():
    import envhub
    from envhub.backends.scripted import ScriptedBackend
    from envhub.cli.common import default_tokenizer
    from envhub.gateway import Gateway
    from envhub.harness.episode import HarnessRunner
    from envhub.harness.presets import get_preset, golden_commands, scripted
    from envhub.testing.models import load_tokenizer, resolve_model
    from envhub_openrlhf.executor import to_openrlhf_output
    from envhub_verl.agent_loop import to_agent_loop_output
    from helpers import bwrap_why_not
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

    why = bwrap_why_not()
    if why:
        pytest.skip(why)
    preset = get_preset("codex")
    if not preset.installed():
        pytest.skip("codex is not installed: `make harness-tools` (make test runs the harness tier, which installs "
                    "it, before this one)")
    spec = envhub.get_spec("swe-gym")
    task = dict(spec.load_tasks()[0])
    backend = Recording(ScriptedBackend(scripted(preset, golden_commands)))
    with HarnessRunner(Gateway(backend, load_tokenizer(resolve_model(default_tokenizer())))) as runner:
        (t,) = runner.run(spec, preset, task, timeout_s=180)
    assert t.reward == 1.0 and t.passed and t.details["chain_role"] == "main", t.details.get("harness_exit")
    p = len(t.prompt_ids)
    spans = [(len(prompt) - p, len(prompt) - p + len(gen.token_ids)) for prompt, gen in backend.calls]
    assert len(spans) == t.num_turns == 2
    sampled = [i for a, b in spans for i in range(a, b)]
    assert [t.response_ids[i] for i in sampled] == [x for _, g in backend.calls for x in g.token_ids]

    out = to_openrlhf_output(t, prompt=task["task_id"], label="")
    assert out["action_ranges"] == [(a + p, b + p) for a, b in spans] and out["reward"] == 1.0
    generator = SamplesGenerator.__new__(SamplesGenerator)  # the method reads only its arguments
    experience = generator._process_response_into_experience(out, max_len=p + len(t.response_ids) + 8)  # Codex's
    assert experience.action_mask.sum() == len(sampled)  # ~18k-token prompt would not fit the tiny tests' max_len
    v = to_agent_loop_output(t, t.prompt_ids, with_logprobs=True)
    assert [i for i, m in enumerate(v.response_mask) if m] == sampled and v.reward_score == 1.0
