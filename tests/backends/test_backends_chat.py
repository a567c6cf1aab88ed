"""The text-only chat backend against a real OpenAI-compatible ``/v1/chat/completions`` server on loopback.

The server is a stand-in for a hosted chat model (named as such): it speaks the real wire format and plays
guess-number by binary search from the conversation it is sent, so a correct backend earns reward 1 on every task.
Its trajectories are marked untrainable."""
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envhub.backends.chat import UNTRAINABLE, parse_reply
from helpers import run_cli


def play_guess_number(messages):
    lo, hi = map(int, re.search(r"between (-?\d+) and (-?\d+)", messages[0]["content"] if messages[0]["role"] ==
                                "user" else messages[1]["content"]).groups())
    for prev, reply in zip(messages, messages[1:]):
        if prev["role"] == "assistant" and reply["role"] == "user":
            guess = int(prev["content"])
            if "lower" in reply["content"]:
                hi = guess - 1
            elif "higher" in reply["content"]:
                lo = guess + 1
    return str((lo + hi) // 2)


class StandInChat(BaseHTTPRequestHandler):
    requests: list = []

    def log_message(self, *a):
        pass

    def _send(self, obj, status=200):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            return self._send({"object": "list", "data": [{"id": "stand-in-chat", "object": "model"}]})
        self._send({"error": "not found"}, 404)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        if self.path != "/v1/chat/completions":
            return self._send({"error": "not found"}, 404)
        content = play_guess_number(body["messages"])
        self._send({"id": "c1", "object": "chat.completion", "model": body["model"],
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": content}}]})


@pytest.fixture
def chat_server():
    StandInChat.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), StandInChat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.slow
def test_chat_rollout_scores_through_the_real_env_and_is_marked_untrainable(chat_server, tmp_path):
    run = tmp_path / "run"
    r = run_cli("rollout", "guess-number", "--model", f"chat+{chat_server}/v1", "--tokenizer", "tiny", "-n", "3",
                "--temperature", "0", "--out", str(run))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1.000 ± 0.000" in r.stdout and "done=3" in r.stdout
    trajs = [json.loads(x) for x in (run / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 3 and all(t["passed"] for t in trajs)
    assert all("text-only chat backend" in t["details"][UNTRAINABLE] for t in trajs)
    meta = json.loads((run / "run.json").read_text())
    assert meta["trainable"] is False and meta["api_model"] == "stand-in-chat"
    posts = [q for q in StandInChat.requests if q["path"] == "/v1/chat/completions"]
    assert posts and all(q["body"]["model"] == "stand-in-chat" and q["body"]["temperature"] == 0 for q in posts)
    assert all(m["role"] in ("system", "user", "assistant") for q in posts for m in q["body"]["messages"])


@pytest.mark.slow
def test_unreachable_chat_endpoint_is_a_one_line_preflight_error():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run_cli("rollout", "guess-number", "--model", f"chat+http://127.0.0.1:{port}", "--tokenizer", "tiny")
    assert r.returncode == 1 and "is not usable" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_parse_reply_reads_tool_calls_and_length():
    action, finish = parse_reply({"choices": [{"finish_reason": "length", "message": {
        "content": None, "tool_calls": [{"id": "a", "type": "function",
                                         "function": {"name": "finish", "arguments": '{"answer": "7/3"}'}},
                                        {"id": "b", "function": {"name": "python", "arguments": "{not json"}}]}}]})
    assert finish == "length" and action.text == ""
    assert [(c.name, c.arguments, c.id) for c in action.tool_calls] == [
        ("finish", {"answer": "7/3"}, "a"), ("python", {"_raw": "{not json"}, "b")]
