"""`envhub rollout` as a user meets it: a run directory that is never silently replaced and survives Ctrl-C,
bounded episodes, honest exit codes, one-line input errors, `check-trajectory` and `envhub show` from the run's
metadata. Real CLI processes, real test plugins installed as distributions, real bwrap sandboxes, real signals."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from helpers import ROOT, make_dist, run_cli

PLUGINS = '''
import os, time
import envhub
from envhub import EnvSpec, Response, TextEnv, ToolEnv
from envhub.policy import call, finish, turns_taken

STEP_S = float(os.environ.get("J14_STEP_S", "0"))


class Slow(TextEnv):
    """Each reply takes STEP_S seconds (in a worker thread: a blocking env)."""
    def start(self, task): return "say ok"
    def respond(self, action):
        time.sleep(STEP_S)
        return Response(done=True, artifacts={"answer": action.text})


class Hangs(TextEnv):
    """A verifier-side hang: the env never answers."""
    def start(self, task): return "say ok"
    def respond(self, action):
        time.sleep(3600)


class Broken(TextEnv):
    def start(self, task): raise RuntimeError("this env cannot start")
    def respond(self, action): return Response(done=True)


class Sandboxed(ToolEnv):
    """A python tool in a real bwrap sandbox; close() is slow (a cleanup that a second Ctrl-C must not wait for)."""
    def make_tools(self):
        from envhub.tools import finish_tool, python_tool
        return [python_tool(), finish_tool("finish")]
    def sandbox_spec_for(self, task):
        from envhub.sandbox import SandboxSpec
        return SandboxSpec(workspace_size_mb=16, memory_mb=512, timeout_s=600.0)
    def start(self, task): return "compute"
    def close(self):
        if os.environ.get("J14_SLOW_CLOSE"):
            time.sleep(3600)
        super().close()


def sleepy(task, messages):
    if turns_taken(messages) == 0:
        return call("python", code="import time; time.sleep(600)")
    return finish("1")


TASKS = lambda split: [{"task_id": f"t{i}"} for i in range(12)]
ok = lambda t, a: a.get("answer") == "ok"


@envhub.hookimpl
def envhub_register(registry):
    for name, env in (("slow-env", Slow), ("hang-env", Hangs), ("broken-env", Broken)):
        registry.register(EnvSpec(id=name, env=env, tasks=TASKS, verifier=ok, golden=lambda t, m: "ok"))
    registry.register(EnvSpec(id="sandbox-env", env=Sandboxed, tasks=TASKS, verifier=lambda t, a: True,
                              golden=sleepy))
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    site = tmp_path_factory.mktemp("site")
    make_dist(site, "j14-test-plugins", {"slow-env": "j14_plugins"}, {"j14_plugins": PLUGINS})
    return site


@pytest.fixture
def sandbox_dir():
    d = tempfile.mkdtemp(prefix="ehj14-", dir="/tmp")  # short: a Unix socket path must fit in 107 bytes
    yield d
    shutil.rmtree(d, ignore_errors=True)


def rollout(*args, site=None, timeout=300, env=None):
    extra = dict(env or {})
    old = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        return run_cli("rollout", *args, site=site, timeout=timeout)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


def lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_run_dir_is_refused_resumed_or_overwritten_and_carries_its_metadata(tmp_path):
    run = tmp_path / "run"
    r = rollout("guess-number", "--tokenizer", "tiny", "-n", "2", "--samples", "2", "--out", str(run))
    assert r.returncode == 0, r.stdout + r.stderr
    meta = json.loads((run / "run.json").read_text())
    assert meta["model"] == "golden" and meta["tokenizer"] == "tiny" and meta["sampling"]["temperature"] == 1.0
    assert meta["envs"][0]["id"] == "guess-number" and meta["envs"][0]["version"]
    assert meta["envs"][0]["registry_sha256"], meta["envs"][0]  # tied to the hub entry of that version
    assert meta["summary"]["rollouts"] == 4 and "rollout" in meta["command"] and meta["interrupted"] is False
    before = (run / "trajectories.jsonl").read_text()

    r = rollout("guess-number", "--tokenizer", "tiny", "-n", "1", "--out", str(run))
    assert r.returncode == 2 and "--resume" in r.stderr and "--overwrite" in r.stderr, r.stdout + r.stderr
    assert (run / "trajectories.jsonl").read_text() == before  # refused: nothing touched

    r = rollout("guess-number", "--tokenizer", "tiny", "-n", "3", "--samples", "2", "--out", str(run), "--resume")
    assert r.returncode == 0 and "(4 already there)" in r.stdout, r.stdout + r.stderr
    got = lines(run)
    assert (run / "trajectories.jsonl").read_text().startswith(before)  # appended, never rewritten
    assert sorted((d["task_id"], d["details"]["sample"]) for d in got) == sorted(
        {(d["task_id"], d["details"]["sample"]) for d in got})  # no rollout twice
    assert len(got) == 6

    r = rollout("guess-number", "--tokenizer", "tiny", "-n", "3", "--temperature", "0.5", "--out", str(run),
                "--resume")
    assert r.returncode == 2 and "not the same run" in r.stderr and "temperature" in r.stderr, r.stderr

    r = run_cli("check-trajectory", str(run))  # no --tokenizer: the run names its own
    assert r.returncode == 0 and "all trajectories faithful (tokenizer tiny)" in r.stdout, r.stdout + r.stderr
    r = run_cli("show", str(run), "--index", "1")
    assert r.returncode == 0, r.stderr
    assert "assistant" in r.stdout and "Correct!" in r.stdout and "reward 1.000 (passed)" in r.stdout
    r = run_cli("show", str(run), "--index", "99")
    assert r.returncode == 1 and "out of range" in r.stderr

    r = rollout("guess-number", "--tokenizer", "tiny", "-n", "1", "--out", str(run), "--overwrite")
    assert r.returncode == 0 and len(lines(run)) == 1, r.stdout + r.stderr


@pytest.mark.slow
def test_out_never_replaces_a_directory_that_is_not_a_run(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    r = rollout("guess-number", "--tokenizer", "tiny", "-n", "1", "--out", str(tmp_path), "--overwrite")
    assert r.returncode == 2 and "not an envhub run" in r.stderr
    assert (tmp_path / "notes.txt").read_text() == "mine"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("args, says", [
    (["-n", "-3"], "-3 is not in the range"),
    (["-n", "0"], "0 is not in the range"),
    (["--samples", "0"], "0 is not in the range"),
    (["--model", "gpt-5"], "'gpt-5' is not a model envhub can run"),
    (["--env-args", "[1]"], "must be a JSON object"),
])
def test_bad_input_is_one_line_before_anything_runs(args, says):
    r = rollout("guess-number", *args)
    assert r.returncode == 2 and says in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and "rollouts" not in r.stdout


@pytest.mark.slow
def test_unreachable_backend_fails_preflight_in_one_line():
    r = rollout("guess-number", "--model", f"http://127.0.0.1:{_closed_port()}", "--tokenizer", "tiny")
    assert r.returncode == 1 and "is not usable" in r.stderr and "cannot reach" in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_errored_rollouts_exit_nonzero_unless_under_max_errors(site):
    r = rollout("broken-env", "--tokenizer", "tiny", "-n", "2", site=site)
    assert r.returncode == 1 and "error=2" in r.stdout and "2 of 2 rollouts failed" in r.stdout, r.stdout + r.stderr
    r = rollout("broken-env", "--tokenizer", "tiny", "-n", "2", "--max-errors", "2", site=site)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_a_hanging_env_is_a_timeout_per_task_and_the_cli_returns(site, tmp_path):
    t0 = time.monotonic()
    r = rollout("hang-env", "--tokenizer", "tiny", "-n", "3", "--timeout", "2", "--out", str(tmp_path / "r"),
                site=site, timeout=120)
    assert r.returncode == 1 and "timeout=3" in r.stdout, r.stdout + r.stderr
    assert time.monotonic() - t0 < 100  # generous: the point is that it returns at all
    assert [d["finish_reason"] for d in lines(tmp_path / "r")] == ["timeout"] * 3


def _popen(args, site, extra_env):
    env = dict(os.environ, PYTHONPATH=f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **extra_env)
    code = f"import sys; sys.argv = ['envhub', *{list(args)!r}]; from envhub.cli import main; main()"
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _wait_for(cond, timeout=120.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.1)
    return False


@pytest.mark.slow
def test_ctrl_c_keeps_every_finished_rollout_and_resume_completes_the_run(site, tmp_path):
    run = tmp_path / "run"
    args = ["rollout", "slow-env", "--tokenizer", "tiny", "-n", "12", "-c", "2", "--out", str(run)]
    proc = _popen(args, site, {"J14_STEP_S": "1.0"})
    jsonl = run / "trajectories.jsonl"
    assert _wait_for(lambda: jsonl.exists() and len(jsonl.read_text().splitlines()) >= 2), proc.communicate()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "interrupted" in out and "Traceback" not in out
    kept = lines(run)  # every line is a whole trajectory
    assert 2 <= len(kept) < 12 and all(d["finish_reason"] == "done" for d in kept)
    meta = json.loads((run / "run.json").read_text())
    assert meta["interrupted"] is True and meta["summary"]["rollouts"] == len(kept)
    r = rollout(*args[1:], "--resume", site=site, env={"J14_STEP_S": "0"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(d["task_id"] for d in lines(run)) == sorted(f"t{i}" for i in range(12))


def _bwrap_children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                    out.append(int(entry))
            except (OSError, ValueError):
                pass
    return out


@pytest.mark.slow
def test_second_ctrl_c_exits_at_once_with_no_sandbox_left(site, tmp_path, sandbox_dir):
    args = ["rollout", "sandbox-env", "--tokenizer", "tiny", "-n", "2", "-c", "2", "--out", str(tmp_path / "r")]
    proc = _popen(args, site, {"ENVHUB_SANDBOX_DIR": sandbox_dir, "J14_SLOW_CLOSE": "1"})
    live = lambda: [d for d in os.listdir(sandbox_dir) if not d.startswith(".")]  # noqa: E731
    assert _wait_for(lambda: len(live()) == 2 and _bwrap_children(proc.pid)), proc.communicate()
    time.sleep(1.0)  # both episodes are inside their sleeping python call
    proc.send_signal(signal.SIGINT)
    time.sleep(2.0)
    assert proc.poll() is None  # the first Ctrl-C is waiting on the (deliberately hung) cleanup
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 130 and "exiting now" in out, out
    assert live() == [], live()
    assert _wait_for(lambda: not any("bwrap" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
                                     for p in os.listdir("/proc") if p.isdigit() and _safe_has(p, sandbox_dir)),
                     timeout=10)


def _safe_has(pid: str, text: str) -> bool:
    try:
        return text in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
