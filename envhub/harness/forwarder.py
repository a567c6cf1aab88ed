"""Runs inside the sandbox: ``127.0.0.1:PORT`` -> the gateway's Unix socket (bound in read-only).

The sandbox has no network but its own loopback; the harness sees an ordinary base URL and can reach nothing but
the gateway's model routes. It starts on the critical path of every harness episode, so it imports nothing but the
C modules ``_socket``, ``_thread`` and ``posix`` and runs as ``python3 -I -S``: ~10 ms to listening, where ``socket`` and
``threading`` alone took ~30 ms more to import (and ``asyncio`` ~100 ms; ``benchmarks/harness.py``).

    python3 -I -S forwarder.py PORT SOCKET_PATH

The command returns once the port is listening (exit 0; non-zero, with the reason on stderr, if it could not
listen): the serving process is a fork, so the caller starts the harness right after it with no polling and no
race. A thread per direction per connection; one side's end of stream is passed on as a half-close
(``shutdown(SHUT_WR)``), and a connection is closed when both directions are done.
"""
import _socket
import _thread
import posix  # os without its Python half (posixpath, stat...): ~2 ms less
import sys

SHUT_WR = 1


def _pipe(src, dst, done):
    try:
        while True:
            data = src.recv(1 << 16)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    try:
        dst.shutdown(SHUT_WR)
    except OSError:
        pass
    with done[0]:
        done[1] += 1
        last = done[1] == 2
    if last:
        src.close()
        dst.close()


def _handle(conn, path):
    up = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        up.close()
        conn.close()
        return
    done = [_thread.allocate_lock(), 0]
    _thread.start_new_thread(_pipe, (up, conn, done))
    _pipe(conn, up, done)


def serve(listener, path):
    while True:
        fd, _ = listener._accept()
        conn = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd)
        _thread.start_new_thread(_handle, (conn, path))


def listen(port):
    s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    s.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(128)
    return s


if __name__ == "__main__":
    try:
        listener = listen(int(sys.argv[1]))
    except OSError as e:
        sys.stderr.write(f"envhub forwarder: cannot listen on 127.0.0.1:{sys.argv[1]}: {e}\n")
        sys.exit(1)
    if posix.fork():  # the parent's exit tells the caller the port is listening
        posix._exit(0)
    serve(listener, sys.argv[2])
