"""Serving the gateway: :func:`serve` (what ``envhub gateway`` runs) and :class:`GatewayThread` (in-process, real
HTTP on loopback: tests, notebooks, the harness envs). Same server as the rollout service: uvicorn with the h11
protocol under a connection cap and a request-head deadline (:mod:`envhub.http.limits`); loopback by default,
a token required on any other address."""
from __future__ import annotations

from typing import Any

from envhub.gateway.core import Gateway
from envhub.http.server import ServerThread, bind, check_binding, raise_fd_limit, serve_until_stopped


def make_server(gateway: Gateway, *, host: str = "127.0.0.1", port: int = 0, token: str | None = None,
                log_level: str = "warning", model_name: str = "envhub", max_body_bytes: int | None = None,
                header_timeout_s: float | None = None, body_timeout_s: float | None = None,
                max_connections: int | None = None, model_only: bool = False) -> Any:
    import uvicorn

    from envhub.gateway.app import GatewayApp
    from envhub.http import limits

    check_binding(host, token)
    app = GatewayApp(gateway, admin_key=token, model_name=model_name,
                     max_body_bytes=max_body_bytes or limits.DEFAULT_MAX_BODY_BYTES,
                     body_timeout_s=body_timeout_s or limits.DEFAULT_BODY_TIMEOUT_S, model_only=model_only)
    http = limits.protocol_class(max_connections or limits.default_max_connections(),
                                 header_timeout_s or limits.DEFAULT_HEADER_TIMEOUT_S)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, http=http, timeout_keep_alive=120,
                            access_log=False, lifespan="on", backlog=4096)
    return uvicorn.Server(config)


class GatewayThread(ServerThread):
    """``with GatewayThread(gateway) as gw: gw.url`` -- the gateway over real HTTP from a background thread."""

    def __init__(self, gateway: Gateway, **kw: Any):
        super().__init__(gateway, make=make_server, **kw)
        self.gateway = gateway


def serve(gateway: Gateway, *, host: str = "127.0.0.1", port: int = 8090, token: str | None = None,
          on_ready: Any = None, **kw: Any) -> None:
    raise_fd_limit()
    serve_until_stopped(make_server(gateway, host=host, port=port, token=token, **kw), bind(host, port), on_ready)
