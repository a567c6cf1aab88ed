"""No fixed descriptor ceiling: with more than 1024 descriptors open, sandboxes still start and answer (``select()``
cannot watch a descriptor numbered 1024 or above; envhub waits with poll), and running out of descriptors altogether
gives an error that names the limit."""
from __future__ import annotations

import ast
import os
import resource
from pathlib import Path

import pytest
from sandbox_helpers import WHY_NOT

from envhub.fdlimit import raise_nofile_limit
from envhub.sandbox import SandboxError, SandboxSpec, start

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def many_fds():
    """Hold descriptors 0..~1100 so that every new one is numbered above 1024."""
    soft, hard = raise_nofile_limit()
    if soft < 2048:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} is too low to test past 1024")
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        yield held
    finally:
        for fd in held:
            os.close(fd)


def test_a_sandbox_starts_and_answers_with_descriptors_above_1024(many_fds):
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    assert os.open(os.devnull, os.O_RDONLY) > 1024 or pytest.fail("setup: descriptors not above 1024")
    box = start(SandboxSpec(runtime="bwrap", timeout_s=20))
    try:
        assert box.shell("echo hi").stdout.strip() == "hi"
        assert box.python("print(6 * 7)").stdout.strip() == "42"
        assert box.exec(["/bin/echo", "ok"]).stdout.strip() == "ok"
    finally:
        box.stop()


def test_out_of_descriptors_names_the_limit():
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    held = []
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        try:
            while True:
                held.append(os.open(os.devnull, os.O_RDONLY))
        except OSError:
            pass
        os.close(held.pop())  # one free descriptor: the start gets past its first open and fails later
        with pytest.raises(SandboxError, match=r"RLIMIT_NOFILE soft=256"):
            start(SandboxSpec(runtime="bwrap", timeout_s=20))
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_no_select_select_anywhere():
    """A guard for the whole class: nothing in envhub or the shipped envs waits with ``select.select``."""
    offenders = []
    for base in ("envhub", "environments", "adapters"):
        for path in (ROOT / base).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Attribute) and node.attr == "select" and isinstance(node.value, ast.Name)
                        and node.value.id == "select"):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, f"select.select cannot watch descriptors >= 1024; use poll/selectors: {offenders}"


def test_raise_nofile_limit_raises_the_soft_limit_to_the_hard_one():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
        new_soft, new_hard = raise_nofile_limit()
        assert new_hard == hard and new_soft == (hard if hard != resource.RLIM_INFINITY else new_soft) > 512
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
