"""The trainer virtualenv gives tool envs what they need: math-python's python tool (IPython in the sandbox) works
there, so training through an adapter never meets a tool that answers "not available"."""
from __future__ import annotations

import asyncio
import os

import pytest

pytestmark = [pytest.mark.trainers,
              pytest.mark.skipif(not os.path.exists("/usr/bin/bwrap"), reason="needs bubblewrap (make sys-deps)")]


def test_math_python_golden_uses_its_python_tool_in_the_trainer_venv(tiny_tokenizer):
    import envhub
    from envhub.backends.scripted import ScriptedBackend
    from envhub.rollout.executor import rollout

    spec = envhub.get_spec("math-python")
    task = dict(spec.load_tasks()[0])
    traj = asyncio.run(rollout(spec, task, ScriptedBackend(spec.golden), tiny_tokenizer))
    tool_replies = [m.get("content") or "" for m in traj.messages if m.get("role") == "tool"]
    assert tool_replies, "the golden solution did not call a tool"
    assert not any("not available" in r for r in tool_replies), tool_replies
    assert traj.passed and traj.finish_reason == "done", (traj.error, tool_replies)
