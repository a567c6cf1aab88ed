"""The sandbox a harness episode runs in, without a harness binary (the harness tier runs the real ones): the task
set's sandbox plus the gateway's socket and the harness install (read-only), no RLIMIT_AS, and at least the runner's
CPU quota, applied by the real cpu cgroup where this host can make one."""
from __future__ import annotations

import os

import pytest
from helpers import bwrap_why_not

from envhub.backends.scripted import ScriptedBackend
from envhub.env import Action
from envhub.gateway import Gateway
from envhub.harness import episode as harness_episode
from envhub.harness.episode import GATEWAY_DIR, HarnessEpisode, HarnessRunner
from envhub.harness.presets import PRESETS


@pytest.fixture
def swe_gym(tmp_path, monkeypatch):
    import envhub

    # a fresh clone has no .harness (make harness-tools installs it): the sandbox binds whatever the dir is
    monkeypatch.setattr("envhub.harness.episode.HARNESS_DIR", tmp_path / "harness")
    (tmp_path / "harness").mkdir()

    why = bwrap_why_not()
    if why:
        pytest.skip(why)
    spec = envhub.get_spec("swe-gym")
    return spec, [dict(t) for t in spec.load_tasks()][0]


def sandbox_of(runner, spec, task):
    ep = HarnessEpisode(runner, spec, PRESETS["codex"], task)  # not started: the binary need not be installed
    ep.init_sync()
    return ep


def cpu_max(sb) -> str | None:
    cg = getattr(sb, "cg", None)
    if cg is None or "cpu" not in cg.dirs:
        return None
    d, version = cg.dirs["cpu"]
    return open(os.path.join(d, "cpu.max" if version == 2 else "cpu.cfs_quota_us")).read().split()[0]


@pytest.mark.parametrize("quota", [2.0, 3.5, None])
def test_a_harness_sandbox_gets_the_runners_cpu_quota_and_the_gateway(swe_gym, tiny_tokenizer, quota):
    from envhub.sandbox import cgroups

    spec, task = swe_gym
    with HarnessRunner(Gateway(ScriptedBackend(lambda *_: Action("x")), tiny_tokenizer), cpu_quota=quota) as runner:
        ep = sandbox_of(runner, spec, task)
        try:
            sb = ep.env.sandbox
            assert sb.spec.cpu_quota == quota  # swe-gym's own sandboxes have 1.0
            assert sb.spec.memory_mb is None
            binds = {dest: (host, mode) for host, dest, mode in sb.spec.binds}
            assert binds[GATEWAY_DIR] == (runner.dir, "ro") and binds[str(harness_episode.HARNESS_DIR)][1] == "ro"
            assert sb.exec(["test", "-S", f"{GATEWAY_DIR}/gw.sock"]).ok
            if quota is not None and "cpu" in cgroups.available():
                assert int(cpu_max(sb)) == int(quota * cgroups.CPU_PERIOD_US)
        finally:
            ep.close_sync()


def test_a_failure_marked_before_eval_stands_with_its_own_reason_and_message(swe_gym, tiny_tokenizer):
    """The service's timeout cuts a harness episode before EVAL: EVAL still grades and builds, but the trajectories
    carry the timeout and its message (they used to take EVAL's "made no model call" error and lose both)."""
    spec, task = swe_gym
    with HarnessRunner(Gateway(ScriptedBackend(lambda *_: Action("x")), tiny_tokenizer)) as runner:
        ep = sandbox_of(runner, spec, task)
        try:
            ep.fail("timeout", "the job's timeout of 5s (time inside stages) ran out in RUN")
            ep.evaluate_sync()
            assert ep.trajectories and all(t.finish_reason == "timeout" for t in ep.trajectories)
            assert all(t.error == "the job's timeout of 5s (time inside stages) ran out in RUN"
                       for t in ep.trajectories)
            assert all(t.reward == 0.0 and not t.passed for t in ep.trajectories)
        finally:
            ep.close_sync()
