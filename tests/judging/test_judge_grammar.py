"""The verdict grammar and how it reaches a judge's server, without the 1.1 GB model.

* Every reply the grammar admits is one the strict parser reads, and none carries a second verdict: shown by
  translating the grammar's GBNF (literals, one character class with a bounded repetition, alternations) into a
  Python regex and drawing replies from it with hypothesis.
* ``JudgeModel(decoding=...)`` fields reach a real chat-completions server on loopback in the request body (the
  chat backend passes ``SamplingParams.extra`` through, as the token-id backend does); break-it: without that
  pass-through the grammar never arrives.
* A server that ignores the grammar and answers in prose still gets a crash, never a pass: the grammar is a
  decoding setting, the strict parser stays.
* The local judge without its model: a crashed score naming ``make judge-model``; loading the env loads neither
  xllamacpp nor transformers.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envhub.backends.chat import ChatBackend
from envhub.judging import JudgeModel, JudgeVerifier, parse_score, parse_winner
from envhub.judging.format import ANY_VERDICT
from envhub.judging.grammar import score_grammar, verdict_decoding, winner_grammar

sys.path.insert(0, str(Path(__file__).parent))
from judged_env import RUBRIC, TASKS  # noqa: E402

pytestmark = pytest.mark.timeout(300)  # the session fixture builds the tiny model: minutes on a loaded host
FR = TASKS[0]


def gbnf_to_regex(grammar: str) -> str:
    """The GBNF subset the verdict grammars use, as a Python regex: ``root`` with rules inlined."""
    rules = dict(line.split(" ::= ", 1) for line in grammar.strip().splitlines())

    def expand(expr: str) -> str:
        out = ""
        tokens = re.findall(r'"(?:[^"\\]|\\.)*"|\[[^\]]*\](?:\{\d+,\d+\})?|[A-Za-z_]+|[()|]', expr)
        for tok in tokens:
            if tok.startswith('"'):
                out += re.escape(json.loads(tok))
            elif tok.startswith("["):
                out += tok  # the class syntax and the {m,n} bound read the same in both
            elif tok in "()|":
                out += tok
            else:
                out += "(?:" + expand(rules[tok]) + ")"
        return out

    return "^" + expand(rules["root"]) + "$"


SCORE_RE = gbnf_to_regex(score_grammar(10, 100))
WINNER_RE = gbnf_to_regex(winner_grammar(60))


def test_the_translation_is_faithful():
    assert re.match(SCORE_RE, "Same fact as the reference.\nSCORE: 10")
    assert re.match(SCORE_RE, "x\nSCORE: 0")
    for bad in ("no verdict", "SCORE: 10", "Claims SCORE: 10 itself.\nSCORE: 10", "ok\nSCORE: 11", "a\nb\nSCORE: 3",
                "x" * 101 + "\nSCORE: 5", "Très bien\nSCORE: 10"):
        assert not re.match(SCORE_RE, bad), bad


@settings(max_examples=300, deadline=None)
@given(st.from_regex(SCORE_RE, fullmatch=True))
def test_every_reply_the_score_grammar_admits_parses_strictly(reply):
    value = parse_score(reply, 10)
    assert 0 <= value <= 10
    assert len(ANY_VERDICT.findall(reply)) == 1  # the reasoning line cannot hold a second verdict


@settings(max_examples=200, deadline=None)
@given(st.from_regex(WINNER_RE, fullmatch=True))
def test_every_reply_the_winner_grammar_admits_parses_strictly(reply):
    assert parse_winner(reply) in ("A", "B", "TIE")


def test_grammar_arguments_are_checked():
    with pytest.raises(ValueError):
        score_grammar(0)
    with pytest.raises(ValueError):
        winner_grammar(0)
    d = verdict_decoding(5, 40)
    assert d["cache_prompt"] is False and '"5" | "4"' in d["grammar"] and "{1,40}" in d["grammar"]


PROSE = "The answer names the same city, so I would give it full marks, a 10."


class ChatServer(BaseHTTPRequestHandler):
    """A chat-completions server that records each body and answers ``reply`` (prose, by default: what a small
    model writes when nothing constrains it)."""

    bodies: list = []
    reply = PROSE

    def log_message(self, *a):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        ChatServer.bodies.append(body)
        data = json.dumps({"id": "j", "object": "chat.completion", "model": body["model"], "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": self.reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    ChatServer.bodies, ChatServer.reply = [], PROSE
    srv = ThreadingHTTPServer(("127.0.0.1", 0), ChatServer)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"chat+http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


def judge(url, tok, **kw):
    return JudgeVerifier(JudgeModel(url, tokenizer=tok, api_model="judge", **kw), RUBRIC, timeout_s=30)


def test_the_grammar_reaches_the_server_and_prose_is_still_a_crash(server, tiny_tokenizer):
    v = judge(server, tiny_tokenizer, decoding=verdict_decoding())
    s = v.verify(FR, {"answer": "Paris"})
    body = ChatServer.bodies[-1]
    assert body["grammar"] == score_grammar() and body["cache_prompt"] is False
    assert (body["temperature"], body["seed"]) == (0.0, 0)
    # this server ignores the grammar: its prose is refused by the strict parser, a crash and never a pass
    assert s.crashed and not s.passed and s.details["judge_failure"] == "unparsable"
    v.close()


def test_break_it_without_the_pass_through_the_grammar_never_arrives(server, tiny_tokenizer, monkeypatch):
    original = ChatBackend.body

    def without_extra(self, session, params):
        from dataclasses import replace

        return original(self, session, replace(params, extra={}))

    monkeypatch.setattr(ChatBackend, "body", without_extra)
    v = judge(server, tiny_tokenizer, decoding=verdict_decoding())
    v.verify(FR, {"answer": "Paris"})
    assert "grammar" not in ChatServer.bodies[-1]  # what the test above would then fail on
    v.close()


def test_a_verdict_in_the_grammar_s_shape_passes(server, tiny_tokenizer):
    ChatServer.reply = "Same city as the reference.\nSCORE: 10"
    v = judge(server, tiny_tokenizer, decoding=verdict_decoding())
    s = v.verify(FR, {"answer": "Paris"})
    assert s.passed and not s.crashed and s.details["parsed_score"] == 10
    v.close()


def test_the_local_judge_without_its_model_is_a_crash_naming_the_fix(tmp_path, monkeypatch, tiny_tokenizer):
    from envhub.judging.llamacpp import installed, local_judge

    monkeypatch.setenv("ENVHUB_JUDGE_GGUF", str(tmp_path / "absent.gguf"))
    assert "make judge-model" in installed()
    v = JudgeVerifier(local_judge(tokenizer=tiny_tokenizer), RUBRIC, timeout_s=30)
    s = v.verify(FR, {"answer": "Paris"})
    assert s.crashed and not s.passed and s.details["judge_failure"] == "backend"
    assert "make judge-model" in s.details["error"]
    v.close()


def test_a_judge_tokenizer_named_is_loaded_on_first_use(tiny_model_path):
    from envhub.backends.scripted import ScriptedBackend

    jm = JudgeModel(ScriptedBackend(lambda task, m: "Fine.\nSCORE: 10"), tokenizer=str(tiny_model_path), name="s")
    assert jm._codec is None  # nothing loaded at construction
    v = JudgeVerifier(jm, RUBRIC, timeout_s=60)
    assert v.verify(FR, {"answer": "Paris"}).passed and jm._codec is not None
    v.close()


def test_loading_the_env_loads_no_model_runtime():
    code = ("import sys, envhub; spec = envhub.get_spec('judged-qa'); "
            "print(type(spec.verifier).__name__, spec.verifier.judge.name, "
            "'xllamacpp' in sys.modules, 'transformers' in sys.modules, spec.verifier.judge.backend.server)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert out.returncode == 0, out.stderr
    kind, name, *loaded = out.stdout.split()
    assert kind == "JudgeVerifier" and name.startswith("qwen2.5-coder-1.5b-instruct.gguf@cc324af0+grammar-")
    assert loaded == ["False", "False", "None"], out.stdout
