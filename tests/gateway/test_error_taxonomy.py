"""Errors that read as what they are (#28, item 7): each status in the provider's own error type (a 4xx is the
client's request, never ``server_error``, which agents retry), and ``envhub gateway`` start-up failures as one line
naming the flag or variable to change, never a traceback."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from gw_helpers import agent_policy

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread
from envhub.gateway.dialects import anthropic, chat

REPO = Path(__file__).resolve().parents[2]
ADMIN = "admin"
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
MSGS = {**CHAT, "max_tokens": 5}


@pytest.fixture
def served(tiny_tokenizer):
    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer)
    with GatewayThread(gw, token=ADMIN) as srv:
        yield gw, srv


def provoke(gw, srv, status: int, route: str) -> httpx.Response:
    """A real request that gets ``status`` from the gateway on ``route``."""
    s = gw.start_session("e")
    h = {"Authorization": f"Bearer {s.api_key}"}
    body = {"/v1/messages": MSGS, "/v1/responses": {"input": "hi"}}.get(route, CHAT)
    if status == 403:  # a cross-site page
        return httpx.post(srv.url + route, json=body, headers={**h, "Origin": "https://evil.example"})
    if status == 405:
        return httpx.put(srv.url + route, json=body, headers=h)
    if status == 410:  # a model call after the session ended
        gw.end_session(s)
        return httpx.post(srv.url + route, json=body, headers=h)
    if status == 415:
        return httpx.post(srv.url + route, content=b"hi", headers={**h, "Content-Type": "text/plain"})
    raise AssertionError(status)


@pytest.mark.parametrize("status", [403, 405, 410, 415])
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
def test_client_errors_carry_the_providers_client_error_type(served, status, route):
    gw, srv = served
    r = provoke(gw, srv, status, route)
    assert r.status_code == status, r.text
    body = r.json()
    if route == "/v1/messages":
        want = "permission_error" if status == 403 else "invalid_request_error"
        assert body["type"] == "error" and body["error"]["type"] == want, body
    else:
        want = "permission_error" if status == 403 else "invalid_request_error"
        assert body["error"]["type"] == want, body


def test_every_4xx_is_a_client_error_and_every_5xx_a_server_error():
    for status in range(400, 600):
        o, a = chat.error(status, "m")["error"]["type"], anthropic.error(status, "m")["error"]["type"]
        if status < 500:
            assert o != "server_error" and a != "api_error", status
        else:
            assert o == "server_error" and a in ("api_error", "timeout_error", "overloaded_error"), status


def test_the_sdk_sees_a_permission_error_for_a_spent_call_budget(served):
    openai = pytest.importorskip("openai")
    gw, srv = served
    s = gw.start_session("budget")
    s.max_calls = 0
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key=s.api_key, max_retries=0)
    with pytest.raises(openai.PermissionDeniedError) as e:
        client.chat.completions.create(model="m", messages=CHAT["messages"])
    assert e.value.body["type"] == "permission_error" and e.value.code == "call_budget_exhausted"


def run_gateway(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "envhub.cli", "gateway", *args], capture_output=True, text=True,
                          timeout=120, cwd=str(REPO), env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})


def one_line(p: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert p.returncode != 0 and "Traceback" not in p.stderr and len(lines) == 1, p.stderr
    return lines[0]


@pytest.mark.timeout(120)
def test_start_up_without_a_token_beyond_loopback_names_the_gateways_flag_and_variable():
    line = one_line(run_gateway("--model", "tiny", "--host", "0.0.0.0", "--port", "0"))
    assert "envhub gateway --token" in line and "ENVHUB_GATEWAY_TOKEN" in line, line
    assert "envhub serve" not in line and "SERVICE" not in line, line


@pytest.mark.timeout(120)
def test_start_up_on_a_busy_port_is_one_line_naming_the_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = one_line(run_gateway("--model", "tiny", "--port", str(port)))
    assert f"127.0.0.1:{port}" in line and "--port" in line, line


@pytest.mark.timeout(120)
def test_start_up_with_an_unknown_model_is_one_line_naming_the_model():
    line = one_line(run_gateway("--model", "nope", "--port", "0"))
    assert "--model nope" in line and "unknown model" in line, line
