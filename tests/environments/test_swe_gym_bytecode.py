"""The swe-gym grader plants its runner's sibling modules as bytecode beside them (``testrun.write_bytecode``); the
sandboxed runner (``python -I``) reads ``__pycache__`` there. A host process with a ``sys.pycache_prefix`` (a lazily
compiled venv: ``scripts/lazy-bytecode.sh``) once sent the ``.pyc`` under the prefix, where the grader could not
even make its directory: every swe-gym grading in the trainer tier crashed."""
from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("envhub_swe_gym")
from envhub_swe_gym.testrun import write_bytecode  # noqa: E402


def test_the_bytecode_is_what_a_fresh_isolated_interpreter_loads_under_a_prefix(tmp_path, monkeypatch):
    prefix = tmp_path / "prefix"
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))
    source = tmp_path / "m.py"
    source.write_text("X = 1\n")  # the source says 1; the planted bytecode says 2 (same mtime and size header)
    pyc = write_bytecode(source, compile("X = 2\n", "m.py", "exec"))
    assert pyc == tmp_path / "__pycache__" / f"m.{sys.implementation.cache_tag}.pyc" and pyc.is_file()
    assert not prefix.exists()
    out = subprocess.run([sys.executable, "-I", "-B", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); "
                          "import m; print(m.X)"], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "2", out
