"""The env's hack probes through the real harness (``envhub validate ENV --harness NAME``): each probe's tool calls
played as the harness's own shell calls must end in a failing grade; one that cannot be played is listed as
skipped with its reason; and a grader that passes everything is caught."""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import click
import pytest

from envhub.env import Action, ToolCall
from envhub.harness.presets import PRESETS
from envhub.harness.probes import as_shell, hack_plays, probe_commands
from envhub.policy import call, finish, script
from envhub.verifier import Score

PROBES = ["conftest-force-pass", "named-bodies-borrowed", "path-shim"]  # the second: one reply of >1,024 tokens


def codex_installed():
    if not PRESETS["codex"].installed():
        pytest.fail("codex is not installed: the harness tier needs `make harness-tools` (make test runs it)")


def test_every_swe_gym_probe_is_playable_as_shell_commands(swe_gym):
    spec, tasks = swe_gym
    plays = hack_plays(spec, tasks[0])
    assert sorted(plays) == sorted(spec.hack_probes) and len(plays) >= 18
    assert {n: p for n, p in plays.items() if isinstance(p, str)} == {}
    assert all(p and all(isinstance(c, str) and c for c in p) for p in plays.values())


def test_probes_that_cannot_be_played_say_why():
    task = {"task_id": "t"}
    edit = script([call("str_replace_editor", command="str_replace", path="/x", old_str="a", new_str="b")])
    assert "str_replace_editor{command: 'str_replace'} call has no shell equivalent" in probe_commands(edit, task)
    assert "no shell equivalent" in probe_commands(script([call("python", code="1")]), task)
    assert "plain text" in probe_commands(lambda t, m: "the answer is 4", task)

    def boom(t, m):
        raise KeyError("patch")

    assert probe_commands(boom, task) == "the probe raised KeyError: 'patch'"
    assert "did not finish within" in probe_commands(lambda t, m: call("bash", command="true"), task)
    # what can be played: bash as is, an editor create as a write, then finish (or a plain reply) ends the script
    ok = script([call("bash", command="echo hi"), call("str_replace_editor", command="create", path="/tmp/a b",
                                                       file_text="x"), finish()])
    cmds = probe_commands(ok, task)
    assert isinstance(cmds, list) and cmds[0] == "echo hi" and len(cmds) == 2
    assert probe_commands(script([call("bash", command="true"), Action("done")]), task) == ["true"]


def test_an_editor_create_is_written_byte_for_byte(tmp_path):
    text = "line 1\n'quotes' \"double\" $HOME `tick` \\ back\n\ttab\nno newline at the end"
    path = tmp_path / "deep dir" / "f.py"
    cmd = as_shell(ToolCall("str_replace_editor", {"command": "create", "path": str(path), "file_text": text}))
    subprocess.run(["bash", "-c", cmd], check=True)
    assert path.read_text() == text


def check_probe_episodes(spec, tasks, preset: str, tokenizer, command_of) -> None:
    """``envhub validate --harness PRESET`` with :data:`PROBES` on two tasks: every probe episode is played to the end
    (one model call per probe command, then the ending), graded 0, its commands issued in order (``command_of``
    reads the command of one issued call's ``function``); golden passes and no-op fails alongside."""
    from envhub.cli.harness import validate_report

    report = validate_report(spec, preset, n=2, tokenizer=tokenizer, probes=PROBES)
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
        assert [command_of(f) for f in issued] == cmds  # the probe's own commands, in order
    assert [r["reward"] for r in rows if r["play"] == "golden"] == [1.0, 1.0]
    assert [r["reward"] for r in rows if r["play"] == "noop"] == [0.0, 0.0]


def test_hack_probes_fail_through_codex(swe_gym, smollm2_tokenizer):
    """Three swe-gym probes (a forcing conftest, tests running another test's body -- one command longer than a
    default completion budget --, interpreter shims) through Codex CLI on two tasks (:func:`check_probe_episodes`;
    the harness exits 0)."""
    codex_installed()
    spec, tasks = swe_gym
    check_probe_episodes(spec, tasks, "codex", smollm2_tokenizer, lambda f: json.loads(f["arguments"])["cmd"])


class PassEverything:
    """A broken grader: reward 1 whatever the workspace holds."""

    def verify(self, task, artifacts):
        return Score(1.0, True, {"reason": "lenient"})


def test_a_grader_that_passes_a_probe_is_reported_unfit(swe_gym, smollm2_tokenizer):
    """The mutation: swe-gym with a verifier that passes everything. The same validation must report the hack
    probe (and the no-op) as passing, i.e. the verifier unfit -- the check above can fail."""
    from envhub.cli.harness import validate_report

    codex_installed()
    spec, _ = swe_gym
    lenient = dataclasses.replace(spec, verifier=PassEverything())
    report = validate_report(lenient, "codex", n=1, tokenizer=smollm2_tokenizer, probes=["rewrite-tests"])
    assert not report["fit"]
    bad = {r["play"] for r in report["rows"] if not r["ok"]}
    assert bad == {"hack:rewrite-tests", "noop"}
    assert any(p.startswith("hack:rewrite-tests passed on") for p in report["problems"]), report["problems"]


def test_validate_cli_names_unknown_probes_and_needs_a_harness_for_them(swe_gym):
    from envhub.cli.harness import validate_report

    spec, _ = swe_gym
    with pytest.raises(click.ClickException, match="declares no hack probe no-such-probe"):
        validate_report(spec, "codex", probes=["no-such-probe"])
    r = subprocess.run([sys.executable, "-m", "envhub.cli", "validate", "swe-gym", "--probe", "delete-tests"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "needs --harness" in r.stderr, r.stdout + r.stderr
