"""Class 2 attacks: stalling or flooding the host from inside the sandbox.

The python tool runs the agent's code inside the action server's own process, so that code can switch off the
server's watchdog, rewrite its output caps, or replace its request handler. The host must not trust any of it: every
wait is bounded on the host side, every reply is capped on the host side. Each test runs the attack in a thread with
a generous join limit (so that, on code without the defence, the test fails instead of hanging), then checks that
the sandbox answers the next request.
"""
from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.slow

LIMIT = 4096  # the sandboxes' output_limit in these tests


def _bounded(fn, limit_s: float):
    """``fn()`` in a thread; fails the test if it has not returned after ``limit_s`` (the attack stalled the host)."""
    box: list = []
    t = threading.Thread(target=lambda: box.append(fn()), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"the host was still waiting after {limit_s:g} s"
    return box[0], time.monotonic() - t0


def _serves(sb) -> None:
    assert sb.shell("echo next-request", timeout=10).output.strip().endswith("next-request")
    r = sb.python("1 + 1", timeout=10)
    assert r.ok and "2" in r.stdout, r.stdout


DISARM = ("import faulthandler, signal\n"
          "faulthandler.cancel_dump_traceback_later()\n"
          "signal.setitimer(signal.ITIMER_REAL, 0)\n"
          "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n")


def test_disabled_watchdog_and_spin(box):
    """The cell turns off the SIGALRM timeout and the faulthandler watchdog, then spins forever."""
    sb = box(output_limit=LIMIT)
    r, took = _bounded(lambda: sb.python(DISARM + "while True:\n    pass\n", timeout=2), 60)
    assert r.timed_out and r.exit_code == 124 and r.restarted, r
    assert took < 2 + sb.deadline_grace_s + 10
    _serves(sb)


def test_hijacked_server_that_never_answers(box):
    """The cell replaces the server's request handler: the next request is never answered."""
    sb = box(output_limit=LIMIT)
    r = sb.python("import time, envhub_agent.server as s\n"
                  "s.Server.handle = lambda self, req: time.sleep(10**6)\n", timeout=5)
    assert r.ok, r.stdout
    r, took = _bounded(lambda: sb.exec(["echo", "hi"], timeout=2), 60)
    assert r.timed_out and r.restarted and "hi\n" not in r.stdout, r
    _serves(sb)


def test_python_output_flood_is_capped_on_the_host(box):
    """The cell lifts its own output cap and prints 20 MB."""
    sb = box(output_limit=LIMIT)
    r = sb.python("import sys\nsys.stdout.cap.limit = 10**10\nprint('x' * 20_000_000)\n", timeout=30)
    assert len(r.stdout.encode()) <= LIMIT + 1024, len(r.stdout)
    assert r.cut >= 20_000_000 - LIMIT or r.restarted, (r.cut, r.restarted)
    _serves(sb)


@pytest.mark.parametrize("tool", ["exec", "shell", "edit"])
def test_hijacked_caps_flood_every_tool(box, tool):
    """The cell wraps the server's request handler so that every later reply carries 5 MB of output."""
    sb = box(output_limit=LIMIT)
    sb.attach_shell = False  # the shell's replies then come from the (hijacked) server
    r = sb.python("import envhub_agent.server as s\n"
                  "orig = s.Server.handle\n"
                  "big = 'y' * 5_000_000\n"
                  "s.Server.handle = lambda self, req: orig(self, req) if req.get('op') != '" + tool + "' else "
                  "{**orig(self, req), 'stdout': big, 'stderr': big, 'output': big}\n", timeout=10)
    assert r.ok, r.stdout
    if tool == "exec":
        r = sb.exec(["echo", "hi"], timeout=10)
        out = r.stdout + r.stderr
    elif tool == "shell":
        r = sb.shell("echo hi; echo there", timeout=10)
        out = r.stdout
    else:
        ok, out = sb.edit("view", "/testbed")
    assert len(out.encode()) <= 2 * LIMIT + 2048, len(out)
    sb.kill_processes()
    _serves(sb)


def test_trickling_server_hits_the_whole_frame_deadline(box):
    """The cell makes the server send its replies one byte every 0.3 s: each recv returns in time, the frame never
    completes; a per-recv timeout alone would wait for ever."""
    sb = box(output_limit=LIMIT)
    r = sb.python("import time, envhub_agent.protocol as p, envhub_agent.server as s\n"
                  "orig, calls = p.send, []\n"
                  "def trickle(sock, obj, fd=None):\n"
                  "    calls.append(1)\n"
                  "    if len(calls) == 1:\n"
                  "        return orig(sock, obj, fd)  # this cell's own reply\n"
                  "    data = p.dumps(obj).encode() + b' ' * 10000\n"
                  "    frame = p._HEADER.pack(len(data)) + data\n"
                  "    for i in range(len(frame)):\n"
                  "        sock.sendall(frame[i:i + 1]); time.sleep(0.3)\n"
                  "s.protocol.send = trickle\n", timeout=10)
    assert r.ok, r.stdout
    r, took = _bounded(lambda: sb.exec(["echo", "hi"], timeout=1), 60)
    assert r.timed_out and r.restarted, r
    assert took < 1 + sb.deadline_grace_s + 10
    _serves(sb)


def test_grader_reads_through_a_workspace_symlink_stay_in_the_sandbox(box, tmp_path):
    """A grader reads the agent's artifact with ``read_file``; a symlink to a host path must not bring host bytes."""
    secret = tmp_path / "host-secret"
    secret.write_text("HOST-ONLY")
    sb = box(output_limit=LIMIT)  # a host-directory workspace (swe-gym's kind)
    sb.shell(f"ln -s {secret} /testbed/solution.py; ln -s {tmp_path} /testbed/dir", timeout=10)
    for path in ("/testbed/solution.py", "/testbed/dir/host-secret"):
        try:
            data = sb.read_file(path)
        except Exception as e:
            assert "HOST-ONLY" not in str(e)
        else:
            assert b"HOST-ONLY" not in data
    assert secret.read_text() == "HOST-ONLY"
    _serves(sb)


def test_hijacked_shell_attach_is_a_timeout(box):
    """The host's attached-shell fast path asks the server for the pty first; a server that never hands it over
    must not stall the bash tool."""
    sb = box(output_limit=LIMIT)
    r = sb.python("import time, envhub_agent.server as s\n"
                  "orig = s.Server.handle\n"
                  "s.Server.handle = lambda self, req: time.sleep(10**6) if req.get('op') == 'shell_attach' "
                  "else orig(self, req)\n", timeout=5)
    assert r.ok, r.stdout
    r, took = _bounded(lambda: sb.shell("echo hi", timeout=2), 60)
    assert r.timed_out and r.restarted and r.exit_code == 124, r
    _serves(sb)
