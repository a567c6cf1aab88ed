"""The bash and python tools through a real ToolEnv on bwrap: state persistence, errors, parallel calls."""
from __future__ import annotations

import json
import time

from coding_env import CodingEnv

from envhub.env import Action, ToolCall
from envhub.tools import bash_tool, python_tool, sandbox_tools


def test_specs_are_json_schemas():
    names = [t.spec.name for t in sandbox_tools()]
    assert names == ["bash", "str_replace_editor", "python", "finish"]
    for t in sandbox_tools():
        json.dumps(t.spec.to_openai())
        assert t.spec.parameters["type"] == "object"
    assert bash_tool().spec.parameters["required"] == ["command"]
    assert python_tool().spec.parameters["required"] == ["code"]


def test_bash_state_persists(call):
    assert call("bash", command="cd /tmp && export GREETING=hello").content == "[exit code: 0]"
    r = call("bash", command="pwd; echo $GREETING")
    assert not r.error and r.content == "/tmp\nhello\n[exit code: 0]"
    r = call("bash", command="ls /nonexistent")
    assert not r.error and "No such file" in r.content and r.content.endswith("[exit code: 2]")
    r = call("bash", command="sleep 30", timeout=1)
    assert r.error and "timed out after 1 s" in r.content and "[exit code: 124]" in r.content
    assert call("bash", command="echo $GREETING").content == "hello\n[exit code: 0]"
    r = call("bash", command="   ")
    assert r.error and "non-empty" in r.content
    r = call("bash", command="seq 1 100000")
    assert "bytes of output were cut" in r.content


def test_python_state_persists(call):
    assert not call("python", code="import json\ndata = {'a': [1, 2]}").error
    r = call("python", code="json.dumps(data)")
    assert not r.error and '{"a": [1, 2]}' in r.content
    r = call("python", code="undefined_name")
    assert r.error and "NameError" in r.content
    r = call("python", code="while True: pass", timeout=1)
    assert r.error and "timed out" in r.content
    assert "[1, 2]" in call("python", code="data['a']").content


def test_parallel_calls_in_one_turn(env):
    calls = [ToolCall("bash", {"command": f"sleep 0.2; echo {i}"}, id=f"c{i}") for i in range(4)]
    t = time.monotonic()
    msgs, reward, terminated, truncated, info = env.step(Action("", calls))
    assert [m["content"] for m in msgs] == [f"{i}\n[exit code: 0]" for i in range(4)]
    assert [m["tool_call_id"] for m in msgs] == ["c0", "c1", "c2", "c3"]
    assert time.monotonic() - t >= 0.8  # one request at a time per sandbox: serialized, never interleaved


def test_episode_lifecycle_frees_the_sandbox():
    env = CodingEnv()
    env.reset(options={"task": {"task_id": "t1"}})
    first = env.sandbox
    env.step(Action("", [ToolCall("bash", {"command": "echo hi > /testbed/f"}, id="a")]))
    env.reset(options={"task": {"task_id": "t2"}})  # a new episode gets a fresh sandbox; the old one is stopped
    assert first.stopped and env.sandbox is not first
    assert "No such file" in env.sandbox.shell("cat /testbed/f").stdout
    msgs, _, terminated, _, info = env.step(Action("", [ToolCall("finish", {"answer": "42"}, id="f")]))
    assert terminated and info["artifacts"] == {"answer": "42"}
    sb = env.sandbox
    env.close()
    assert sb.stopped


def test_tools_without_a_sandbox_answer_with_an_error():
    from envhub.env import ToolEnv

    class Bare(ToolEnv):
        def start(self, task):
            return "hi"

        def make_tools(self):
            return sandbox_tools()

    env = Bare()
    env.reset(options={"task": {"task_id": "x"}})
    msgs, *_ = env.step(Action("", [ToolCall("bash", {"command": "ls"}, id="a")]))
    assert "no running sandbox" in msgs[0]["content"]


def test_bash_tool_timeouts_are_clamped():
    """The tool's default timeout is kept inside [1 s, max_timeout] once, at construction; a model's requested
    timeout is clamped on each call (a junk value falls back to the default)."""
    assert bash_tool(timeout=5000, max_timeout=600).timeout == 600
    assert bash_tool(timeout=0.01).timeout == 1.0

    class Recorder:
        stopped, calls = False, []

        def shell(self, command, timeout=None):
            from envhub.sandbox import ExecResult

            self.calls.append(timeout)
            return ExecResult(0, "")

    class Env:
        sandbox = Recorder()

    tool = bash_tool(timeout=30, max_timeout=100)
    for asked in (None, 5, 10_000, "junk", -3):
        assert tool.run(Env, {"command": "true", **({} if asked is None else {"timeout": asked})}).content \
            == "[exit code: 0]"
    assert Recorder.calls == [30, 5, 100, 30, 1.0]
