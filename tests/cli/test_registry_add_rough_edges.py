"""#28 item 8, `envhub registry add` where an author meets it: with no --registry it writes the user's index, never
the index envhub ships (even run from the checkout, where registry.toml links to it); a build backend older than
the plugin's `[build-system] requires` is one line naming the upgrade, said before admission runs, instead of pip's
raw output after it. Real CLI processes, a real scaffolded plugin, a real old setuptools (the one Python's ensurepip
bundles) put first on the path."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from envhub.registry.layers import BUILTIN
from helpers import ROOT

MIN_SETUPTOOLS = 68  # what the scaffold's pyproject.toml requires


def envhub_cli(*args: str, cwd: Path, env: dict[str, str], timeout: int = 240) -> subprocess.CompletedProcess:
    code = f"import sys; sys.argv = ['envhub', *{list(args)!r}]; from envhub.cli import main; main()"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


@pytest.fixture
def plugin(tmp_path):
    from envhub.scaffold import scaffold

    return scaffold("my-env", tmp_path / "src", "text", n_tasks=2)


@pytest.fixture
def clean_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "ENVHUB_REGISTRY"}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    return env


def _shipped() -> dict[str, bytes]:
    folder = BUILTIN.parent
    files = [BUILTIN, *sorted((folder / "reports").glob("*")), *sorted((folder / "wheels").glob("*"))]
    return {str(f): f.read_bytes() for f in files if f.is_file()}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("where", ["checkout", "elsewhere"])
@pytest.mark.slow
def test_registry_add_without_registry_writes_the_user_index_never_the_shipped_one(plugin, clean_env, tmp_path,
                                                                                  where):
    before = _shipped()
    cwd = ROOT if where == "checkout" else tmp_path
    try:
        r = envhub_cli("registry", "add", str(plugin), "--tree", "--tasks", "1", cwd=cwd, env=clean_env)
        after = _shipped()
    finally:  # should the default ever regress, leave the shipped index as it was for everyone else
        for path in set(_shipped()) - set(before):
            Path(path).unlink()
        for path, data in before.items():
            if Path(path).read_bytes() != data:
                Path(path).write_bytes(data)
    assert after == before, "registry add wrote into the index envhub ships"
    assert r.returncode == 0, r.stdout + r.stderr
    user = tmp_path / "config" / "envhub" / "registry.toml"
    assert "[envs.my-env]" in user.read_text()
    assert f"writing {user}: the user's index" in " ".join(r.stdout.split())
    r = envhub_cli("list", "--json", cwd=tmp_path, env=clean_env)  # and the hub reads it from there
    assert r.returncode == 0 and any(row["id"] == "my-env" and row["index"] == "user"
                                     for row in json.loads(r.stdout)), r.stdout + r.stderr


@pytest.mark.slow
def test_a_project_index_is_still_the_default_in_a_project(plugin, clean_env, tmp_path):
    project = tmp_path / "registry.toml"
    project.write_text("")
    r = envhub_cli("registry", "add", str(plugin), "--tree", "--tasks", "1", cwd=tmp_path, env=clean_env)
    assert r.returncode == 0 and "[envs.my-env]" in project.read_text(), r.stdout + r.stderr
    assert not (tmp_path / "config" / "envhub" / "registry.toml").exists()


@pytest.fixture(scope="module")
def old_setuptools(tmp_path_factory) -> Path:
    """A directory holding the setuptools Python's ensurepip bundles (65.5 on 3.11), to put first on the path."""
    import ensurepip

    bundled = sorted((Path(ensurepip.__file__).parent / "_bundled").glob("setuptools-*.whl"))
    if not bundled:
        pytest.skip("this Python's ensurepip bundles no setuptools (3.12+)")
    version = bundled[0].name.split("-")[1]
    if int(version.split(".")[0]) >= MIN_SETUPTOOLS:
        pytest.skip(f"the bundled setuptools {version} is not older than the scaffold needs")
    out = tmp_path_factory.mktemp("old-setuptools")
    with zipfile.ZipFile(bundled[0]) as z:
        z.extractall(out)
    return out


@pytest.mark.timeout(300)
@pytest.mark.slow
def test_registry_add_with_too_old_setuptools_says_so_before_admission(plugin, clean_env, tmp_path, old_setuptools):
    env = {**clean_env, "PYTHONPATH": f"{old_setuptools}{os.pathsep}{clean_env.get('PYTHONPATH', '')}"}
    probe = subprocess.run([sys.executable, "-c", "import setuptools; print(setuptools.__version__)"],
                           capture_output=True, text=True, env=env)
    old = probe.stdout.strip()
    assert int(old.split(".")[0]) < MIN_SETUPTOOLS, probe  # the premise: the build would use the old one
    index = tmp_path / "reg" / "registry.toml"
    r = envhub_cli("registry", "add", str(plugin), "--tasks", "1", "--registry", str(index), cwd=tmp_path, env=env)
    assert r.returncode == 1, r.stdout + r.stderr
    said = " ".join(r.stderr.split())
    assert f"needs setuptools>={MIN_SETUPTOOLS} (this environment has setuptools {old})" in said, r.stderr
    assert f"-m pip install -U 'setuptools>={MIN_SETUPTOOLS}'" in said and "--tree" in said, r.stderr
    assert "admission of" not in r.stdout and "pip wheel" not in said and "Traceback" not in said, r.stdout + said
    assert not index.parent.exists()  # nothing written
