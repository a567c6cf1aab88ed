"""The host's attached shell (envhub.sandbox.attached): short commands typed on the host's copy of the shell's pty
give the same results as going through the action server, and never wake the server."""
from __future__ import annotations

import os
import socket

import pytest

from envhub.sandbox import SandboxSpec, start
from envhub.sandbox.agent import protocol
from sandbox_helpers import WHY_NOT, needs_bwrap

pytestmark = needs_bwrap


@pytest.fixture(scope="module", params=[True, False], ids=["attached", "through-server"])
def box(request):
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    sb = start(SandboxSpec(runtime="bwrap", timeout_s=20))
    sb.attach_shell = request.param
    yield sb
    sb.stop()


def test_same_behaviour_either_way(box):
    r = box.shell("cd /tmp && export A=1 && f() { echo f$1; }")
    assert r.ok and r.stdout == ""
    assert box.shell("pwd; echo $A; f 2").stdout == "/tmp\n1\nf2\n"
    assert box.shell("read x; echo rc=$?").stdout == "rc=1\n"  # stdin is /dev/null, never the next line
    r = box.shell("echo (")
    assert r.exit_code == 2 and "syntax error" in r.stdout
    r = box.shell("if true; then")  # an unfinished construct is eval's error, not a hang
    assert r.exit_code == 2 and not r.timed_out
    assert box.shell("(exit 9)").exit_code == 9
    r = box.shell("seq 1 100000", output_limit=100)
    assert r.ok and r.cut > 500_000 and r.stdout.startswith("1\n2\n") and r.stdout.endswith("100000\n")
    box.shell("cd /testbed")


PLAIN_AND_EVAL_CASES = [  # plain words (typed as they are) and what must come out the same under eval
    "exit",  # each pass starts with a fresh shell
    "A=1", "echo $A", "cd /tmp", "pwd", "cat", "cat /dev/null", "ls /nonexistent", "nosuchcmd x", "[ -d /tmp ]",
    "[ -d /nope ]", "ls -d /t*p", "echo ~/x", "export B=2", "env", "true", "false", "exit 4", "pwd", "cd /testbed",
]


def test_plain_words_are_typed_without_eval_and_behave_as_under_it(box, monkeypatch):
    from envhub.sandbox.agent import bash

    assert bash.inline_line(":") == ": <&99" and bash.inline_line("ls -la src") == "ls -la src <&99"
    for needs_eval in ("echo 'a b'", "echo $HOME", "ls # c", "a && b", "if true", "time ls", "[[ -d x ]]", "{ ls; }",
                       "! ls", "echo a\tb", "f() x"):
        assert bash.inline_line(needs_eval).startswith("eval '"), needs_eval
    assert bash.inline_line("echo é") is None and bash.inline_line("a\nb") is None

    def outcomes():
        return [(r.exit_code, r.stdout, r.restarted) for r in (box.shell(c) for c in PLAIN_AND_EVAL_CASES)]

    plain = outcomes()
    monkeypatch.setattr(bash, "_PLAIN", lambda text: None)  # every command under eval (on the attached path: the
    # through-server variant types with the server's own copy of the module, so both of its passes are plain)
    assert outcomes() == plain
    assert plain[2] == (0, "1\n", False) and plain[5] == (0, "", False) and plain[8][0] == 127
    assert plain[17] == (-1, "exit\n" + bash.SHELL_EXITED, True) and plain[18] == (0, "/testbed\n", False)
    assert "B=2" in plain[14][1] and "A=1" not in plain[14][1]


def test_an_alias_works_on_plain_words(box):
    assert box.shell("alias hello='echo hi from alias'").ok
    assert box.shell("hello there").stdout == "hi from alias there\n"
    box.shell("unalias hello")


def test_closing_the_shells_dev_null_is_repaired(box):
    assert box.shell("exec 99<&-; echo closed").stdout == "closed\n"
    r = box.shell("echo next; read x; echo rc=$?")  # reopened and typed again: ran once, stdin still empty
    assert r.ok and r.stdout == "next\nrc=1\n"
    for plain in (":", "cat"):  # the same on the plain-word path, for a builtin and an external command
        assert box.shell("exec 99<&-").ok
        r = box.shell(plain)
        assert r.ok and r.stdout == ""


def test_timeout_interrupts_and_state_survives(box):
    box.shell("export KEEP=2")
    r = box.shell("echo started; sleep 100", timeout=1)
    assert r.timed_out and r.exit_code == 124 and not r.restarted
    assert r.stdout.startswith("started") and "__ENVHUB_" not in r.stdout
    r = box.shell("trap '' INT; sleep 100", timeout=1)  # ignores Ctrl-C: the server kills its process group
    assert r.timed_out and not r.restarted
    assert box.shell("echo $KEEP").stdout == "2\n"


def test_exit_is_reported_once_and_a_new_shell_follows(box):
    box.shell("export GONE=1")
    r = box.shell("exit 3")
    assert r.restarted and "shell exited" in r.stdout
    r = box.shell("echo ${GONE:-unset}; pwd")
    assert r.ok and not r.restarted and r.stdout == "unset\n/testbed\n"


def test_long_commands_share_the_same_shell(box):
    box.shell("cd /tmp")
    r = box.shell("echo " + "y" * 5000 + " > /dev/null; pwd\nexport LONG=1")  # through the server's command file
    assert r.ok and r.stdout == "/tmp\n"
    assert box.shell("echo $LONG; pwd").stdout == "1\n/tmp\n"
    box.shell("cd /testbed")


def test_killall_then_shell(box):
    box.shell("sleep 300 &")
    assert box.kill_processes() >= 1
    r = box.shell("echo alive")
    assert r.ok and r.stdout == "alive\n"


def test_attached_commands_do_not_wake_the_server():
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    with start(SandboxSpec(runtime="bwrap")) as sb:
        sb.shell("true")  # attaches (one request)
        calls = []
        real = sb.request
        sb.request = lambda op, *a, **k: calls.append(op) or real(op, *a, **k)
        for i in range(20):
            assert sb.shell(f"echo {i}").stdout == f"{i}\n"
        assert calls == []
        sb.shell("echo é")  # not plain ASCII: goes through the server
        assert calls == ["shell"]


def test_server_death_drops_the_attached_pty():
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    with start(SandboxSpec(runtime="bwrap")) as sb:
        sb.shell("export V=1")
        fd = sb._attached.fd
        assert fd is not None
        r = sb.python("import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
        assert r.restarted
        assert sb._attached.fd is None  # let go when the server was relaunched
        assert sb.shell("echo ${V:-unset}").stdout == "unset\n"


def test_protocol_passes_a_descriptor():
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        with a, b:
            protocol.send(a, {"ok": True, "x": "é" * 70000}, fd=w)
            obj, fd = protocol.recv_with_fd(b)
            assert obj == {"ok": True, "x": "é" * 70000} and fd is not None and fd != w
            assert not os.get_inheritable(fd)  # close-on-exec: host subprocesses never inherit a sandbox's pty
            os.write(fd, b"through the copy")
            os.close(fd)
            assert os.read(r, 100) == b"through the copy"
            protocol.send(a, {"ok": True})
            assert protocol.recv_with_fd(b) == ({"ok": True}, None)
    finally:
        os.close(r)
        os.close(w)
