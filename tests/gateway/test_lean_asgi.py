"""#28 item 10: the gateway's server runs without uvicorn's ProxyHeadersMiddleware. That middleware only rewrites
``scope["client"]`` and ``scope["scheme"]`` from ``X-Forwarded-*`` headers; dropping it changes nothing a client
receives as long as the app reads neither. So the app is driven here, through a whole AReaL episode and envhub's
other routes, with a scope that refuses to hand out those keys (and ``server``), and the server's config is
checked to be without it."""
from __future__ import annotations

import asyncio
import json

import pytest
from gw_helpers import TOOLS, agent_policy

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway
from envhub.gateway.app import GatewayApp

pytestmark = pytest.mark.timeout(120)
HIDDEN = ("client", "scheme", "server")


class StrictScope(dict):
    """An ASGI scope whose client, scheme and server cannot be read: reading them fails the request (500)."""

    def __getitem__(self, key):
        if key in HIDDEN:
            raise AssertionError(f"the app read scope[{key!r}]")
        return super().__getitem__(key)

    def get(self, key, default=None):
        if key in HIDDEN:
            raise AssertionError(f"the app read scope.get({key!r})")
        return super().get(key, default)


async def asgi(app, method: str, path: str, body: dict | None = None, key: str | None = None,
               scope_class=StrictScope) -> tuple[int, bytes]:
    """One request through the ASGI app: (status, body)."""
    raw = json.dumps(body).encode() if body is not None else b""
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
               (b"content-length", str(len(raw)).encode()), (b"x-forwarded-for", b"203.0.113.9"),
               (b"x-forwarded-proto", b"https")]
    if key:
        headers.append((b"authorization", b"Bearer " + key.encode()))
    scope = scope_class(type="http", method=method, path=path, raw_path=path.encode(), query_string=b"",
                        headers=headers, http_version="1.1", asgi={"version": "3.0"})
    sent, never, given = [], asyncio.Event(), [False]

    async def receive():
        if not given[0]:
            given[0] = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await never.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    return status, b"".join(bytes(m.get("body", b"")) for m in sent if m["type"] == "http.response.body")


def episode(tiny_tokenizer, scope_class=StrictScope) -> list[tuple[int, bytes]]:
    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    app = GatewayApp(gw)

    async def run():
        out = [await asgi(app, "POST", "/grant_capacity", {}, scope_class=scope_class)]
        status, raw = await asgi(app, "POST", "/rl/start_session", {"task_id": "t"}, scope_class=scope_class)
        out.append((status, raw))
        key = json.loads(raw)["api_key"]
        messages = [{"role": "user", "content": "Fix f.py."}]
        for _ in range(2):
            status, raw = await asgi(app, "POST", "/v1/chat/completions",
                                     {"model": "m", "messages": messages, "tools": TOOLS}, key, scope_class)
            out.append((status, raw))
            msg = json.loads(raw)["choices"][0]["message"]
            messages += [msg] + [{"role": "tool", "tool_call_id": c["id"], "content": "ok"}
                                 for c in msg.get("tool_calls") or []]
        for method, path, body in (("POST", "/rl/set_reward", {"reward": 1.0}), ("POST", "/rl/end_session", {})):
            out.append(await asgi(app, method, path, body, key, scope_class))
        sid = json.loads(out[1][1])["session_id"]
        out.append(await asgi(app, "POST", "/export_trajectories", {"session_id": sid}, scope_class=scope_class))
        out.append(await asgi(app, "GET", "/v1/models", scope_class=scope_class))
        return out

    return asyncio.run(run())


def test_the_app_reads_neither_client_nor_scheme(tiny_tokenizer):
    replies = episode(tiny_tokenizer)
    assert [s for s, _ in replies] == [200] * len(replies), replies
    assert json.loads(replies[-2][1])["interactions"]  # the export came back with both calls


def test_the_gateway_server_has_no_proxy_headers_middleware(tiny_tokenizer):
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    from envhub.gateway.server import make_server

    server = make_server(Gateway(ScriptedBackend(agent_policy), tiny_tokenizer))
    assert server.config.proxy_headers is False
    server.config.load()
    app, seen = server.config.loaded_app, []
    while app is not None and app not in seen:
        seen.append(app)
        assert not isinstance(app, ProxyHeadersMiddleware)
        app = getattr(app, "app", None)


def test_break_it_an_app_that_reads_the_client_fails_the_check(tiny_tokenizer, monkeypatch):
    """Were the app to read ``scope["client"]`` (what the middleware rewrites), the episode above would fail."""
    real = GatewayApp.__call__

    async def reads_client(self, scope, receive, send):
        if scope["type"] == "http":
            scope["client"]  # noqa: B018 -- the read is the point
        return await real(self, scope, receive, send)

    monkeypatch.setattr(GatewayApp, "__call__", reads_client)
    with pytest.raises(AssertionError, match="read scope"):
        episode(tiny_tokenizer)
