"""What every envhub HTTP server shares (the rollout service and the gateway): binding rules, sockets, the
descriptor limit, running a configured uvicorn server until a signal, and :class:`ServerThread` (the same server on
its own event loop in a thread, real HTTP: tests, notebooks, benchmarks, the harness envs).

Binding: loopback (``127.0.0.1``) by default. Any other address needs a bearer token (:func:`check_binding`): an
open envhub server runs code in sandboxes, or spends a model, on behalf of whoever can reach it.
"""
from __future__ import annotations

import socket
import threading
import time
from typing import Any


def is_loopback(host: str) -> bool:
    """Whether ``host`` only accepts connections from this machine (``LOCALHOST``, ``127.1``, ``::ffff:127.0.0.1``
    included: see :func:`envhub.http.limits.is_loopback_name`)."""
    from envhub.http.limits import is_loopback_name

    return is_loopback_name(host)


def check_binding(host: str, token: str | None, *, flag: str = "envhub serve --token",
                  env: str = "ENVHUB_SERVICE_TOKEN") -> None:
    """Refuse a non-loopback ``host`` without a token; the message names the server's own ``flag`` and ``env``."""
    if not is_loopback(host) and not token:
        raise ValueError(f"refusing to serve on {host} without a bearer token: pass a token ({flag}, or {env}), "
                         "or bind to 127.0.0.1")


def bind(host: str, port: int) -> socket.socket:
    """A bound TCP socket (``port=0``: a free port), so the caller knows the port before the server starts."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP: asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP, and without it Nagle
    # + delayed ACKs add 40 ms to every reply written in two parts (headers, then body)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


def bind_unix(path: str) -> socket.socket:
    """A bound Unix-domain stream socket at ``path`` (replacing a stale one), readable and writable by anyone who can
    reach the path: the gateway serves sandboxes through one bound into them."""
    import os

    if os.path.exists(path):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    os.chmod(path, 0o666)
    return sock


def raise_fd_limit() -> int:
    """Raise the open-files limit (every in-flight ``/process`` holds a connection); returns the soft limit."""
    from envhub.fdlimit import raise_nofile_limit

    return raise_nofile_limit()[0]


def serve_until_stopped(server: Any, sock: socket.socket, on_ready: Any = None, *, run: Any = None) -> None:
    """Run a configured uvicorn ``server`` on ``sock`` until SIGINT/SIGTERM; ``on_ready(port)`` once it listens.
    ``run``: what runs the main coroutine (``asyncio.run`` by default; the gateway passes ``uvloop.run``)."""
    import asyncio

    async def main() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if server.started and on_ready is not None:
            on_ready(sock.getsockname()[1])
        await task

    (run or asyncio.run)(main())


class ServerThread:
    """An envhub server over real HTTP from a background thread: ``with ServerThread(app, make=factory) as srv:
    srv.url``. ``make(app, host=, port=, token=, log_level=, **limits)`` builds the configured uvicorn server (the
    rollout service's: :class:`envhub.service.server.ServerThread`; the gateway's: ``GatewayThread``).

    ``stop()`` shuts the server down as a signal would (lifespan shutdown: the app stops its work first).
    """

    def __init__(self, service: Any, *, make: Any, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                 log_level: str = "warning", uds: str | None = None, loop_factory: Any = None, **limits: Any):
        self.service = service
        self.loop_factory = loop_factory  # makes the thread's event loop (None: asyncio's; the gateway: uvloop's)
        self.server = make(service, host=host, port=port, token=token, log_level=log_level, **limits)
        self.server.config.install_signal_handlers = False  # uvicorn < 0.29 reads this; newer ones skip in threads
        self.uds = uds
        self.sock = bind_unix(uds) if uds else bind(host, port)
        self.host = host
        self.port = 0 if uds else self.sock.getsockname()[1]
        self.loop: Any = None
        self._thread = threading.Thread(target=self._run, name=f"envhub-service-{self.port}", daemon=True)
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"

    def _run(self) -> None:
        import asyncio

        try:
            self.loop = (self.loop_factory or asyncio.new_event_loop)()
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(self.server.serve(sockets=[self.sock]))
        except BaseException as e:  # reported by start()
            self._error = e
        finally:
            if self.loop is not None:
                self.loop.close()

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if self._error is not None or not self._thread.is_alive():
                raise RuntimeError(f"the server failed to start: {self._error!r}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"the server did not start within {timeout}s")
            time.sleep(0.01)
        return self

    def call(self, coro: Any, timeout: float | None = 60.0) -> Any:
        """Run ``coro`` on the server's event loop (tests use it to reach into the service) and return its result."""
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the server did not stop within {timeout}s")

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
