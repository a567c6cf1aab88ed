"""The sandbox's action server runs as ``python -I -S`` (no ``site``, no ``PYTHONPYCACHEPREFIX``), so its bytecode
must sit beside its sources in ``__pycache__``, whatever ``sys.pycache_prefix`` the host process has: a lazily
compiled venv (``scripts/lazy-bytecode.sh``: .venv-vllm, .venv-trainers) sets one, and ``compileall`` would then
write where the sandbox never looks (every sandbox start compiling the server again)."""
from __future__ import annotations

import compileall
import sys

import envhub.sandbox.common as common


def _agent_copy(tmp_path):
    agent = tmp_path / "agent"
    (agent / "pkg").mkdir(parents=True)
    (agent / "server.py").write_text("X = 1\n")
    (agent / "pkg" / "mod.py").write_text("Y = 2\n")
    return agent


def test_bytecode_lands_beside_the_sources_under_a_pycache_prefix(tmp_path, monkeypatch):
    agent, prefix = _agent_copy(tmp_path), tmp_path / "prefix"
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    monkeypatch.setattr(common, "AGENT_DIR", str(agent))
    monkeypatch.setattr(common, "_compiled", False)
    common.ensure_bytecode()
    tag = sys.implementation.cache_tag
    assert (agent / "__pycache__" / f"server.{tag}.pyc").is_file()
    assert (agent / "pkg" / "__pycache__" / f"mod.{tag}.pyc").is_file()
    assert not prefix.exists()


def test_break_it_compileall_follows_the_prefix(tmp_path, monkeypatch):
    """What ensure_bytecode did before: under a prefix, nothing lands where the sandbox looks."""
    agent, prefix = _agent_copy(tmp_path), tmp_path / "prefix"
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    compileall.compile_dir(str(agent), quiet=2)
    assert not (agent / "__pycache__").exists() and prefix.exists()
