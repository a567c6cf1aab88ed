"""Unmodified agent CLIs (Codex CLI, Claude Code, mini-swe-agent, Qwen Code, opencode) on swe-gym, in bwrap, their model calls through the
gateway: the golden played as each harness's own tool calls solves the task (reward 1, one main chain, every token
exact), the no-op does not; and every way an episode goes wrong ends marked, with nothing left running."""
from __future__ import annotations

import json
import time

import psutil
import pytest
from gw_helpers import Recording, invariant_problems

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway
from envhub.harness.episode import HarnessRunner
from envhub.rollout.fidelity import check_trajectory
from envhub.harness.presets import (HARNESS_DIR, PRESETS, HarnessNotInstalled, Preset, get_preset, golden_commands,
                                    noop_commands, scripted)

REQUIRED = ["codex", "claude-code", "mini-swe-agent"]


def installed(name):
    if not PRESETS[name].installed():
        pytest.fail(f"{name} is not installed: the harness tier needs `make harness-tools` (make test runs it)")


def episode(spec, task, preset, commands, tokenizer, *, policy=None, **kw):
    """One episode with the scripted player of ``commands(task)`` (or ``policy``); (trajectories, backend)."""
    backend = Recording(ScriptedBackend(policy or scripted(preset, commands)))
    with HarnessRunner(Gateway(backend, tokenizer)) as runner:
        trajs = runner.run(spec, preset, task, **kw)
        sessions_left = len(runner.gateway.sessions)
    assert sessions_left == 0
    return trajs, backend


def stray_processes() -> list[str]:
    """Harness processes this test process left alive (the sandbox must take them all down)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if str(HARNESS_DIR) in cmd or "envhub-forwarder" in cmd:
            out.append(cmd[:200])
    return out


def test_every_required_preset_exists():
    assert set(REQUIRED) <= set(PRESETS)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_golden_solves_and_noop_fails_through_the_real_harness(name, swe_gym, smollm2_tokenizer):
    installed(name)
    spec, tasks = swe_gym
    preset = get_preset(name)
    for task in tasks[:2]:
        trajs, backend = episode(spec, task, preset, golden_commands, smollm2_tokenizer, timeout_s=180)
        assert [t.details["chain_role"] for t in trajs] == ["main"], [t.details.get("chain_reason") for t in trajs]
        (t,) = trajs
        assert t.reward == 1.0 and t.passed and t.finish_reason == "done", t.details["harness_exit"]
        assert t.num_turns == 2 and t.details["harness_exit"]["exit_code"] == 0
        assert invariant_problems_from(t, backend) == []  # against what the backend really got and returned
        from envhub.codec.chat import ChatCodec

        codec = ChatCodec.shared(smollm2_tokenizer, tools=json.loads(t.details["tools"]))
        assert check_trajectory(t, codec, generations=[g for _, g in backend.calls]) == []
        noop, _ = episode(spec, task, preset, noop_commands, smollm2_tokenizer, timeout_s=180)
        assert noop[0].reward == 0.0 and not noop[0].passed
    assert stray_processes() == []


def invariant_problems_from(t, backend) -> list[str]:
    """invariant_problems for one trajectory whose calls are exactly the backend's calls, in order."""
    class Call:
        def __init__(self, cid):
            self.call_id, self.ok = cid, True

    session = type("S", (), {"calls": [Call(c) for c in t.details["calls"]]})()
    return invariant_problems(session, [t], backend.calls)


def test_not_installed_names_the_install_step():
    ghost = Preset("ghost", "chat", "ghost-agent==1.0", "npm/node_modules/.bin/ghost-agent", argv=lambda t: [],
                   env=lambda u, k: {})
    with pytest.raises(HarnessNotInstalled, match="make harness-tools"):
        ghost.check_installed()


def test_a_harness_that_crashes_or_never_calls_the_model_is_marked(swe_gym, smollm2_tokenizer):
    installed("codex")
    spec, tasks = swe_gym
    crashing = Preset(**{**PRESETS["codex"].__dict__, "name": "codex-bad-flag",
                         "argv": lambda task: ["exec", "--no-such-flag", task]})
    (t,) = episode(spec, tasks[0], crashing, golden_commands, smollm2_tokenizer, timeout_s=60)[0]
    assert t.finish_reason == "error" and "made no model call" in t.error and "exit 2" in t.error, t.error
    assert t.reward == 0.0 and not any(t.loss_mask)
    silent = Preset(**{**PRESETS["codex"].__dict__, "name": "silent", "argv": lambda task: ["--version"]})
    (t,) = episode(spec, tasks[0], silent, golden_commands, smollm2_tokenizer, timeout_s=60)[0]
    assert t.finish_reason == "error" and "made no model call (exit 0)" in t.error
    assert stray_processes() == []


def test_a_looping_harness_meets_the_call_budget(swe_gym, smollm2_tokenizer):
    """A policy that never ends (compaction loops look like this to the gateway): the budget's 403 ends it -- not a
    429 or a 400, which clients retry with backoff until the time budget kills them."""
    installed("mini-swe-agent")
    spec, tasks = swe_gym
    preset = get_preset("mini-swe-agent")
    forever = scripted(preset, lambda task: ["true"] * 1000)
    t0 = time.monotonic()
    trajs, backend = episode(spec, tasks[0], preset, None, smollm2_tokenizer, policy=forever, timeout_s=120,
                             max_calls=4)
    assert len(backend.calls) == 4 and time.monotonic() - t0 < 60
    assert "call_budget_exhausted" in trajs[0].details["flags"]
    assert sum(t.num_turns for t in trajs) == 4 and trajs[0].reward == 0.0
    assert stray_processes() == []


def test_a_harness_past_its_time_budget_is_killed_with_everything_it_started(swe_gym, smollm2_tokenizer):
    installed("codex")
    spec, tasks = swe_gym
    preset = get_preset("codex")
    sleeper = scripted(preset, lambda task: ["(sleep 300 &) ; sleep 300"])
    t0 = time.monotonic()
    trajs, _ = episode(spec, tasks[0], preset, sleeper, smollm2_tokenizer, timeout_s=8)
    assert time.monotonic() - t0 < 60
    (t,) = trajs
    assert t.finish_reason == "error" and "budget" in t.error and t.details["harness_exit"]["timed_out"]
    assert not any(t.loss_mask)
    assert stray_processes() == []


def test_the_sandboxed_agent_cannot_set_its_reward_or_reach_other_routes(swe_gym, smollm2_tokenizer):
    """Attack: from inside the sandbox, through the forwarder, with its own session key: set_reward, start a
    session, read sessions, export. The sandbox sees model routes only; the grade is the verifier's."""
    installed("codex")
    spec, tasks = swe_gym
    preset = get_preset("codex")
    probe = ("python3 - <<'EOF'\nimport json, os, urllib.request\n"
             "key = os.environ.get('ENVHUB_SESSION_KEY', '')\n"
             "for path, body in [('/rl/set_reward', {'reward': 1.0}), ('/rl/start_session', {'task_id': 'x'}),\n"
             "                   ('/sessions', {}), ('/export_trajectories', {'session_id': 'x'}),\n"
             "                   ('/rl/end_session', {}), ('/grant_capacity', {})]:\n"
             "    req = urllib.request.Request('http://127.0.0.1:18080' + path, data=json.dumps(body).encode(),\n"
             "        headers={'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'})\n"
             "    try:\n        print(path, urllib.request.urlopen(req).status)\n"
             "    except Exception as e:\n        print(path, getattr(e, 'code', e))\n"
             "for path in ['/metrics', '/sessions/x']:\n"
             "    try:\n        print(path, urllib.request.urlopen('http://127.0.0.1:18080' + path).status)\n"
             "    except Exception as e:\n        print(path, getattr(e, 'code', e))\n"
             "EOF\n")
    trajs, backend = episode(spec, tasks[0], preset, lambda task: [probe], smollm2_tokenizer, timeout_s=120)
    (t,) = trajs
    assert t.reward == 0.0 and not t.passed
    out = next(m["content"] for m in t.messages if m.get("role") == "tool")
    for path in ["/rl/set_reward", "/rl/start_session", "/sessions", "/export_trajectories", "/rl/end_session",
                 "/grant_capacity", "/metrics", "/sessions/x"]:
        assert f"{path} 404" in out, out


def test_rollout_cli_one_line(swe_gym, tmp_path):
    """`envhub rollout swe-gym --harness codex --model golden -n 2` solves both tasks."""
    import subprocess
    import sys

    installed("codex")
    r = subprocess.run([sys.executable, "-m", "envhub.cli", "rollout", "swe-gym", "--harness", "codex", "--model",
                        "golden", "-n", "2", "--out", str(tmp_path / "run")], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "2/2 tasks solved" in r.stdout and "2 main chains" in r.stdout
    from helpers import load_trajectories

    trajs = load_trajectories(tmp_path / "run")
    assert len(trajs) == 2 and all(t.reward == 1.0 and any(t.loss_mask) for t in trajs)



def test_one_harness_run_through_the_rollout_service(swe_gym, smollm2_tokenizer):
    """The service takes ``instance.harness`` through INIT/RUN/EVAL: Codex solves the task, the reply is the main
    chain with ProRL's fields; an unknown harness is a 400 naming the known ones."""
    import httpx

    from envhub.service import RolloutService, ServerThread

    installed("codex")
    spec, tasks = swe_gym
    with ServerThread(RolloutService(smollm2_tokenizer, backends=["golden"])) as srv:
        body = {"instance": {"env_id": "swe-gym", "task_id": tasks[0]["task_id"], "harness": "codex"},
                "sampling_params": {}}
        r = httpx.post(srv.url + "/process", json=body, timeout=300)
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["reward"] == 1.0 and out["finish_reason"] == "done", out.get("error")
        assert out["details"]["harness"] == "codex" and out["details"]["chain_role"] == "main"
        assert sum(m.get("role") == "assistant" for m in out["messages"]) == 2  # the chain's two calls
        # ProRL's clients concatenate the per-message token ids: exactly the record
        assert [i for m in out["messages"] for i in m["token_ids"]] == out["prompt_ids"] + out["response_ids"]
        bad = httpx.post(srv.url + "/process", json={**body, "instance": {**body["instance"], "harness": "nope"},
                                                    "job_id": "bad"}, timeout=60)
        assert bad.status_code == 400 and "known: codex" in bad.text
    assert stray_processes() == []
