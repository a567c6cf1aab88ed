"""The Gemini routes refuse what they cannot serve with Google's error JSON (``{"error": {"code", "message",
"status"}}``), never a 500, never a silent drop; nothing is recorded and the session goes on."""
from __future__ import annotations

import httpx
import pytest
from gw_helpers import agent_policy

from envhub.backends.scripted import ScriptedBackend
from envhub.gateway import Gateway, GatewayThread
from envhub.gateway.dialects import gemini

pytestmark = pytest.mark.timeout(120)
USER = [{"role": "user", "parts": [{"text": "Hi"}]}]
BAD = {  # name -> (body, what the message must name)
    "no contents": ({}, "contents"),
    "contents a string": ({"contents": "hi"}, "contents"),
    "a content not an object": ({"contents": ["hi"]}, "contents[0]"),
    "role assistant": ({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}, "role"),
    "no parts": ({"contents": [{"role": "user"}]}, "parts"),
    "parts empty": ({"contents": [{"role": "user", "parts": []}]}, "parts"),
    "a part not an object": ({"contents": [{"role": "user", "parts": ["x"]}]}, "parts[0]"),
    "an image": ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}]},
                 "inlineData"),
    "a file": ({"contents": [{"role": "user", "parts": [{"fileData": {"fileUri": "gs://x"}}]}]}, "fileData"),
    "text not a string": ({"contents": [{"role": "user", "parts": [{"text": 5}]}]}, "text"),
    "functionCall in a user turn": ({"contents": [{"role": "user", "parts": [{"functionCall": {"name": "f"}}]}]},
                                    "functionCall"),
    "args a list": ({"contents": USER + [{"role": "model", "parts": [{"functionCall": {"name": "f", "args": [1]}}]}]},
                    "args"),
    "functionResponse without name": ({"contents": [{"role": "user", "parts": [{"functionResponse": {}}]}]}, "name"),
    "response a string": ({"contents": [{"role": "user", "parts": [
        {"functionResponse": {"name": "f", "response": "ok"}}]}]}, "response"),
    "system parts a string": ({"contents": USER, "systemInstruction": {"parts": "x"}}, "systemInstruction"),
    "system image": ({"contents": USER, "systemInstruction": {"parts": [{"inlineData": {}}]}}, "systemInstruction"),
    "tools an object": ({"contents": USER, "tools": {"functionDeclarations": []}}, "tools"),
    "hosted tool": ({"contents": USER, "tools": [{"googleSearch": {}}]}, "googleSearch"),
    "declarations an object": ({"contents": USER, "tools": [{"functionDeclarations": {}}]}, "functionDeclarations"),
    "declaration without name": ({"contents": USER, "tools": [{"functionDeclarations": [{"description": "d"}]}]},
                                 "name"),
    "both schemas": ({"contents": USER, "tools": [{"functionDeclarations": [
        {"name": "f", "parameters": {"type": "OBJECT"}, "parametersJsonSchema": {"type": "object"}}]}]}, "not both"),
    "description a number": ({"contents": USER, "tools": [{"functionDeclarations": [{"name": "f", "description": 5}]}]},
                             "description"),
    "forced function call": ({"contents": USER, "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}, "AUTO"),
    "generationConfig a list": ({"contents": USER, "generationConfig": []}, "generationConfig"),
    "two candidates": ({"contents": USER, "generationConfig": {"candidateCount": 2}}, "candidateCount"),
    "temperature a word": ({"contents": USER, "generationConfig": {"temperature": "hot"}}, "temperature"),
    "topP over 1": ({"contents": USER, "generationConfig": {"topP": 1.5}}, "topP"),
    "maxOutputTokens 0": ({"contents": USER, "generationConfig": {"maxOutputTokens": 0}}, "maxOutputTokens"),
    "stopSequences a string": ({"contents": USER, "generationConfig": {"stopSequences": "x"}}, "stopSequences"),
    "JSON mode": ({"contents": USER, "generationConfig": {"responseMimeType": "application/json"}}, "responseMimeType"),
    "penalty": ({"contents": USER, "generationConfig": {"presencePenalty": 0.5}}, "presencePenalty"),
    "unknown field": ({"contents": USER, "temperature": 0.5}, "temperature"),
    "cachedContent": ({"contents": USER, "cachedContent": "cachedContents/x"}, "cachedContent"),
}


@pytest.fixture(scope="module")
def served(tiny_tokenizer):
    gw = Gateway(ScriptedBackend(agent_policy), tiny_tokenizer, max_model_len=2048)
    with GatewayThread(gw) as srv:
        yield gw, srv


def post(srv, key, body, method="generateContent", **kw):
    r = httpx.post(f"{srv.url}/v1beta/models/m:{method}", headers={"x-goog-api-key": key} if key else {},
                   **({"json": body} if not isinstance(body, (bytes, str)) else {"content": body}), **kw)
    return r.status_code, r.json()


def google_error(status: int, payload) -> bool:
    err = payload.get("error") if isinstance(payload, dict) else None
    return (list(payload) == ["error"] and isinstance(err, dict) and set(err) == {"code", "message", "status"}
            and err["code"] == status and isinstance(err["message"], str) and err["status"].isupper())


@pytest.mark.parametrize("method", ["generateContent", "streamGenerateContent", "countTokens"])
def test_malformed_bodies_get_googles_400(served, method):
    gw, srv = served
    s = gw.start_session("bad")
    wrong = []
    for name, (body, names) in BAD.items():
        if method == "countTokens" and set(body) - {"contents"}:
            body = {"generateContentRequest": body}
        status, payload = post(srv, s.api_key, body, method)
        if status != 400 or not google_error(400, payload) or payload["error"]["status"] != "INVALID_ARGUMENT" \
                or names not in payload["error"]["message"]:
            wrong.append((name, status, payload))
    assert wrong == []
    assert s.calls == []  # nothing recorded
    status, payload = post(srv, s.api_key, {"contents": USER}, method)  # the session goes on
    assert status == 200 and ("totalTokens" in payload if method == "countTokens" else payload)


def test_bad_json_keys_routes_and_context(served):
    gw, srv = served
    s = gw.start_session("edges")
    cases = [
        (post(srv, s.api_key, b'{"contents": [NaN]}'), 400, "INVALID_ARGUMENT"),
        (post(srv, s.api_key, b"[1, 2]"), 400, "INVALID_ARGUMENT"),
        (post(srv, None, {"contents": USER}), 401, "UNAUTHENTICATED"),
        (post(srv, "nope", {"contents": USER}), 401, "UNAUTHENTICATED"),
        (post(srv, s.api_key, {"contents": USER}, "embedContent"), 404, "NOT_FOUND"),
        (post(srv, s.api_key, {"contents": [{"role": "user", "parts": [{"text": "word " * 3000}]}]}), 400,
         "INVALID_ARGUMENT"),
    ]
    assert [(st, p["error"]["status"]) for (st, p), _, _ in cases] == [(st, name) for _, st, name in cases]
    assert all(google_error(st, p) for (st, p), _, _ in cases)
    assert "exceeds the maximum number of tokens allowed (2048)" in cases[-1][0][1]["error"]["message"]
    r = httpx.post(f"{srv.url}/s/{s.api_key}/v1beta/models/m:generateContent", json={"contents": USER})
    assert r.status_code == 200 and r.json()["candidates"][0]["finishReason"] == "STOP"


@pytest.mark.parametrize("defence", ["_obj", "_known"])
def test_without_the_checks_bad_bodies_are_not_refused(served, monkeypatch, defence):
    """Break-it: without the shape checks a malformed body is a 500 (a bug, to the client, and retried); without the
    field check an unknown field is silently dropped (200). The test above would catch either."""
    gw, srv = served
    monkeypatch.setattr(gemini, defence, (lambda v, where: v) if defence == "_obj" else (lambda d, names, where: None))
    s = gw.start_session("broken")
    answers = {name: post(srv, s.api_key, body)[0] for name, (body, _) in BAD.items()}
    assert (500 in answers.values()) if defence == "_obj" else answers["unknown field"] == 200


def test_every_status_has_a_client_or_server_status_name(served):
    """A 4xx never reads as a server error (clients retry those), a 5xx never as the client's; and the gateway's own
    4xx (cross-site 403, 405, a model call after the end 410, a non-JSON body 415) come in Google's shape."""
    for status in range(400, 600):
        name = gemini.error(status, "m")["error"]["status"]
        assert (name not in ("INTERNAL", "UNAVAILABLE", "DEADLINE_EXCEEDED", "UNIMPLEMENTED")) == (status < 500), status
    gw, srv = served
    s = gw.start_session("codes")
    url, h = f"{srv.url}/v1beta/models/m:generateContent", {"x-goog-api-key": s.api_key}
    got = [httpx.post(url, json={"contents": USER}, headers={**h, "Origin": "https://evil.example"}),
           httpx.put(url, json={"contents": USER}, headers=h),
           httpx.post(url, content=b"hi", headers={**h, "Content-Type": "text/plain"})]
    gw.end_session(s)
    got.append(httpx.post(url, json={"contents": USER}, headers=h))
    assert [(r.status_code, r.json()["error"]["status"]) for r in got] == [
        (403, "PERMISSION_DENIED"), (405, "INVALID_ARGUMENT"), (415, "INVALID_ARGUMENT"), (410, "FAILED_PRECONDITION")]
    assert all(google_error(r.status_code, r.json()) for r in got)
