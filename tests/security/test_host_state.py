"""Class 1 attacks: code in the sandbox reaching host files through the sandbox's own state directory.

The run directory (``/run/envhub`` inside, ``<state>/run`` on the host) is writable from inside. Each test plants a
symlink there, then makes the host touch the planted path again (by killing the action server, which the host
relaunches), and checks that no host file was created, appended to, read or connected to -- and that the sandbox
still answers the next request.
"""
from __future__ import annotations

import os
import socket
import threading

from envhub.sandbox import SandboxError


def _kill_server(sb) -> None:
    """Kill the action server from inside (the agent can: same uid); the next request relaunches it."""
    pid = sb.ping()["pid"]
    sb.exec(["bash", "-c", f"kill -9 {pid}"], timeout=5)


def test_symlinked_server_log_creates_no_host_file(box, tmp_path):
    sb = box()
    created = tmp_path / "created-by-agent"
    secret = tmp_path / "secret"
    secret.write_text("HOST-SECRET-CONTENT\n")
    r = sb.shell(f"ln -sf {created} /run/envhub/server.log; ln -sf {secret} /run/envhub/server.log.1; "
                 f"ls /run/envhub", timeout=10)
    assert r.ok, r.output
    _kill_server(sb)
    r = sb.shell("echo still-serving", timeout=10)
    assert "still-serving" in r.output
    assert not created.exists(), "the host created a file chosen by the agent through the sandbox's log"
    assert "HOST-SECRET" not in r.output
    assert secret.read_text() == "HOST-SECRET-CONTENT\n"


def test_symlinked_socket_is_not_followed_by_the_host(box, tmp_path):
    """The agent swaps the socket for a symlink to a host socket; the host must not connect to it."""
    sb = box()
    host_sock = str(tmp_path / "h.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(host_sock)
    listener.listen(4)
    listener.settimeout(0.2)
    contacted = []

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            contacted.append(conn.recv(4096))
            conn.close()

    stop = threading.Event()
    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        r = sb.exec(["bash", "-c", f"mv /run/envhub/server.sock /run/envhub/real.sock && "
                                   f"ln -s {host_sock} /run/envhub/server.sock"], timeout=5)
        assert r.ok, r.output
        sb._drop_connection()  # the host reconnects at its next request (as it does after any error)
        try:
            sb.ping()
            raise AssertionError("the host talked to something at a planted symlink")
        except SandboxError as e:  # refused: the server is relaunched, the caller gets a marked error
            assert sb.state_dir not in str(e) and host_sock not in str(e), "a host path leaked into the error"
        assert sb.ping()["pid"]
        assert contacted == [], f"the host sent {contacted!r} to a socket chosen by the agent"
        assert sb.shell("echo ok", timeout=10).output.strip().endswith("ok")
    finally:
        stop.set()
        t.join(2)
        listener.close()


def test_hostfs_refuses_links_and_fifos(tmp_path):
    """The helpers themselves: a symlink is never followed, a FIFO never blocks, a log is never created through a
    link."""
    from envhub.sandbox import hostfs

    target = tmp_path / "target"
    target.write_text("secret")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert hostfs.read_tail(str(link)) is None
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert hostfs.read_tail(str(fifo)) is None
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "would-be-created")
    try:
        hostfs.open_log(str(dangling))
        raise AssertionError("open_log followed a symlink")
    except OSError:
        pass
    assert not (tmp_path / "would-be-created").exists()
    try:
        hostfs.connect_unix(str(link))
        raise AssertionError("connect_unix accepted a symlink")
    except OSError:
        pass
