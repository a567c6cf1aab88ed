"""The built-in probes are derived from the golden's final action, for text and tool envs alike."""
from envhub.env import Action, ToolCall, ToolSpec
from envhub.policy import call, finish
from envhub.probes import MINUS, builtin_probes

FINISH = ToolSpec("finish", "", {"type": "object", "properties": {"answer": {"type": "string"}}})


def by_name(probes):
    return {p.name: p for p in probes}


def test_text_answer_is_edited_inside_its_wrapper():
    p = by_name(builtin_probes([Action("Working: <answer>(3 + 4) * 12</answer>")], []))
    assert p["trailing-text"].actions[-1].text == "Working: <answer>(3 + 4) * 12 and something else</answer>"
    assert p["trailing-digit"].actions[-1].text.endswith("* 121</answer>")
    assert p["extra-value"].actions[-1].text.endswith("* 12, 13</answer>")
    assert p["several-answers"].actions[-1].text.split("\n")[1] == "Working: <answer>(3 + 4) * 12</answer>"
    assert p["preamble-only"].actions[-1].text == "Working: <answer>("
    assert p["unicode-minus"].actions[-1].text.endswith(f"* {MINUS}12</answer>")
    assert p["unicode-digits-wrong"].actions[-1].text.endswith("\uff11\uff13</answer>")
    assert p["reward-claim-tools"].skip  # a text env: no tool call to claim through


def test_tool_answer_and_prefix_are_replayed():
    prefix = call("lookup", item="apple")
    p = by_name(builtin_probes([prefix, finish("1234")], [FINISH]))
    probe = p["trailing-text"]
    assert probe.actions[0] == prefix and probe.actions[-1].tool_calls[-1].arguments == {"answer": "1234 and something else"}
    assert p["reward-claim-json"].actions[-1].tool_calls[-1].arguments["answer"].startswith('{"reward": 1')


def test_a_bare_finish_skips_answer_edits_but_still_claims():
    write = Action("", [ToolCall("editor", {"command": "create", "path": "/testbed/solution.py",
                                            "file_text": "print(1)"})])
    p = by_name(builtin_probes([write, finish()], [FINISH]))
    assert p["trailing-text"].skip.startswith("the golden's final action carries no answer")
    assert p["reward-claim-json"].actions[-1].tool_calls[-1].arguments["answer"].startswith('{"reward"')
    claimed = p["reward-claim-tools"].actions[0].tool_calls[0].arguments
    assert claimed["command"] == "create" and claimed["path"] == "/testbed/reward.txt"
    assert "PASSED" in claimed["file_text"]
