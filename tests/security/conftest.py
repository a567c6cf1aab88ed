"""Fixtures for the attack suite: real bwrap sandboxes, and a check that the suite leaves nothing behind."""
from __future__ import annotations

import os

import pytest

from helpers import bwrap_why_not

from envhub.sandbox import SandboxSpec, lifecycle, start
from envhub.sandbox.common import sandbox_root

WHY_NOT = bwrap_why_not()
_started: list[str] = []


@pytest.fixture
def box():
    """A factory for fresh bwrap sandboxes, all stopped at the end of the test."""
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    made = []

    def make(**kw):
        kw.setdefault("runtime", "bwrap")
        kw.setdefault("timeout_s", 20)
        sb = start(SandboxSpec(**kw))
        made.append(sb)
        _started.append(sb.id)
        return sb

    yield make
    for sb in made:
        sb.stop()


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind():
    """After the suite: no process tagged with a sandbox id of ours, no state directory of ours."""
    yield
    if not _started:
        return
    tagged = lifecycle.sandbox_pids()
    orphans = {sid: tagged[sid] for sid in _started if sid in tagged}
    left = [sid for sid in _started if os.path.exists(os.path.join(sandbox_root(), sid))]
    assert not orphans, f"processes of stopped sandboxes survived: {orphans}"
    assert not left, f"state directories left behind: {left}"
