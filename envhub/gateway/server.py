"""Serving the gateway: :func:`serve` (what ``envhub gateway`` runs) and :class:`GatewayThread` (in-process, real
HTTP on loopback: tests, notebooks, the harness envs). uvicorn, as the rollout service, with its httptools protocol
when installed (:func:`http_protocol`; the rollout service keeps h11) under a request-head size limit, a connection
cap and a request-head deadline (:mod:`envhub.http.guarded_httptools`, :mod:`envhub.http.limits`); loopback by
default, a token required on any other address. The event loop is uvloop's when installed (:func:`event_loop`). An
``envhub gateway`` process also tunes its garbage collector (:func:`tune_gc`).

Shutdown: the first SIGINT/SIGTERM stops every wait for a session's end at once (such an export answers 503 and
keeps its session), gives in-flight model calls ``GRACEFUL_SHUTDOWN_S`` to finish, then cancels them.
"""
from __future__ import annotations

import functools
import socket
from typing import Any

from envhub.gateway.core import Gateway
from envhub.http.server import ServerThread, bind, check_binding, raise_fd_limit, serve_until_stopped

GRACEFUL_SHUTDOWN_S = 30.0
TOKEN_FLAG, TOKEN_ENV = "envhub gateway --token", "ENVHUB_GATEWAY_TOKEN"


def event_loop(choice: str | None = None) -> tuple[Any, Any]:
    """The event loop the gateway serves on: ``(run, new_loop)``, uvloop's when it is installed (the serve extra
    installs it), else asyncio's; ``choice`` (or ``ENVHUB_GATEWAY_LOOP``): ``"uvloop"``, ``"asyncio"`` or
    ``"auto"`` (the default).

    Why: uvloop's transports and loop are C (libuv), and on the 64 KB agent loop asyncio's pure-Python socket
    transport, selector and handles were a large share of the gateway's per-call CPU (#28 item 10). The HTTP protocol
    is the same guarded one either way (:func:`http_protocol`), so what a client sees (limits, 413/408, streaming, every byte of a reply) is
    unchanged; the gateway's tests run on the loop this picks.
    """
    import asyncio
    import os

    choice = choice or os.environ.get("ENVHUB_GATEWAY_LOOP") or "auto"
    if choice not in ("auto", "uvloop", "asyncio"):
        raise ValueError(f"ENVHUB_GATEWAY_LOOP must be auto, uvloop or asyncio; got {choice!r}")
    if choice != "asyncio":
        try:
            import uvloop
        except ImportError:
            if choice == "uvloop":
                raise
        else:
            return uvloop.run, uvloop.new_event_loop
    return asyncio.run, asyncio.new_event_loop


def http_protocol(choice: str | None = None) -> str:
    """The HTTP/1.1 implementation the gateway serves with: ``"httptools"`` (C, under
    :class:`envhub.http.guarded_httptools.GuardedHttpToolsProtocol`'s guards) when installed, else ``"h11"``;
    ``choice`` (or ``ENVHUB_GATEWAY_HTTP``): ``"httptools"``, ``"h11"`` or ``"auto"`` (the default).

    Why: on the 64 KB agent loop h11's pure-Python parsing and writing cost ~0.5 ms of server CPU per call more (#28
    item 10). The guards (head size, head deadline, connection cap) and the answers to malformed requests are the
    h11 protocol's: ``tests/gateway/test_http_attacks.py`` runs the limits and the attacks on both.
    """
    import os

    choice = choice or os.environ.get("ENVHUB_GATEWAY_HTTP") or "auto"
    if choice not in ("auto", "httptools", "h11"):
        raise ValueError(f"ENVHUB_GATEWAY_HTTP must be auto, httptools or h11; got {choice!r}")
    if choice != "h11":
        try:
            import httptools  # noqa: F401
        except ImportError:
            if choice == "httptools":
                raise
        else:
            return "httptools"
    return "h11"


GC_THRESHOLDS = (10_000, 10, 10)


def tune_gc(thresholds: tuple[int, int, int] = GC_THRESHOLDS) -> None:
    """Set the collector for a process that only serves the gateway (``envhub gateway``; not ``GatewayThread``, whose
    process is the caller's): what exists now (modules, the tokenizer, the codec) is collected once and frozen out of
    every later collection, and the young generation is collected every ``thresholds[0]`` net allocations instead of
    700.

    Why (#28 item 10, measured with ``gc.callbacks`` in the server under ``benchmarks/gateway_throughput.py``): the
    collector took about 1 ms of the ~4 ms of server CPU per call. A full collection traversed the ~350,000 objects
    start-up left (the tokenizer's, the modules') and every live session's token lists, 250-290 ms each, a few per
    10 s of load; young collections every 700 allocations (~550 in 13 s) traversed each call's fresh 16k-token lists
    again and again. Frozen, start-up's objects are never traversed again (they live as long as the process anyway);
    at 10,000 the same load made 10 young collections and no full one: ~0.07 ms per call in all. Cyclic garbage is
    still collected, in larger batches: the gateway makes little (an exception kept past its ``except``, a
    cancelled task), and what waits is bounded by the threshold (``tests/gateway/test_gc_tuning.py``).
    """
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)


def check_gateway_binding(host: str, token: str | None) -> None:
    """Refuse a non-loopback address without an admin key, naming the gateway's flag and variable.

    Args:
        host: the address to serve on.
        token: the admin key (``envhub gateway --token``, or ``ENVHUB_GATEWAY_TOKEN``).

    Raises:
        ValueError: ``host`` is not a loopback address and ``token`` is empty.
    """
    check_binding(host, token, flag=TOKEN_FLAG, env=TOKEN_ENV)


def make_server(gateway: Gateway, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                log_level: str = "warning", model_name: str = "envhub", max_body_bytes: int | None = None,
                header_timeout_s: float | None = None, body_timeout_s: float | None = None,
                max_connections: int | None = None, model_only: bool = False) -> Any:
    """The gateway's uvicorn server, configured and not started: the ASGI app (:mod:`envhub.gateway.app`) over the
    guarded HTTP protocol of :func:`http_protocol` (head size, connection cap, head deadline),
    ``GRACEFUL_SHUTDOWN_S`` for in-flight calls at shutdown.

    Args:
        gateway: the :class:`~envhub.gateway.core.Gateway` to serve.
        host: the address it will serve on (checked by :func:`check_gateway_binding`).
        port: the port for uvicorn's configuration (the caller binds the socket it serves on).
        token: the admin key the control routes require (none required when ``None``).
        log_level: uvicorn's log level.
        model_name: the model id ``GET /v1/models`` lists.
        max_body_bytes: the largest request body (``None``/0: :data:`envhub.http.limits.DEFAULT_MAX_BODY_BYTES`).
        header_timeout_s: the deadline for a request's head (``None``/0: the limits module's default).
        body_timeout_s: the deadline for a request's body (``None``/0: the limits module's default).
        max_connections: the connection cap (``None``/0: :func:`envhub.http.limits.default_max_connections`).
        model_only: serve the model routes only (what a sandboxed agent reaches: no sessions, rewards or exports).

    Returns:
        The server (a ``uvicorn.Server`` that tells the app when shutdown begins); run it with
        ``server.serve(sockets=[sock])``.

    Raises:
        ValueError: ``host`` is not a loopback address and no ``token`` is given.
    """
    import uvicorn

    from envhub.gateway.app import GatewayApp
    from envhub.http import guarded_httptools, limits

    check_gateway_binding(host, token)
    app = GatewayApp(gateway, admin_key=token, model_name=model_name,
                     max_body_bytes=max_body_bytes or limits.DEFAULT_MAX_BODY_BYTES,
                     body_timeout_s=body_timeout_s or limits.DEFAULT_BODY_TIMEOUT_S, model_only=model_only)
    guarded = limits if http_protocol() == "h11" else guarded_httptools
    http = guarded.protocol_class(max_connections or limits.default_max_connections(),
                                  header_timeout_s or limits.DEFAULT_HEADER_TIMEOUT_S)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, http=http, timeout_keep_alive=120,
                            access_log=False, lifespan="on", backlog=4096, proxy_headers=False,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    # proxy_headers=False: uvicorn's ProxyHeadersMiddleware only rewrites scope["client"] and scope["scheme"] from
    # X-Forwarded-* headers, which the app never reads (no access log either); it scanned every request's headers
    # (#28 item 10; tests/gateway/test_lean_asgi.py drives the app with a scope that has neither)
    return _server_class()(config, app)


@functools.lru_cache(maxsize=1)
def _server_class() -> Any:
    import uvicorn  # here, not at import: importing the gateway loads no HTTP server

    class Server(uvicorn.Server):
        """uvicorn's server, telling the app when shutdown begins: uvicorn tells an app only after every request has
        finished, and an export waits for a session's end that may never come."""

        def __init__(self, config: Any, app: Any):
            super().__init__(config)
            self.gateway_app = app

        async def shutdown(self, sockets: Any = None) -> None:
            self.gateway_app.stop()
            await super().shutdown(sockets)

    return Server


class GatewayThread(ServerThread):
    """``with GatewayThread(gateway) as gw: gw.url`` -- the gateway over real HTTP from a background thread.

    The socket is bound at construction (so ``port`` is known at once); ``start()`` (or ``with``) serves it and
    waits until the server listens, ``stop()`` (or leaving the ``with``) shuts it down as a signal would.

    Args:
        gateway: the :class:`~envhub.gateway.core.Gateway` to serve (kept as ``self.gateway``).
        **kw: :class:`envhub.http.server.ServerThread`'s ``host`` (loopback by default), ``port`` (0: a free one),
            ``token``, ``log_level`` and ``uds`` (a Unix socket path to serve on instead of TCP), and
            :func:`make_server`'s limits and ``model_name``/``model_only``.

    Raises:
        ValueError: a non-loopback ``host`` without a ``token``.
    """

    def __init__(self, gateway: Gateway, **kw: Any):
        kw.setdefault("loop_factory", event_loop()[1])
        super().__init__(gateway, make=make_server, **kw)
        self.gateway = gateway


def serve(gateway: Gateway, *, host: str = "127.0.0.1", port: int = 8090, token: str | None = None,
          on_ready: Any = None, sock: socket.socket | None = None, **kw: Any) -> None:
    """Serve ``gateway`` over HTTP until SIGINT/SIGTERM (what ``envhub gateway`` runs); blocks.

    Args:
        gateway: the :class:`~envhub.gateway.core.Gateway` to serve.
        host: the address (a non-loopback one needs ``token``).
        port: the port (bound here unless ``sock`` is given).
        token: the admin key the control routes require.
        on_ready: called with the port once the server listens.
        sock: a socket already bound to ``host:port`` (``envhub gateway`` binds before loading the model, so a busy
            port is reported at once).
        **kw: :func:`make_server`'s other arguments (limits, ``model_name``, ``model_only``, ``log_level``).

    Raises:
        ValueError: ``host`` is not a loopback address and no ``token`` is given.
        OSError: the port cannot be bound (when no ``sock`` is given).
    """
    raise_fd_limit()
    server = make_server(gateway, host=host, port=port, token=token, **kw)
    tune_gc()
    serve_until_stopped(server, sock or bind(host, port), on_ready, run=event_loop()[0])
