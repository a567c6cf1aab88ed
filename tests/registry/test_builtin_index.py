"""The built-in hub index names wheels shipped beside it in the package, pinned by sha256 and built from the
unchanged env trees; a built-in wheel whose bytes were changed is refused before pip runs (fast, no install)."""
from __future__ import annotations

import fnmatch
import importlib
import shutil

import pytest
from click.testing import CliRunner

from envhub.cli import main
from envhub.registry import HashMismatch, PipOptions, Registry, compute_sha256, install, tomllib, verify
from envhub.registry.layers import BUILTIN
from helpers import ROOT

install_mod = importlib.import_module("envhub.registry.install")  # the module (the package's `install` is the function)
SHIPPED = {"code-contests": "code_contests", "countdown": "countdown", "guess-number": "guess_number", "judged-qa": "judged_qa",
           "math-python": "math_python", "swe-gym": "swe_gym"}


def test_builtin_index_names_wheels_shipped_beside_it():
    reg = Registry.load(BUILTIN)
    assert reg.ids() == sorted(SHIPPED)
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = package_data["envhub.registry"]
    for env_id, env_dir in SHIPPED.items():
        e = reg.get(env_id)
        dist = f"envhub_{env_dir}"
        assert e.source == f"wheels/{dist}-{e.version}-py3-none-any.whl"  # inside the package, no checkout path
        assert (BUILTIN.parent / e.source).is_file() and (BUILTIN.parent / e.admission["report"]).is_file()
        assert e.source_tree == f"../../environments/{env_dir}"
        assert compute_sha256(BUILTIN.parent / e.source) == e.sha256
        for rel in (e.source, e.admission["report"]):
            assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not package data ({globs})"
    # each wheel is the build of its env's tree as it is now (the tree is compared: this is the checkout)
    checks = verify(reg)
    assert [(c.env_id, c.status) for c in checks] == [(i, "ok") for i in sorted(SHIPPED)], checks
    assert all("unchanged" in c.message for c in checks), checks
    assert (ROOT / "registry.toml").resolve() == BUILTIN.resolve()  # the checkout's index is the built-in one


@pytest.mark.slow
def test_tampered_builtin_wheel_is_refused_before_pip_runs(tmp_path, venv, pip_list, monkeypatch):
    shutil.copyfile(BUILTIN, tmp_path / "index.toml")
    shutil.copytree(BUILTIN.parent / "wheels", tmp_path / "wheels")
    reg = Registry.load(tmp_path / "index.toml")
    entry = reg.get("countdown")
    wheel = tmp_path / entry.source
    assert compute_sha256(wheel) == entry.sha256  # the copy as shipped passes the check
    data = bytearray(wheel.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit, inside a compressed member
    wheel.write_bytes(bytes(data))

    ran = []
    monkeypatch.setattr(install_mod, "_run_pip", lambda *a, **k: ran.append(a) or pytest.fail("pip ran"))
    before = pip_list(venv)
    with pytest.raises(HashMismatch) as e:
        install(reg, "countdown", PipOptions(python=str(venv), no_deps=True, no_index=True))
    assert entry.sha256 in str(e.value) and compute_sha256(wheel) in str(e.value)
    assert "Nothing was installed" in str(e.value)
    res = CliRunner().invoke(main, ["install", "countdown", "--registry", str(tmp_path / "index.toml"), "--python",
                                    str(venv), "--no-deps", "--no-index"], catch_exceptions=False)
    assert res.exit_code == 1 and "sha256 mismatch" in res.output, res.output
    assert ran == [] and pip_list(venv) == before
