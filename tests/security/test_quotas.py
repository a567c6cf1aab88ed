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
    if "cpu" not in cgroups.available():
        pytest.skip("no cpu cgroup can be made on this host (capabilities() says so)")
    sb = box(cpu_quota=0.2)
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
