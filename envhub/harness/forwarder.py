"""Runs inside the sandbox: ``127.0.0.1:PORT`` -> the gateway's Unix socket (bound in read-only).

The sandbox has no network but its own loopback; the harness sees an ordinary base URL and can reach nothing but
the gateway's model routes. Standard library only (it runs on whatever python3 the sandbox has), and only
``socket``, ``threading`` and ``os``: it starts on the critical path of every harness episode, run as
``python3 -I -S`` (asyncio alone took ~100 ms more to import; ``benchmarks/harness.py``).

    python3 -I -S forwarder.py PORT SOCKET_PATH

The command returns once the port is listening (exit 0; non-zero if it could not listen): the serving process is
a fork, so the caller starts the harness right after it with no polling and no race. A thread per direction per
connection; one side's end of stream is passed on as a half-close (``shutdown(SHUT_WR)``), and a connection is
closed when both directions are done.
"""
import os
import socket
import sys
import threading


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
        dst.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    with done[0]:
        done[1] += 1
        last = done[1] == 2
    if last:
        src.close()
        dst.close()


def _handle(conn, path):
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        up.close()
        conn.close()
        return
    done = [threading.Lock(), 0]
    threading.Thread(target=_pipe, args=(up, conn, done), daemon=True).start()
    _pipe(conn, up, done)


def serve(listener, path):
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_handle, args=(conn, path), daemon=True).start()


def listen(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(128)
    return s


if __name__ == "__main__":
    listener = listen(int(sys.argv[1]))
    if os.fork():  # the parent's exit tells the caller the port is listening
        os._exit(0)
    serve(listener, sys.argv[2])
