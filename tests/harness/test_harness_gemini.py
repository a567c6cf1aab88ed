"""Gemini CLI (the real pinned binary, Gemini's own API through the gateway) plays swe-gym's hack probes as the
other presets do; its golden and no-op run in test_harness_envs.py with every preset."""
from __future__ import annotations

import json

import pytest
from test_harness_probes import check_probe_episodes

from envhub.harness.presets import PRESETS


def shell_command(function: dict) -> str:
    """The command of one call Gemini CLI issued: always its own ``run_shell_command`` tool."""
    assert function["name"] == "run_shell_command", function
    return json.loads(function["arguments"])["command"]


@pytest.mark.timeout(900)
def test_hack_probes_fail_through_gemini_cli(swe_gym, smollm2_tokenizer):
    """The probes of the Codex test, through Gemini CLI on two tasks (:func:`check_probe_episodes`: every probe
    episode played to the end and graded 0, its commands issued in order as ``run_shell_command`` calls; golden
    passes and no-op fails alongside)."""
    if not PRESETS["gemini-cli"].installed():
        pytest.fail("gemini-cli is not installed: the harness tier needs `make harness-tools` (make test runs it)")
    spec, tasks = swe_gym
    check_probe_episodes(spec, tasks, "gemini-cli", smollm2_tokenizer, shell_command)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("setting", ["auth", "folderTrust"])
def test_without_the_presets_settings_the_golden_fails(swe_gym, smollm2_tokenizer, setting):
    """Break-it: the two settings the preset adds are what makes the golden pass (test_harness_envs.py). Without the
    auth pin Gemini CLI 0.61.0 refuses to start ("Invalid auth method selected.", exit 41); with folder trust on, it
    refuses to run headless in the sandbox's untrusted folder (exit 55)."""
    from test_harness_envs import episode

    from envhub.harness.presets import Preset, _gemini_files, golden_commands

    def files(url, key):
        out = _gemini_files(url, key)
        ((path, text),) = out.items()
        settings = json.loads(text)
        del settings["security"][setting]
        return {path: json.dumps(settings)}

    spec, tasks = swe_gym
    preset = Preset(**{**PRESETS["gemini-cli"].__dict__, "name": f"gemini-cli-no-{setting}", "files": files})
    trajs, _ = episode(spec, tasks[0], preset, golden_commands, smollm2_tokenizer, timeout_s=120)
    (t,) = trajs
    assert t.reward == 0.0 and not t.passed
    code = 41 if setting == "auth" else 55
    assert t.finish_reason == "error" and f"made no model call (exit {code})" in t.error, t.error
