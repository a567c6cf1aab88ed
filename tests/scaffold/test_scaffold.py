"""``envhub init``: the scaffold, untouched, passes admission and installs with ``pip install -e``."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

from envhub.cli import main
from envhub.registry import PipOptions, tomllib, uninstall
from envhub.scaffold import ScaffoldError, names, scaffold
from envhub.task import load_jsonl

KINDS = ["text", "tool"]


def cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_init_writes_a_plugin_package(tmp_path):
    res = cli("init", "my-env", "--dir", str(tmp_path))
    assert res.exit_code == 0, res.output
    root = tmp_path / "my-env"
    files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
    assert files == [".gitignore", "README.md", "envhub_my_env/__init__.py", "envhub_my_env/data/test.jsonl",
                     "envhub_my_env/generate.py", "pyproject.toml"]
    meta = tomllib.loads((root / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "envhub-my-env" and meta["project"]["dependencies"] == ["envhub"]
    assert meta["project"]["entry-points"]["envhub"] == {"my-env": "envhub_my_env"}
    assert meta["tool"]["setuptools"]["package-data"] == {"envhub_my_env": ["data/*.jsonl"]}
    assert len((root / "pyproject.toml").read_text().splitlines()) <= 18
    module = (root / "envhub_my_env" / "__init__.py").read_text()
    assert 'ENV_ID = "my-env"' in module and "__ENV_ID__" not in module
    assert "__MODULE__" not in (root / "envhub_my_env" / "generate.py").read_text()
    rows = list(load_jsonl(root / "envhub_my_env" / "data" / "test.jsonl"))
    assert len(rows) == 8 and all(r["numbers"] != sorted(r["numbers"]) for r in rows)
    assert "envhub validate" in res.output and "pip install -e" in res.output


@pytest.mark.parametrize("kind", KINDS)
def test_scaffold_untouched_passes_envhub_validate(tmp_path, kind):
    root = scaffold(f"valid-{kind}", tmp_path, kind)
    out = tmp_path / "report.json"
    res = cli("validate", str(root), "--json", str(out))
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["fit"] is True and report["tasks_total"] == report["tasks_admitted"] == 8
    checks = {c["name"] for c in report["tasks"][0]["checks"]}
    assert {"golden", "noop", "deterministic"} <= checks
    assert sum(n.startswith("hack:") for n in checks) == 5 and sum(n.startswith("malformed:") for n in checks) >= 5


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.slow
def test_scaffold_installs_with_pip_install_e_untouched(tmp_path, venv, kind):
    n = names(f"edit-{kind}")
    root = scaffold(n["env_id"], tmp_path, kind)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv), "install", "-q", "--no-deps",
                    "--no-build-isolation", "--disable-pip-version-check", "-e", str(root)],
                   check=True, capture_output=True)
    try:
        # a fresh process of the venv: entry point found, gymnasium id registered, golden episode graded 1.0
        code = textwrap.dedent(f"""
            import json, sys, warnings
            import gymnasium
            from gymnasium.utils.env_checker import check_env
            import envhub

            spec = envhub.get_spec({n["env_id"]!r})
            task = dict(spec.load_tasks()[0])
            env = gymnasium.make("envhub/{n["env_id"]}-v0")
            msgs, _ = env.reset(seed=0, options={{"task": task}})
            history = list(msgs)
            while True:
                action = envhub.Action.coerce(spec.golden(task, history))
                obs, reward, terminated, truncated, info = env.step(action)
                history += [action.to_message(), *obs]
                if terminated or truncated:
                    break
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                check_env(env.unwrapped, skip_render_check=False)
            print(json.dumps({{"reward": reward, "passed": info["score"]["passed"], "dist": spec.distribution,
                              "module": sys.modules[spec.env.__module__].__file__, "turns": len(history)}}))
        """)
        proc = subprocess.run([str(venv), "-c", code], capture_output=True, text=True, cwd=tmp_path.anchor,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out["reward"] == 1.0 and out["passed"] and out["dist"] == n["dist"]
        assert out["module"] == str(root / n["module"] / "__init__.py")  # editable: runs the author's files
        if kind == "tool":
            assert out["turns"] > 3  # looked prices up before finishing
    finally:
        uninstall(n["env_id"], PipOptions(python=str(venv)))


@pytest.mark.parametrize("kind", KINDS)
def test_generate_reproduces_the_shipped_tasks(tmp_path, kind):
    root = scaffold("gen-env", tmp_path, kind, seed=7, n_tasks=5)
    data = root / "envhub_gen_env" / "data" / "test.jsonl"
    shipped = data.read_bytes()
    data.unlink()
    proc = subprocess.run([sys.executable, "-m", "envhub_gen_env.generate", "--seed", "7", "--n", "5"], cwd=root,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert data.read_bytes() == shipped
    subprocess.run([sys.executable, "-m", "envhub_gen_env.generate", "--seed", "8", "--n", "5"], cwd=root,
                   check=True, capture_output=True)
    assert data.read_bytes() != shipped  # the seed matters


def test_init_refuses_bad_names_existing_dirs_and_unknown_kinds(tmp_path):
    for bad in ("1env", "my env", "a/b", "", "x" * 65):
        with pytest.raises(ScaffoldError, match="invalid name"):
            scaffold(bad, tmp_path)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep me")
    res = cli("init", "taken", "--dir", str(tmp_path))
    assert res.exit_code == 1 and "already exists" in res.output
    assert (tmp_path / "taken" / "mine.txt").read_text() == "keep me"
    assert sorted(p.name for p in (tmp_path / "taken").iterdir()) == ["mine.txt"]
    with pytest.raises(ScaffoldError, match="unknown kind"):
        scaffold("ok-name", tmp_path, "vision")
    assert cli("init", "ok-name", "--dir", str(tmp_path), "--kind", "vision").exit_code == 2
    (tmp_path / "empty").mkdir()
    assert cli("init", "empty", "--dir", str(tmp_path)).exit_code == 0  # an empty directory is fine


def test_names_derive_dist_and_module():
    assert names("Swe_Gym-2") == {"env_id": "Swe_Gym-2", "dist": "envhub-swe-gym-2", "module": "envhub_swe_gym_2"}
