"""Running the rollout service: :func:`serve` (blocking, what ``envhub serve`` calls) and :class:`ServerThread`
(in-process, for tests, notebooks and benchmarks: the same uvicorn server on its own event loop in a thread, real
HTTP). The plumbing every envhub server shares (binding rules, sockets, the thread) is :mod:`envhub.http.server`.
"""
from __future__ import annotations

from typing import Any

from envhub.http import server as http_server
from envhub.http.server import bind, check_binding, raise_fd_limit, serve_until_stopped


def make_server(service: Any, *, host: str = "127.0.0.1", port: int = 8006, token: str | None = None,
                autostart: bool = True, log_level: str = "warning", backlog: int = 8192,
                max_body_bytes: int | None = None, header_timeout_s: float | None = None,
                body_timeout_s: float | None = None, max_connections: int | None = None) -> Any:
    """A configured ``uvicorn.Server`` for ``service`` (not started). The client limits default to those in
    :mod:`envhub.http.limits`."""
    import uvicorn

    from envhub.http import limits
    from envhub.service.app import create_app

    class Server(uvicorn.Server):
        async def shutdown(self, sockets: Any = None) -> None:
            # uvicorn lets in-flight requests finish before the app's shutdown runs, and a /process request waits
            # for its rollout (minutes): stop the service first, so every waiting request gets its `cancelled`
            # answer and every sandbox is gone, then let uvicorn close the connections
            try:
                await service.stop()
            finally:
                await super().shutdown(sockets)

    check_binding(host, token)
    app = create_app(service, token=token, autostart=autostart,
                     max_body_bytes=max_body_bytes or limits.DEFAULT_MAX_BODY_BYTES,
                     body_timeout_s=body_timeout_s or limits.DEFAULT_BODY_TIMEOUT_S)
    http = limits.protocol_class(max_connections or limits.default_max_connections(),
                                 header_timeout_s or limits.DEFAULT_HEADER_TIMEOUT_S)
    # h11 keeps-alive connections a trainer reuses across calls; a long timeout avoids reconnect storms
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, backlog=backlog, http=http,
                            timeout_keep_alive=120, access_log=False, lifespan="on", timeout_graceful_shutdown=30)
    return Server(config)


def serve(service: Any, *, host: str = "127.0.0.1", port: int = 8006, token: str | None = None,
          autostart: bool = True, log_level: str = "warning", on_ready: Any = None, **limits: Any) -> None:
    """Serve until SIGINT/SIGTERM; on the way out every job is cancelled and every sandbox stopped. ``limits``:
    ``max_body_bytes``, ``header_timeout_s``, ``body_timeout_s``, ``max_connections`` (see :func:`make_server`)."""

    raise_fd_limit()
    server = make_server(service, host=host, port=port, token=token, autostart=autostart, log_level=log_level,
                         **limits)
    serve_until_stopped(server, bind(host, port), on_ready)


class ServerThread(http_server.ServerThread):
    """The rollout service served over real HTTP from a background thread: ``with ServerThread(service) as srv:
    srv.url``. ``stop()`` shuts it down as a signal would (lifespan shutdown: jobs cancelled, sandboxes stopped)."""

    def __init__(self, service: Any, *, autostart: bool = True, **kw: Any):
        super().__init__(service, make=lambda svc, **k: make_server(svc, autostart=autostart, **k), **kw)
