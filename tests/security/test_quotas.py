"""Class 3 attacks: background busy loops left running between tool calls, against the sandbox's CPU quota."""
from __future__ import annotations

import os
import time

import pytest

from envhub.sandbox import cgroups

pytestmark = pytest.mark.slow


def _cpu_seconds(pids) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            pass
    return total / tick


def test_background_busy_loops_are_held_to_the_cpu_quota(box):
    sb = box(cpu_quota=0.2)
    if "cpu" not in cgroups.available():
        assert sb.capabilities()["limits"]["cpu_quota"].startswith("none")
        pytest.skip("no cpu cgroup can be made on this host (capabilities() says so)")
    assert "cpu cgroup" in sb.capabilities()["limits"]["cpu_quota"]
    r = sb.shell("for i in 1 2 3; do (while :; do :; done) & done; echo started", timeout=10)
    assert "started" in r.output
    before = _cpu_seconds(sb._members())
    time.sleep(3.0)
    used = _cpu_seconds(sb._members()) - before
    # 0.2 CPUs for 3 s is 0.6 s; without a quota three loops take whatever the host gives (~2 CPUs here)
    assert used <= 0.2 * 3.0 * 2, f"the sandbox used {used:.2f} CPU-seconds in 3 s with a 0.2-CPU quota"
    assert sb.shell("echo next", timeout=20).output.strip().endswith("next")  # still serving (slowly)
    sb.kill_processes()
    assert sb.shell("echo after", timeout=10).output.strip().endswith("after")


def _host_usage(sb) -> tuple[int, int]:
    """(bytes, entries) in a bwrap sandbox's host-directory workspace, as the host sees it (never following links)."""
    path = os.path.join(sb.state_dir, "workspace")
    assert os.path.isdir(path), f"no host-directory workspace at {path}"
    size = count = 0
    for dirpath, dirnames, filenames in os.walk(path):
        for name in filenames:
            count += 1
            try:
                size += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
        count += len(dirnames)
    return size, count


def test_disk_flood_of_a_host_directory_workspace_hits_the_quota(box):
    sb = box(disk_mb=16, disk_inodes=2000)  # a host-directory workspace, as swe-gym uses
    if "tmpfs" not in sb.capabilities()["limits"]["workspace"]:
        pytest.skip(f"no workspace quota on this host: {sb.capabilities()['limits']['workspace']}")
    r = sb.shell("for i in 1 2 3 4; do head -c 10000000 /dev/zero > big$i || break; done; du -sm .", timeout=30)
    size, _ = _host_usage(sb)
    assert size <= 17 << 20, f"the workspace grew to {size} bytes on the host past a 16 MB quota"
    assert "No space left" in r.output, r.output
    sb.shell("rm -f big*", timeout=10)
    assert sb.shell("echo next", timeout=10).output.strip().endswith("next")


def test_inode_flood_of_a_host_directory_workspace_hits_the_quota(box):
    sb = box(disk_mb=64, disk_inodes=2000)
    if "inodes" not in sb.capabilities()["limits"]["workspace"]:
        pytest.skip(f"no inode quota on this host: {sb.capabilities()['limits']['workspace']}")
    r = sb.exec(["python3", "-c", "import os\nfor i in range(20000):\n    open(f'f{i}', 'w').close()\n"],
                timeout=30)
    _, count = _host_usage(sb)
    assert count <= 2000, f"{count} files made in the workspace past a 2000-inode quota"
    assert "No space left" in r.stderr, r.stderr[-500:]
    sb.shell("rm -f f*", timeout=30)
    assert sb.shell("echo next", timeout=10).output.strip().endswith("next")


def test_stale_sweep_unmounts_a_killed_owners_capped_workspace(box):
    """An owner killed by SIGKILL cannot unmount its workspace: the next interpreter's stale sweep must, or state
    directories (and tmpfs mounts) pile up."""
    import signal
    import subprocess
    import sys
    import textwrap

    from envhub.sandbox import common, lifecycle

    box()  # skips where bwrap cannot run
    code = textwrap.dedent("""
        import time
        from envhub.sandbox import SandboxSpec, start
        sb = start(SandboxSpec(runtime="bwrap", disk_mb=16))
        print(sb.id, sb.state_dir, sb.capabilities()["limits"]["workspace"], flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    sid, state, caps = proc.stdout.readline().split(" ", 2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while sid in lifecycle.sandbox_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sid in common.sweep_stale()
    assert not os.path.exists(state), "the stale sweep left the state directory (a mount still on it?)"
    with open("/proc/self/mountinfo") as f:
        assert state not in f.read()
