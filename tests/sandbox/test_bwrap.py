"""Real bwrap sandboxes: the action server's shell, exec, files, IPython, isolation and lifecycle."""
from __future__ import annotations

import os
import random
import socket
import threading
import time

import psutil
import pytest

from envhub.sandbox import SandboxError, SandboxSpec, lifecycle, start
from sandbox_helpers import leftovers, needs_bwrap

pytestmark = needs_bwrap


# ---- the persistent shell ------------------------------------------------------------------------------------------
def test_identity_and_capabilities(sb):
    info = sb.ping()
    assert info["uid"] == 1000 and info["cwd"] == "/testbed"
    r = sb.shell("id -un; hostname; pwd")
    assert r.ok and r.stdout.split() == ["agent", "sandbox", "/testbed"]
    caps = sb.capabilities()
    assert caps["runtime"] == "bwrap" and caps["isolated"] and "net" in caps["isolation"] and not caps["network"]
    assert caps["limits"]["processes"]  # says which mechanism holds (pids cgroup here, or why none)


def test_shell_state_persists_and_exit_codes(sb):
    r = sb.shell("mkdir -p /tmp/w && cd /tmp/w && export FOO=bar && greet() { echo hi $1; }")
    assert r.ok and r.stdout == ""
    r = sb.shell("pwd; echo $FOO; greet you")
    assert r.stdout == "/tmp/w\nbar\nhi you\n"
    assert sb.shell("false").exit_code == 1
    assert sb.shell("(exit 7)").exit_code == 7
    assert sb.shell("nosuchcommand").exit_code == 127
    sb.shell("cd /testbed")


def test_shell_multiline_long_and_stdin(sb):
    r = sb.shell("for i in 1 2 3; do\n  echo line$i\ndone\ncat <<'EOF'\nheredoc $HOME\nEOF")
    assert r.stdout == "line1\nline2\nline3\nheredoc $HOME\n"
    long = "echo " + "x" * 20000  # longer than a tty line (4 KiB): goes through the command file
    assert sb.shell(long).stdout == "x" * 20000 + "\n"
    r = sb.shell("cat; echo after", timeout=5)  # stdin is /dev/null: cat returns at once instead of hanging
    assert r.ok and r.stdout == "after\n"
    assert "__ENVHUB_" not in sb.shell("echo '__ENVHUB_'").stdout.replace("__ENVHUB_\n", "")


@pytest.mark.parametrize("command, code, out", [
    ("echo 'it'\\''s' \"a!b\" $((1+2))", 0, "it's a!b 3\n"),             # quotes and history characters
    ("x='a b'; echo \"$x\" # comment", 0, "a b\n"),
    ("echo héllo", 0, "héllo\n"),                                            # non-ASCII: via the command file
    ("printf 'a\\x01b' | od -An -c", 0, "   a 001   b\n"),
    ("echo (", 2, None),                                                      # syntax errors are results
    ("echo '", 2, None),
    ("if true; then\n  echo (\nfi", 2, None),
])
def test_shell_quoting_and_syntax_errors(sb, command, code, out):
    r = sb.shell(command, timeout=5)
    assert r.exit_code == code and not r.timed_out
    if out is not None:
        assert r.stdout == out
    else:
        assert "syntax error" in r.stdout or "unexpected EOF" in r.stdout


def test_shell_timeout_interrupts_and_shell_survives(sb):
    sb.shell("export KEEP=1; cd /tmp")
    t = time.monotonic()
    r = sb.shell("sleep 100", timeout=1)
    assert r.timed_out and r.exit_code == 124 and not r.restarted and time.monotonic() - t < 10
    r = sb.shell("while true; do :; done", timeout=1)  # a builtin loop: Ctrl-C reaches the shell itself
    assert r.timed_out and not r.restarted
    r = sb.shell("trap '' INT; sleep 100", timeout=1)  # ignores Ctrl-C: its process group is killed
    assert r.timed_out
    r = sb.shell("echo $KEEP; pwd")
    assert r.ok and r.stdout == "1\n/tmp\n"
    sb.shell("cd /testbed")


def test_shell_exit_starts_a_new_shell(sb):
    r = sb.shell("exit 3")
    assert r.restarted and "shell exited" in r.stdout
    r = sb.shell("echo back; pwd")
    assert r.ok and r.stdout == "back\n/testbed\n"


def test_output_cap_on_shell(sb):
    r = sb.shell("seq 1 200000", output_limit=1000)
    assert r.ok and r.cut > 1_000_000
    assert r.stdout.startswith("1\n2\n3\n") and r.stdout.endswith("199999\n200000\n")
    assert "bytes of output cut" in r.stdout


# ---- exec --------------------------------------------------------------------------------------------------------
def test_exec_argv_string_stdin_env_cwd(sb):
    r = sb.exec(["python3", "-c", "import sys; print(sys.stdin.read().upper())"], input="hello")
    assert r.ok and r.stdout == "HELLO\n"
    r = sb.exec("echo $A-$PWD; echo err >&2; exit 4", env={"A": "x"}, cwd="/tmp")
    assert (r.exit_code, r.stdout, r.stderr) == (4, "x-/tmp\n", "err\n")
    r = sb.exec(["/no/such/program"])
    assert r.exit_code == 127 and "No such file" in r.stderr
    r = sb.exec(["python3", "-c", "print(1)"], timeout=5)
    assert r.ok and r.duration_s < 5


def test_exec_limits(sb):
    r = sb.exec(["sleep", "30"], timeout=1)
    assert r.timed_out and r.exit_code == 124 and r.signal == 9
    r = sb.exec(["python3", "-c", "x = bytearray(600 << 20)"], memory_mb=200)
    assert r.exit_code == 1 and "MemoryError" in r.stderr
    r = sb.exec(["python3", "-c", "while True: pass"], cpu_s=1, timeout=20)
    assert not r.timed_out and r.signal in (9, 24)  # SIGXCPU at the soft limit
    r = sb.exec("head -c 3000000 /dev/zero > /tmp/big", max_file_mb=1)
    assert r.exit_code == 128 + 25 and "File size limit exceeded" in r.stderr  # SIGXFSZ
    r = sb.exec("head -c 5000000 /dev/zero | tr '\\0' a", output_limit=2000)
    assert r.ok and r.cut == 5_000_000 - 2000 and len(r.stdout) < 2200


def test_exec_background_child_does_not_block(sb):
    t = time.monotonic()
    r = sb.exec("sleep 60 & echo started")
    assert r.ok and r.stdout == "started\n" and time.monotonic() - t < 5


# ---- files, editor, IPython --------------------------------------------------------------------------------------
def test_read_write_files(sb):
    data = bytes(range(256)) * 10
    sb.write_file("/testbed/sub/dir/blob.bin", data)
    assert sb.read_file("/testbed/sub/dir/blob.bin") == data
    sb.write_file("/tmp/t.txt", "héllo")
    assert sb.read_text("/tmp/t.txt") == "héllo"
    with pytest.raises(SandboxError, match="No such file"):
        sb.read_file("/testbed/missing")
    with pytest.raises(SandboxError, match="Read-only|Permission"):
        sb.write_file("/usr/evil", "x")


def test_python_state_persists(sb):
    assert sb.python("import math\nvalue = math.factorial(5)").ok
    r = sb.python("value + 1")
    assert r.ok and r.stdout.strip() == "121"
    r = sb.python("print('before'); 1 / 0")
    assert r.exit_code == 1 and "before" in r.stdout and "ZeroDivisionError" in r.stdout
    r = sb.python("import time\nwhile True: time.sleep(0.01)", timeout=1)
    assert r.timed_out and "interrupted" in r.stdout
    assert sb.python("value").stdout.strip() == "120"


# ---- isolation ---------------------------------------------------------------------------------------------------
def test_writes_outside_workspace_fail(sb):
    for path in ("/usr/x", "/etc/x", "/root/x", "/x", "/run/envhub-agent/x", os.path.realpath(os.sys.prefix) + "/x"):
        r = sb.shell(f"touch {path}")
        assert r.exit_code != 0, path
        assert not os.path.exists(path), path
    assert sb.shell("touch /testbed/ok /tmp/ok").ok
    r = sb.shell("ls /root; ls /work 2>&1; test -e /etc/shadow || echo no-shadow; ls /home 2>&1 | head -1")
    assert "no-shadow" in r.stdout and "envhub" not in r.stdout  # the repo and host homes are not visible


def test_no_network(sb):
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    try:
        code = (f"import socket\ns = socket.socket(); s.settimeout(3)\n"
                f"try:\n    s.connect(('127.0.0.1', {port})); print('CONNECTED')\n"
                f"except OSError as e: print('refused', e)\n"
                f"try:\n    socket.create_connection(('8.8.8.8', 53), 3); print('OUT')\n"
                f"except OSError as e: print('unreachable', e)")
        r = sb.exec(["python3", "-c", code], timeout=15)
        assert "CONNECTED" not in r.stdout and "OUT" not in r.stdout and "unreachable" in r.stdout
        links = sb.shell("cat /proc/net/dev | tail -n +3 | cut -d: -f1").stdout.split()
        assert links == ["lo"]
    finally:
        srv.close()


def test_workspace_copied_and_private(tmp_path, fresh):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text("X = 1\n")
    os.symlink("pkg/mod.py", tmp_path / "link.py")
    box = fresh(workspace_from=str(tmp_path))
    assert box.shell("cat /testbed/pkg/mod.py; readlink /testbed/link.py").stdout == "X = 1\npkg/mod.py\n"
    assert box.shell("echo changed > /testbed/pkg/mod.py && touch /testbed/new").ok
    assert (tmp_path / "pkg" / "mod.py").read_text() == "X = 1\n" and not (tmp_path / "new").exists()


def test_tmpfs_workspace_has_a_size_cap(tmp_path, fresh):
    (tmp_path / "a.txt").write_text("from host\n")
    box = fresh(workspace_from=str(tmp_path), workspace_size_mb=4)
    assert box.shell("cat /testbed/a.txt").stdout == "from host\n"
    r = box.shell("head -c 8000000 /dev/zero > /testbed/fill")
    assert r.exit_code != 0 and "No space left" in r.stdout
    assert box.shell("echo ok").stdout == "ok\n"


# ---- concurrency and lifecycle -----------------------------------------------------------------------------------
def test_threads_share_one_sandbox_safely(sb):
    out: dict[int, str] = {}

    def worker(i: int) -> None:
        out[i] = sb.exec(f"echo {i}").stdout if i % 2 else sb.shell(f"echo {i}").stdout

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert out == {i: f"{i}\n" for i in range(12)}


def test_stop_kills_orphans_and_removes_everything(fresh):
    box = fresh()
    box.shell("nohup sleep 1000 >/dev/null 2>&1 & setsid sleep 1001 & (sleep 1002 &) ; echo")
    box.exec("setsid sleep 1003 >/dev/null 2>&1 < /dev/null & disown")
    assert len(lifecycle.sandbox_pids()[box.id]) >= 7  # bwrap, its PID 1, server, shell, 4 sleeps
    box.stop()
    assert box.id not in lifecycle.sandbox_pids()
    assert leftovers([box.id]) == []
    box.stop()  # idempotent
    with pytest.raises(SandboxError, match="stopped"):
        box.shell("echo")
    assert box not in lifecycle.live()


def test_many_sandboxes_at_once(fresh):
    boxes = [fresh() for _ in range(4)]
    results: dict[int, str] = {}

    def work(i: int) -> None:
        boxes[i].shell(f"echo {i} > /testbed/me")
        results[i] = boxes[i].shell("cat /testbed/me").stdout

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: f"{i}\n" for i in range(4)}
    assert len({b.id for b in boxes}) == 4


def test_start_from_a_worker_thread_survives_the_thread(fresh):
    box: list = []
    t = threading.Thread(target=lambda: box.append(fresh()))
    t.start()
    t.join()
    time.sleep(0.2)  # PR_SET_PDEATHSIG would have fired when the thread ended had it forked bwrap
    assert box[0].shell("echo alive").stdout == "alive\n"


def test_bad_spec_gives_a_clear_error():
    with pytest.raises(SandboxError, match="workspace_from"):
        start(SandboxSpec(runtime="bwrap", workspace_from="/definitely/missing"))
    with pytest.raises(SandboxError, match="singularity"):
        start(SandboxSpec(runtime="bwrap", image="/tmp/x.sif"))


def test_stop_does_not_wait_for_a_running_command(fresh):
    box = fresh()
    errors: list[Exception] = []
    command = ["sleep", f"60.{random.randrange(10**6):06d}"]  # its own: another run's "sleep 60" is not this one

    def long_call() -> None:
        try:
            box.shell(" ".join(command), timeout=120)
        except SandboxError as e:
            errors.append(e)

    t = threading.Thread(target=long_call)
    t.start()
    # stop only once the command really runs (a fixed sleep raced a loaded machine: the stop came first)
    deadline = time.monotonic() + 30
    while not any(p.info["cmdline"] == command for p in psutil.process_iter(["cmdline"])):
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)
    t0 = time.monotonic()
    box.stop()
    t.join(timeout=10)
    assert time.monotonic() - t0 < 5 and not t.is_alive()
    assert errors and "stopped" in str(errors[0])
    assert box.id not in lifecycle.sandbox_pids()


def test_rootfs_image(tmp_path, fresh):
    from sandbox_helpers import make_rootfs

    root = str(tmp_path / "rootfs")
    os.makedirs(root)
    try:
        make_rootfs(root)
    except OSError as e:  # hard links need /tmp and /usr on one filesystem
        pytest.skip(f"cannot build a hard-link rootfs here: {e}")
    box = fresh(image=root)
    r = box.shell("ls /; python3 -c 'import sys; print(sys.prefix)'")
    assert r.ok and r.stdout.split() == ["bin", "dev", "etc", "lib", "lib64", "proc", "run", "testbed", "tmp", "usr",
                                         "/usr"]
    assert box.exec(["python3", "-c", "print(6 * 7)"]).stdout == "42\n"
    r = box.python("1 + 1")  # the image has no IPython: a marked result saying so, and the server lives on
    assert r.error and "IPython" in r.stdout
    assert box.shell("echo still").stdout == "still\n"


def test_exec_status_is_the_commands_own(sb):
    # closes its output early and keeps working: not killed when the pipes close, its own status is reported
    code = "import os, time\nos.close(1); os.close(2)\ntime.sleep(0.5)\nraise SystemExit(3)"
    r = sb.exec(["python3", "-c", code], timeout=10)
    assert r.exit_code == 3 and r.signal is None and not r.timed_out
    r = sb.exec("sleep 30 & exit 0", timeout=10)  # a straggler holding the pipes is reaped, status stays 0
    assert r.exit_code == 0 and r.signal is None
    r = sb.exec(["python3", "-c", "import os; os.close(1); os.close(2); import time; time.sleep(30)"], timeout=1)
    assert r.timed_out and r.signal == 9


def test_special_files_are_refused_not_hung(sb):
    assert sb.shell("mkfifo /tmp/fifo").ok
    with pytest.raises(SandboxError, match="not a regular file"):
        sb.read_file("/tmp/fifo")
    with pytest.raises(SandboxError, match="not a regular file"):
        sb.write_file("/tmp/fifo", "x")
    ok, text = sb.edit("view", "/tmp/fifo")
    assert not ok and "not a regular file" in text
    r = sb.exec(["true"], cwd="/no/such/dir")
    assert r.exit_code == 127 and "/no/such/dir" in r.stderr
