"""Gemini CLI (the real pinned binary, Gemini's own API through the gateway) plays swe-gym's hack probes as the
other presets do; its golden and no-op run in test_harness_envs.py with every preset."""
from __future__ import annotations

import json

import pytest
from test_harness_probes import PROBES

from envhub.harness.presets import PRESETS
from envhub.harness.probes import hack_plays


@pytest.mark.timeout(900)
def test_hack_probes_fail_through_gemini_cli(swe_gym, smollm2_tokenizer):
    """The probes of the Codex test, through Gemini CLI on two tasks: every probe episode is played to the end (one
    model call per probe command, then the ending; the CLI exits 0), graded 0, its commands issued in order as
    ``run_shell_command`` calls; golden passes and no-op fails alongside."""
    from envhub.cli.harness import validate_report

    if not PRESETS["gemini-cli"].installed():
        pytest.fail("gemini-cli is not installed: the harness tier needs `make harness-tools` (make test runs it)")
    spec, tasks = swe_gym
    report = validate_report(spec, "gemini-cli", n=2, tokenizer=smollm2_tokenizer, probes=PROBES)
    assert report["fit"] and report["problems"] == [] and report["skipped"] == [], report["problems"]
    rows = report["rows"]
    hacks = [r for r in rows if r["play"].startswith("hack:")]
    assert sorted({r["play"] for r in hacks}) == [f"hack:{p}" for p in PROBES] and len(hacks) == 2 * len(PROBES)
    plays = {str(t["task_id"]): hack_plays(spec, t) for t in tasks[:2]}
    for r in hacks:
        assert r["played"] and r["reward"] == 0.0 and not r["passed"] and r["ok"], r
        cmds = plays[str(r["task_id"])][r["play"][5:]]
        assert r["calls"] == len(cmds) + 1
        (t, *_) = r["trajectories"]
        issued = [c["function"] for m in t.messages if m.get("role") == "assistant" for c in m.get("tool_calls") or []]
        assert {c["name"] for c in issued} == {"run_shell_command"}
        assert [json.loads(c["arguments"])["command"] for c in issued] == cmds
    assert [r["reward"] for r in rows if r["play"] == "golden"] == [1.0, 1.0]
    assert [r["reward"] for r in rows if r["play"] == "noop"] == [0.0, 0.0]


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
