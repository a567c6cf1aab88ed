"""The in-sandbox forwarder (``envhub/harness/forwarder.py``), run on the host as the harness script runs it: the
command returns only once its port listens (the harness starts right after it, with no wait), bytes pass both
ways, a client's end of stream reaches the gateway side, and a port it cannot take is an exit status."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading

import pytest

from envhub.harness.episode import FORWARDER


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def upstream(tmp_path):
    """A Unix-socket server that reads a request to its end (the client's half-close) and answers it reversed."""
    path = str(tmp_path / "gw.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(16)

    def answer(conn):
        with conn:
            data = b""
            while chunk := conn.recv(65536):
                data += chunk
            conn.sendall(data[::-1])

    def loop():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    yield path
    srv.close()


def _start(port: int, path: str) -> tuple[int, str, int]:
    """``(exit status, its output, process group)``. Output to a file, as the harness script has it (the forked
    server keeps its descriptors); in its own session, the server stays in the group led by the command's pid."""
    log = os.path.join(os.path.dirname(path), "fwd.log")
    with open(log, "w") as f:
        p = subprocess.Popen([sys.executable, "-I", "-S", str(FORWARDER), str(port), path], stdout=f, stderr=f,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        p.wait(timeout=30)
    with open(log) as f:
        return p.returncode, f.read(), p.pid


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _ask(port: int, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(payload)
        c.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := c.recv(65536):
            out += chunk
        return out


def test_listening_when_the_command_returns_and_bytes_pass_both_ways(upstream):
    port = _free_port()
    rc, err, group = _start(port, upstream)
    try:
        assert rc == 0, err
        # no retry, no sleep: the port must already listen (the harness is started right after this command)
        assert _ask(port, b"hello gateway") == b"yawetag olleh"
        big = os.urandom(3 << 20)
        results: dict[int, bytes] = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, _ask(port, big + bytes([i]))))
                   for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert all(results[i] == (big + bytes([i]))[::-1] for i in range(4))
    finally:
        _kill_group(group)


def test_a_port_it_cannot_take_is_an_exit_status(upstream):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        rc, err, group = _start(taken.getsockname()[1], upstream)
    _kill_group(group)
    assert rc != 0
    assert "Address already in use" in err
