"""The judge behind other backends: a hosted judge by ``chat+http://`` (a real HTTP server on loopback speaking the
chat-completions API), and the real transformers backend on the tiny random model (whose replies are noise: every
judgment must come back as a crashed score, never a pass)."""
from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envhub.judging import JudgeVerifier

sys.path.insert(0, str(Path(__file__).parent))
from judged_env import RUBRIC, TASKS, judge_policy  # noqa: E402

pytestmark = pytest.mark.timeout(180)
FR = TASKS[0]


class HostedJudge(BaseHTTPRequestHandler):
    mode = "honest"
    bodies: list = []

    def log_message(self, *a):
        pass

    def _send(self, obj, status=200):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        HostedJudge.bodies.append(body)
        if self.mode == "down":
            return self._send({"error": {"message": "overloaded"}}, 503)
        if self.mode == "slow":
            time.sleep(3)
        content = judge_policy()(None, body["messages"])
        self._send({"id": "j", "object": "chat.completion", "model": body["model"], "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": content}}]})


@pytest.fixture
def hosted():
    HostedJudge.mode, HostedJudge.bodies = "honest", []
    server = ThreadingHTTPServer(("127.0.0.1", 0), HostedJudge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"chat+http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_hosted_judge_by_url(hosted, tiny_tokenizer):
    v = JudgeVerifier(hosted, RUBRIC, tokenizer=tiny_tokenizer, api_model="judge-7b", timeout_s=10)
    good, bad = v.verify(FR, {"answer": "Paris is the capital of France."}), v.verify(FR, {"answer": "Lyon"})
    assert good.passed and good.details["judge_model"] == hosted and good.details["parsed_score"] == 10
    assert not bad.passed and not bad.crashed
    sent = HostedJudge.bodies[0]
    assert sent["model"] == "judge-7b" and sent["temperature"] == 0.0 and sent["seed"] == 0
    assert sent["messages"][0]["role"] == "system" and "Paris is the capital" in sent["messages"][1]["content"]
    v.close()


@pytest.mark.parametrize("mode,kind", [("down", "backend"), ("slow", "timeout")])
def test_a_hosted_judge_failing_is_a_crash(hosted, tiny_tokenizer, mode, kind):
    HostedJudge.mode = mode
    v = JudgeVerifier(hosted, RUBRIC, tokenizer=tiny_tokenizer, api_model="judge", timeout_s=1)
    s = v.verify(FR, {"answer": "Paris"})
    assert s.crashed and not s.passed and s.details["judge_failure"] == kind


def test_a_url_judge_needs_a_tokenizer():
    with pytest.raises(ValueError, match="needs tokenizer="):
        JudgeVerifier("chat+http://127.0.0.1:9", RUBRIC)


def test_the_tiny_random_model_as_judge_never_passes(tiny_model_path):
    """A real transformers backend whose replies are noise: the strict parser turns each into a crash."""
    v = JudgeVerifier(str(tiny_model_path), RUBRIC, max_tokens=24, timeout_s=120)
    scores = [v.verify(t, {"answer": t["golden"]}) for t in TASKS]
    assert all(s.crashed and not s.passed for s in scores)
    assert {s.details["judge_failure"] for s in scores} <= {"unparsable", "ambiguous", "refusal", "out-of-range"}
    assert v.judge_stats()["calls"] == 3 and v.judge_stats()["completion_tokens"] > 0
    again = v.verify(TASKS[0], {"answer": TASKS[0]["golden"]})
    assert again.details["raw_judgment"] == scores[0].details["raw_judgment"]  # greedy: the same reply
    v.close()


def test_a_token_id_server_judge(tiny_model_path, tiny_tokenizer):
    """``http://`` (vLLM's ``/v1/completions`` with token ids): the stand-in server of the backend tests, computing
    with the real hf backend on the tiny model. Its replies are noise, so the judgment is a crash; what is checked
    is the path: token ids out, greedy and seeded, and the reply read back."""
    import asyncio

    from envhub.backends.hf import HFBackend

    sys.path.insert(0, str(Path(__file__).parent.parent / "backends"))
    from standin_server import StandIn

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    server = asyncio.run_coroutine_threadsafe(StandIn(HFBackend(tiny_model_path)).start(), loop).result(60)
    try:
        v = JudgeVerifier(server.url, RUBRIC, tokenizer=tiny_tokenizer, max_tokens=12, timeout_s=60)
        s = v.verify(FR, {"answer": "Paris"})
        assert s.crashed and not s.passed and s.details["judge_failure"] in ("unparsable", "refusal", "ambiguous")
        body = server.bodies[-1]
        assert isinstance(body["prompt"], list) and all(isinstance(t, int) for t in body["prompt"])
        assert body["temperature"] == 0.0 and body["seed"] == 0 and body["max_tokens"] == 12
        v.close()
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
