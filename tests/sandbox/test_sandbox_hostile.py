"""Hostile workloads on real bwrap: each is contained with a clear result, the action server keeps answering (or is
cleanly restarted), and the host is never at risk (memory capped well below the machine's, processes capped)."""
from __future__ import annotations

import threading
import time

import pytest
from sandbox_helpers import leftovers, needs_bwrap

from envhub.sandbox import SandboxSpec, lifecycle, start

pytestmark = needs_bwrap


def test_fork_bomb_is_capped_and_recoverable(fresh):
    # no CPU quota here: this test is about the pids cap, and it checks that the cap is full at one instant; a bomb
    # throttled by a 1-CPU quota on a loaded host refills its slots too slowly for that instant to be certain
    box = fresh(max_procs=40, memory_mb=512, cpu_quota=None)
    r = box.shell(":(){ :|:& };:", timeout=5)  # returns at once: the bomb runs in the background
    time.sleep(2)
    assert box.ping()["uid"] == 1000  # the server answers while the bomb saturates the sandbox
    total = len(lifecycle.pids_in_pidns(box.pidns))
    assert total <= 40 + 3, total  # the pids cgroup (or RLIMIT_NPROC) holds
    # the bomb's processes die as their forks fail and the others refill the slots: on a loaded host a slot can be
    # free at the instant of one try, so the cap is shown by a refusal within a few tries (a bomb below the cap
    # would never be refused)
    deadline, tries = time.monotonic() + 15, 0
    while True:
        r = box.exec(["true"], timeout=5)
        tries += 1
        if not r.ok or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not r.ok and (r.exit_code in (126, 254) or "Resource temporarily unavailable" in r.output), (tries, r)
    assert box.kill_processes() > 0
    r = box.shell("echo recovered; ls / > /dev/null && echo forked")
    assert r.ok and r.stdout == "recovered\nforked\n"


def test_infinite_loops_time_out(fresh):
    box = fresh()
    box.shell("export STATE=kept")
    assert box.shell("while :; do :; done", timeout=1).timed_out
    assert box.exec(["python3", "-c", "while True: pass"], timeout=1).timed_out
    assert box.python("x = 5\nwhile True: pass", timeout=1).timed_out
    assert box.shell("echo $STATE").stdout == "kept\n" and box.python("x").stdout.strip() == "5"


def test_8gb_allocation_is_contained(fresh):
    box = fresh(memory_mb=512)
    for run in (box.shell, box.exec):
        r = run("python3 -c 'x = bytearray(8 << 30)'")
        assert r.exit_code != 0 and "MemoryError" in r.output
    r = box.python("x = bytearray(8 << 30)")  # in the server's own process: a MemoryError, not a dead server
    assert r.exit_code == 1 and "MemoryError" in r.stdout
    # touching memory past the sandbox's cap: the allocating process dies (OOM in the cgroup, or RLIMIT_AS)
    r = box.shell("python3 -c 'a = []\nwhile True: a.append(bytearray(64 << 20))'", timeout=30)
    assert r.exit_code != 0 and ("MemoryError" in r.stdout or r.exit_code == 137)
    assert box.shell("echo fine").stdout == "fine\n" and box.python("1 + 1").stdout.strip() == "2"


@pytest.mark.slow
def test_200mb_of_stdout_is_capped(fresh):
    box = fresh(output_limit=4096)
    t = time.monotonic()
    r = box.shell("head -c 200000000 /dev/zero | tr '\\0' a; echo; echo END", timeout=120)
    assert r.ok and r.cut > 199_000_000 and r.stdout.endswith("END\n") and len(r.stdout) < 5000
    r = box.exec("head -c 200000000 /dev/zero | tr '\\0' b", timeout=120)
    assert r.ok and r.cut == 200_000_000 - 4096
    r = box.python("print('c' * 200_000_000)", timeout=120)
    assert r.ok and r.cut > 199_000_000
    assert time.monotonic() - t < 120 and box.shell("echo ok").stdout == "ok\n"


def test_flood_of_small_files_hits_the_tmpfs_cap(fresh):
    box = fresh(tmp_size_mb=8, workspace_size_mb=8)
    code = ("import sys\nn = 0\ntry:\n    while n < 10**6:\n        with open(f'{sys.argv[1]}/f{n}', 'w') as f:\n"
            "            f.write('x' * 100)\n        n += 1\nexcept OSError as e:\n    print(n, e)")
    # a directory of its own: the host's venv may be bound under /tmp too (a checkout in /tmp), read-only
    assert box.exec("mkdir /tmp/flood").ok
    for where in ("/tmp/flood", "/testbed"):
        r = box.exec(["python3", "-c", code, where], timeout=60)
        assert r.ok and "No space left on device" in r.stdout, r
    assert box.shell("rm -rf /tmp/flood && echo cleaned").stdout == "cleaned\n"


def test_server_death_restarts_the_sandbox(fresh):
    box = fresh()
    box.shell("echo keep > /testbed/file; export V=1")
    r = box.python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert r.restarted and r.error and "restarted" in r.stdout
    assert box.shell("cat /testbed/file; echo ${V:-unset}").stdout == "keep\nunset\n"  # files kept, state lost
    assert box.restarts == 1


@pytest.mark.slow
def test_200_sandboxes_leave_nothing_behind():
    ids: list[str] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for _ in range(n):
            box = start(SandboxSpec(runtime="bwrap", max_procs=32, memory_mb=256))
            if len(ids) % 10 == 0:
                box.shell("sleep 1000 & echo")
            with lock:
                ids.append(box.id)
            box.stop()

    threads = [threading.Thread(target=worker, args=(50,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(ids) == 200
    stray = {i: pids for i, pids in lifecycle.sandbox_pids().items() if i in set(ids)}
    assert stray == {} and leftovers(ids) == []


@pytest.mark.slow
def test_code_stuck_in_c_trips_the_watchdog(fresh):
    """``sum(range(10**13))`` loops in C holding the GIL and never returns to the interpreter, so the cell's SIGALRM
    handler cannot run; the server's watchdog exits past timeout + grace and the sandbox is relaunched."""
    box = fresh()
    box.write_file("/testbed/kept.txt", "kept")
    t = time.monotonic()
    r = box.python("sum(range(10 ** 13))", timeout=1)
    assert r.restarted and "restarted" in r.stdout and time.monotonic() - t < 60
    assert box.read_text("/testbed/kept.txt") == "kept" and box.python("1 + 1").stdout.strip() == "2"
