"""The prewarmed pool, the local runtime, the registry's cleanup on signals, and the Singularity command lines
(against a recording shim: no Apptainer/Singularity binary exists here)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from sandbox_helpers import leftovers, needs_bwrap

from envhub.sandbox import RuntimeUnavailable, SandboxPool, SandboxSpec, get_runtime, lifecycle, start
from envhub.sandbox.singularity import instance_start_argv, instance_stop_argv, server_exec_argv


@needs_bwrap
def test_pool_hands_out_ready_sandboxes_and_refills():
    spec = SandboxSpec(runtime="bwrap", memory_mb=512)
    with SandboxPool(spec, size=2) as pool:
        assert pool.wait_ready(timeout=30)
        prewarmed = {sb.id for sb in pool._ready}
        a = pool.acquire()
        # handed out from the prewarmed ones, not started on the spot (identity, not a timing on a shared machine)
        assert a.id in prewarmed and a.shell("echo ready").stdout == "ready\n"
        b, c = pool.acquire(), pool.acquire()  # the third is started on the spot if the refill lags
        assert len({a.id, b.id, c.id}) == 3
        assert pool.wait_ready(timeout=30) and pool.ready() == 2
        waiting = list(pool._ready)
        for sb in (a, b, c):
            sb.stop()
    assert all(sb.stopped for sb in waiting) and leftovers([s.id for s in waiting + [a, b, c]]) == []


@needs_bwrap
def test_sandbox_provider_is_a_sandbox_factory_for_several_specs():
    """``env.sandbox_factory = SandboxProvider(pool_size=1)``: each spec gets its own sandboxes, and a spec that
    repeats gets a prewarmed pool."""
    from envhub.service.sandboxes import SandboxProvider

    provider = SandboxProvider(pool_size=1)
    a, b = SandboxSpec(runtime="bwrap", memory_mb=256), SandboxSpec(runtime="bwrap", memory_mb=300)
    got = []
    try:
        got += [provider(a), provider(b)]
        assert [sb.spec.memory_mb for sb in got] == [256, 300] and provider.status()["pools"] == 0
        got.append(provider(a))  # seen twice: from now on a pool keeps one ready
        assert got[-1].spec.memory_mb == 256 and provider.status()["pools"] == 1
    finally:
        for sb in got:
            sb.stop()
        provider.close()


def test_local_runtime_runs_without_isolation(tmp_path):
    (tmp_path / "f.txt").write_text("data\n")
    sb = start(SandboxSpec(runtime="local", workspace_from=str(tmp_path)))
    try:
        assert sb.capabilities()["isolated"] is False
        assert sb.workdir.startswith(sb.state_dir)  # a host path: nothing is mounted
        r = sb.shell("cat f.txt; pwd")
        assert r.stdout == f"data\n{sb.workdir}\n"
        sb.shell("sleep 1000 > /dev/null 2>&1 &")
        assert sb.exec(["python3", "-c", "print(2 + 2)"]).stdout == "4\n"
    finally:
        sb.stop()
    assert sb.id not in lifecycle.sandbox_pids() and not os.path.exists(sb.state_dir)


@needs_bwrap
@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_owner_death_takes_its_sandboxes_along(how):
    code = textwrap.dedent("""
        import sys, time
        from envhub.sandbox import SandboxSpec, start
        sb = start(SandboxSpec(runtime="bwrap"))
        sb.shell("sleep 1000 >/dev/null 2>&1 &")
        print(sb.id, sb.state_dir, flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    sid, state = proc.stdout.readline().split()
    assert sid in lifecycle.sandbox_pids()
    proc.send_signal(getattr(signal, how))
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while sid in lifecycle.sandbox_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sid not in lifecycle.sandbox_pids()  # SIGTERM: the registry stops it; SIGKILL: --die-with-parent
    if how == "SIGTERM":
        assert not os.path.exists(state)  # the registry also removed the workspace
    else:
        # nobody is left to clean up after SIGKILL but the kernel (and the next interpreter's stale sweep, which
        # also unmounts a capped workspace: done here by hand)
        from envhub.sandbox import quota

        quota.unmount_under(state)
        subprocess.run(["rm", "-rf", state])


# ---- Singularity / Apptainer --------------------------------------------------------------------------------------
SHIM = r"""#!{python}
# A recording stand-in for apptainer (the real binary is not installable here): logs its argv, keeps the instance
# list in a file, and for `exec instance://...` runs the command on the host with the instance's --bind mounts
# emulated by symlinks under a private root (paths in the command are rewritten), so the action server really starts.
import json, os, sys
log, state = os.environ["SHIM_LOG"], os.environ["SHIM_STATE"]
with open(log, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\n")
db = json.load(open(state)) if os.path.exists(state) else {{}}
args = sys.argv[1:]
if args[:2] == ["instance", "start"]:
    db[args[-1]] = [args[i + 1].split(":")[:2] for i, a in enumerate(args) if a == "--bind"]
elif args[:2] == ["instance", "stop"]:
    db.pop(args[-1], None)
elif args[:2] == ["instance", "list"]:
    print(json.dumps({{"instances": [{{"instance": n}} for n in db if n == args[-1]]}}))
elif args[0] == "exec":
    i = next(k for k, a in enumerate(args) if a.startswith("instance://"))
    root = os.environ["SHIM_ROOT"]
    binds = sorted(db[args[i][len("instance://"):]], key=lambda b: -len(b[1]))
    for src, dest in binds:
        os.makedirs(os.path.dirname(root + dest), exist_ok=True)
        if not os.path.lexists(root + dest):
            os.symlink(src, root + dest)
    cmd = args[i + 1:]
    for src, dest in binds:
        cmd = [a.replace(dest, root + dest) for a in cmd]
    os.execvp(cmd[0], cmd)
json.dump(db, open(state, "w"))
"""


@pytest.fixture
def shim(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "apptainer"
    exe.write_text(SHIM.format(python=sys.executable))
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("SHIM_LOG", str(tmp_path / "log"))
    monkeypatch.setenv("SHIM_STATE", str(tmp_path / "state.json"))
    monkeypatch.setenv("SHIM_ROOT", str(tmp_path / "root"))
    return tmp_path


def test_singularity_argv_is_built_by_envhub(tmp_path):
    spec = SandboxSpec(image="/img/x.sif", fakeroot=True, overlay="/ov", binds=["/data:/data:ro"])
    argv = instance_start_argv("/usr/bin/apptainer", spec, "envhub-1", "/st")
    assert argv[:8] == ["/usr/bin/apptainer", "instance", "start", "--containall", "--no-mount",
                        "home,cwd,bind-paths", "--pid", "--fakeroot"]
    assert argv[argv.index("--net"):argv.index("--net") + 3] == ["--net", "--network", "none"]
    assert argv[argv.index("--overlay") + 1] == "/ov" and argv[-2:] == ["/img/x.sif", "envhub-1"]
    binds = [argv[i + 1] for i, a in enumerate(argv) if a == "--bind"]
    assert "/st/workspace:/testbed:rw" in binds and "/st/run:/run/envhub:rw" in binds and "/data:/data:ro" in binds
    assert "--net" not in instance_start_argv("apptainer", SandboxSpec(image="/i.sif", network=True), "n", "/s")
    ex = server_exec_argv("apptainer", spec, "envhub-1", {"socket": "/run/envhub/server.sock"})
    assert ex[:6] == ["apptainer", "exec", "--cleanenv", "--pwd", "/testbed", "instance://envhub-1"]
    assert ex[6:9] == ["python3", "-I", "-S"]
    assert instance_stop_argv("apptainer", "n", 2.0, force=True) == ["apptainer", "instance", "stop", "--timeout",
                                                                    "2", "--force", "n"]


def test_singularity_missing_binary_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeUnavailable, match="install Apptainer"):
        start(SandboxSpec(runtime="singularity", image="/x.sif"))
    from envhub.sandbox.singularity import build_image, inspect_image

    with pytest.raises(RuntimeUnavailable, match="not installed"):
        inspect_image("/x.sif")
    with pytest.raises((RuntimeUnavailable, Exception)):
        build_image("docker://alpine", str(tmp_path / "a.sif"))


def test_singularity_lifecycle_against_the_recording_shim(shim):
    sb = start(SandboxSpec(runtime="apptainer", image="/img/x.sif", python=sys.executable))
    try:
        assert sb.runtime == "singularity" and sb.instance_running()
        assert sb.exec(["echo", "via-shim"]).stdout == "via-shim\n"  # the real action server, started by `exec`
        sb.write_file(f"{shim}/root/testbed/f.txt", "in the workspace")
        assert open(os.path.join(sb.state_dir, "workspace", "f.txt")).read() == "in the workspace"
    finally:
        sb.stop()
    calls = [json.loads(line) for line in (shim / "log").read_text().splitlines()]
    verbs = [c[:2] for c in calls]
    assert verbs[0] == ["instance", "start"] and ["exec", "--cleanenv"] in verbs and ["instance", "stop"] in verbs
    assert "--containall" in calls[0] and "--pid" in calls[0]
    assert not sb.instance_running() and not os.path.exists(sb.state_dir)


def test_plugins_can_add_runtimes():
    import types

    from envhub.hookspecs import hookimpl
    from envhub.plugins import default_hub
    from envhub.sandbox import available_runtimes
    from envhub.sandbox.local import LocalRuntime

    class EchoRuntime(LocalRuntime):
        name = "echo-local"

    plugin = types.ModuleType("echo_runtime_plugin")
    plugin.envhub_sandbox_runtimes = hookimpl(lambda: {"echo-local": EchoRuntime})
    pm = default_hub().pm
    pm.register(plugin)
    try:
        assert available_runtimes()["echo-local"] is True
        assert isinstance(get_runtime("echo-local"), EchoRuntime)
        assert get_runtime("auto").name != "echo-local"
    finally:
        pm.unregister(plugin)


@pytest.mark.skipif(not __import__("shutil").which("apptainer")
                    and not __import__("shutil").which("singularity"), reason="no apptainer/singularity binary here")
def test_singularity_real_run():
    """Runs where Apptainer/SingularityCE is installed; ENVHUB_TEST_SIF names an image with python3 in it."""
    image = os.environ.get("ENVHUB_TEST_SIF")
    if not image:
        pytest.skip("set ENVHUB_TEST_SIF to a .sif image that has python3")
    sb = start(SandboxSpec(runtime="singularity", image=image))
    try:
        assert sb.shell("echo $((6 * 7)); pwd").stdout == "42\n/testbed\n"
        assert sb.exec(["python3", "-c", "print('ok')"]).stdout == "ok\n"
    finally:
        sb.stop()
    assert not sb.instance_running()
