"""#28 item 8, the CLI's rough edges, each where a user meets it: a missing optional package names its extra, every
check that needs no model runs before the weights load (--split, --out, --tokenizer), a malformed trajectory file
names its line, and Ctrl-C during start-up is never lost and always exits 130.

In-process (click's CliRunner) where the command ends before any rollout runs; real subprocesses where the
interpreter matters (a package hidden from the import system, real signals). The "broken weights" model is the
tiny model's directory with its weights file replaced by garbage: any command that loaded it first would fail on it,
so a test that gets the other error shows the order."""
from __future__ import annotations

import asyncio
import json
import shutil
import signal

import pytest
from click.testing import CliRunner

import envhub
from envhub.cli import main
from helpers import make_dist, run_cli, run_py


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def broken_model(tmp_path_factory):
    from envhub.testing.models import build_tiny_model

    src = build_tiny_model(template="chatml")
    out = tmp_path_factory.mktemp("broken") / "model"
    shutil.copytree(src, out)
    for weights in out.glob("*.safetensors"):
        weights.write_bytes(b"not weights")
    return out


def test_broken_model_really_fails_to_load(broken_model):
    """The premise of the order tests below: loading this model is an error (about the model)."""
    r = invoke("rollout", "countdown", "--model", str(broken_model), "-n", "1")
    assert r.exit_code == 1 and f"cannot load --model {broken_model}" in r.output, r.output


# ---- a missing optional package ----------------------------------------------------------------------------------
HIDE = """
import importlib.machinery, importlib.util, sys
HIDDEN = {"transformers", "torch", "tokenizers"}  # what `pip install envhub` (no extra) does not install


class Hidden(importlib.machinery.PathFinder):  # the path finder, blind to the hidden packages: as if uninstalled
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            return None
        return importlib.machinery.PathFinder.find_spec(name, path, target)


sys.meta_path[sys.meta_path.index(importlib.machinery.PathFinder)] = Hidden
assert all(importlib.util.find_spec(m) is None for m in HIDDEN)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("model", ["golden", "tiny"])
def test_without_transformers_the_error_names_the_extra(model):
    args = ["rollout", "countdown", "--model", model, "-n", "1"]
    r = run_py(HIDE + f"sys.argv = ['envhub', *{args!r}]\nfrom envhub.cli import main\nmain()\n", timeout=100)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "pip install 'envhub[hf]'" in r.stderr and "is not installed" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


# ---- checks before the weights load ------------------------------------------------------------------------------
def test_an_unknown_split_lists_the_splits_before_the_model_loads(broken_model):
    r = invoke("rollout", "countdown", "--model", str(broken_model), "--split", "nope")
    assert r.exit_code == 2, r.output
    assert "countdown has no split 'nope'; its splits: test, train" in r.output, r.output


def test_an_env_that_names_its_splits_itself_is_quoted(broken_model):
    r = invoke("rollout", "math-python", "--model", str(broken_model), "--split", "nope")
    assert r.exit_code == 2 and "math-python has no split 'nope'; known splits: test, train" in r.output, r.output
    assert "Traceback" not in r.output


def test_an_existing_out_is_reported_before_the_model_loads(broken_model, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"envhub_run": 1, "env_id": "countdown", "model": "golden"}))
    (run / "trajectories.jsonl").write_text("")
    r = invoke("rollout", "countdown", "--model", str(broken_model), "--out", str(run))
    assert r.exit_code == 2 and "already holds a run" in r.output, r.output
    r = invoke("rollout", "countdown", "--model", str(broken_model), "--out", str(run), "--resume")
    assert r.exit_code == 2 and "not the same run" in r.output and "model: run has 'golden'" in r.output, r.output
    assert json.loads((run / "run.json").read_text()) == {"envhub_run": 1, "env_id": "countdown", "model": "golden"}


def test_a_run_directory_is_written_only_once_the_model_loaded(broken_model, tmp_path):
    r = invoke("rollout", "countdown", "--model", str(broken_model), "--out", str(tmp_path / "new"))
    assert r.exit_code == 1 and "cannot load --model" in r.output, r.output
    assert not (tmp_path / "new").exists()  # no half-made run left to refuse the next try


@pytest.mark.parametrize("model", ["golden", "broken"])
def test_a_bogus_tokenizer_is_blamed_not_the_model(model, broken_model):
    r = invoke("rollout", "countdown", "--model", str(broken_model) if model == "broken" else model,
               "--tokenizer", "bogus", "-n", "1")
    assert r.exit_code == 1, r.output
    assert "cannot load --tokenizer bogus: no such directory" in r.output, r.output
    assert "--model" not in r.output and "unknown model" not in r.output, r.output


# ---- check-trajectory on a malformed file ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good_line(tiny_tokenizer):
    from envhub.backends.scripted import ScriptedBackend
    from envhub.rollout.executor import rollout_many
    from envhub.task import select

    spec = envhub.get_spec("countdown")
    (traj,) = asyncio.run(rollout_many(spec, select(spec.load_tasks(), n=1), ScriptedBackend(spec.golden),
                                       tiny_tokenizer))
    return traj.to_json()


@pytest.mark.parametrize("bad, says", [
    ('{"task_id": "a", "reward": 1', "t.jsonl:4: not valid JSON"),
    ('[1, 2]', "t.jsonl:4: a trajectory is a JSON object, got list"),
    ('{"a": 1}', "t.jsonl:4: not a trajectory (no env_id and no task_id; keys: a)"),
    ('{"env_id": "e", "task_id": "t", "finish_reason": "exploded"}', "t.jsonl:4: not a trajectory (ValueError"),
    ('{"env_id": "e", "task_id": "t", "response_mask": null}', "t.jsonl:4: response_mask must be a list of numbers"),
    ('{"env_id": "e", "task_id": "t", "messages": "hi"}', "t.jsonl:4: not a trajectory (JSONDecodeError"),
])
def test_check_trajectory_names_the_line_of_a_malformed_row(tmp_path, good_line, bad, says):
    f = tmp_path / "t.jsonl"
    f.write_text(f"{good_line}\n\n{good_line}\n{bad}\n{good_line}\n")  # a blank line: lines, not rows, are counted
    r = invoke("check-trajectory", str(f), "--tokenizer", "tiny")
    assert r.exit_code == 1 and f"Error: {f.parent}/{says}" in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)


def test_check_trajectory_blames_the_tokenizer(tmp_path, good_line):
    (tmp_path / "t.jsonl").write_text(good_line + "\n")
    r = invoke("check-trajectory", str(tmp_path / "t.jsonl"), "--tokenizer", "bogus")
    assert r.exit_code == 1 and "cannot load --tokenizer bogus" in r.output, r.output


# ---- Ctrl-C during start-up ----------------------------------------------------------------------------------------
PLUGIN = """
import os, signal, time
import envhub
from envhub import EnvSpec, Response, TextEnv


class Env(TextEnv):
    blocking = False
    def start(self, task): return "say ok"
    def respond(self, action): return Response(done=True, artifacts={"answer": action.text})


def tasks(split):
    # start-up work that meets a Ctrl-C: "raise" lets the KeyboardInterrupt through, "swallow" is a library that
    # catches BaseException (the interrupt is gone as far as Python's exceptions go)
    mode = os.environ.get("J28_SIGINT")
    if mode:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except BaseException:
            if mode != "swallow":
                raise
    return [{"task_id": f"t{i}"} for i in range(3)]


@envhub.hookimpl
def envhub_register(registry):
    registry.register(EnvSpec(id="ctrl-c-env", env=Env, tasks=tasks, verifier=lambda t, a: a["answer"] == "ok",
                              golden=lambda t, m: "ok"))
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    make_dist(site, "j28-ctrl-c", {"ctrl-c-env": "j28_ctrl_c"}, {"j28_ctrl_c": PLUGIN})
    return site


# a bound on hanging, not a speed: start-up with torch and transformers takes 5-90 s on a loaded 2-core machine
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["raise", "swallow"])
@pytest.mark.slow
def test_ctrl_c_during_start_up_exits_130_and_runs_nothing(site, tmp_path, monkeypatch, mode):
    monkeypatch.setenv("J28_SIGINT", mode)
    run = tmp_path / "run"
    r = run_cli("rollout", "ctrl-c-env", "--tokenizer", "tiny", "-n", "3", "--out", str(run), site=site, timeout=240)
    assert r.returncode == 130, r.stdout + r.stderr
    assert "interrupted" in r.stdout + r.stderr and "Aborted" not in r.stderr and "Traceback" not in r.stderr
    kept = (run / "trajectories.jsonl").read_text().splitlines() if run.exists() else []
    assert kept == [], kept  # no rollout ran after the Ctrl-C


@pytest.mark.slow
def test_the_plugin_runs_when_nobody_presses_ctrl_c(site):
    r = run_cli("rollout", "ctrl-c-env", "--tokenizer", "tiny", "-n", "3", site=site, timeout=240)
    assert r.returncode == 0 and "done=3" in r.stdout, r.stdout + r.stderr


def test_ctrl_c_in_the_loops_last_iteration_is_not_dropped(tiny_tokenizer):
    """A SIGINT whose callback the event loop queued in the iteration that stopped it (here: raised by the
    backend's close, the last thing the run awaits) still ends the run with 130."""
    from envhub.backends.base import SamplingParams
    from envhub.backends.scripted import ScriptedBackend
    from envhub.cli.runner import Run
    from envhub.rollout.request import RolloutConfig

    class CtrlCOnClose(ScriptedBackend):
        async def close(self) -> None:
            signal.raise_signal(signal.SIGINT)

    spec = envhub.get_spec("countdown")
    config = RolloutConfig(max_length=4096, sampling=SamplingParams(max_tokens=64, seed=0))
    run = Run(spec, CtrlCOnClose(spec.golden), tiny_tokenizer, n=1, samples=1, concurrency=1, config=config,
              show_progress=False)
    assert run.execute(handle_sigint=True) == 130
    assert run.interrupts == 1 and len(run.finished) == 1  # the finished rollout is kept


# ---- resuming after a kill mid-write --------------------------------------------------------------------------------
@pytest.mark.slow
def test_resume_after_a_partial_last_line_loses_no_rollout(tmp_path):
    run = tmp_path / "run"
    r = run_cli("rollout", "guess-number", "--tokenizer", "tiny", "-n", "2", "--out", str(run), timeout=200)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = (run / "trajectories.jsonl").read_text().splitlines()
    (run / "trajectories.jsonl").write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # killed mid-write
    r = run_cli("rollout", "guess-number", "--tokenizer", "tiny", "-n", "2", "--out", str(run), "--resume",
                timeout=200)
    assert r.returncode == 0 and "(1 already there)" in r.stdout, r.stdout + r.stderr
    rows = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]  # every line whole
    assert sorted(d["task_id"] for d in rows) == sorted(json.loads(x)["task_id"] for x in lines)

