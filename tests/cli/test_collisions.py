"""A colliding id stays local: two real installed distributions claim ``good-env``; every other env keeps working
(``list``, ``info``, ``validate``, ``rollout``, ``envhub.make``, gymnasium ids) and the clash names both claimants
with the commands that fix it. ``envhub uninstall ID --dist D`` really removes one claimant (pip, RECORD-driven)."""
import base64
import hashlib
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from helpers import make_dist, run_cli, run_py

PLUGIN = '''
import envhub
from envhub import EnvSpec, Response, TextEnv

class Env(TextEnv):
    blocking = False
    def start(self, task): return "say ok"
    def respond(self, action): return Response(done=True, artifacts={{"answer": action.text}})

@envhub.hookimpl
def envhub_register(registry):
    registry.register(EnvSpec(id="{id}", env=Env, tasks=lambda split: [{{"task_id": "a"}}],
                              verifier=lambda t, a: a["answer"] == "ok", golden=lambda t, m: "ok"))
'''


def _add_record(site, dist: str, module: str, version: str = "0.1.0") -> None:
    """Give a made distribution the RECORD pip needs to uninstall it (as a real wheel install leaves)."""
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    rows = []
    for path in [*(p for p in info.iterdir()), site / f"{module}.py"]:
        digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
        rows.append(f"{path.relative_to(site)},sha256={digest},{path.stat().st_size}")
    rows.append(f"{(info / 'RECORD').relative_to(site)},,")
    (info / "RECORD").write_text("\n".join(rows) + "\n")
    (info / "INSTALLER").write_text("pip\n")


@pytest.fixture
def clash(tmp_path):
    make_dist(tmp_path, "plugin-good", {"good-env": "plugin_good"}, {"plugin_good": PLUGIN.format(id="good-env")})
    make_dist(tmp_path, "plugin-impostor", {"good-env": "plugin_impostor"},
              {"plugin_impostor": PLUGIN.format(id="good-env")})
    make_dist(tmp_path, "plugin-other", {"other-env": "plugin_other"}, {"plugin_other": PLUGIN.format(id="other-env")})
    for dist, module in (("plugin-good", "plugin_good"), ("plugin-impostor", "plugin_impostor")):
        _add_record(tmp_path, dist, module)
    return tmp_path


def test_collision_disables_only_that_id_in_the_api(clash):
    r = run_py("""
        import gymnasium, envhub
        from envhub.plugins import PluginCollision
        ids = envhub.list_envs()
        assert 'good-env' in ids and 'other-env' in ids and 'countdown' in ids, ids
        env = envhub.make('other-env', grade=True)
        env.close()
        g = gymnasium.make('envhub/other-env-v0'); g.reset(seed=0); print('gym', g.step('ok')[1])
        try:
            envhub.get_spec('good-env')
        except PluginCollision as e:
            print('CLASH', e)
        try:
            gymnasium.make('envhub/good-env-v0')
        except Exception as e:
            print('GYM', type(e).__name__)
    """, clash)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gym 1.0" in r.stdout
    line = next(x for x in r.stdout.splitlines() if x.startswith("CLASH"))
    for text in ("plugin-good 0.1.0 (plugin_good)", "plugin-impostor 0.1.0 (plugin_impostor)",
                 "envhub uninstall good-env --dist plugin-impostor", "pip uninstall plugin-good"):
        assert text in line, line


@pytest.mark.slow
def test_collision_keeps_list_info_validate_rollout_of_other_ids_working(clash):
    r = run_cli("list", "--json", site=clash)
    assert r.returncode == 0, r.stdout + r.stderr
    assert '"id": "other-env"' in r.stdout and '"id": "countdown"' in r.stdout
    assert "plugin-impostor" in r.stdout  # the disabled row says why
    r = run_cli("list", site=clash)
    assert r.returncode == 0 and "COLLISION" in r.stdout and "disabled:" in r.stdout, r.stdout + r.stderr
    r = run_cli("info", "other-env", site=clash)
    assert r.returncode == 0 and "plugin-other" in r.stdout, r.stdout + r.stderr
    r = run_cli("info", "good-env", site=clash)
    assert r.returncode == 0 and "plugin-impostor" in r.stdout, r.stdout + r.stderr
    r = run_cli("validate", "other-env", site=clash)
    assert r.returncode == 0 and "1/1 tasks admitted" in r.stdout, r.stdout + r.stderr
    r = run_cli("rollout", "other-env", "--model", "golden", "--tokenizer", "tiny", "-n", "1", site=clash)
    assert r.returncode == 0 and "done=1" in r.stdout, r.stdout + r.stderr
    r = run_cli("validate", "good-env", site=clash)
    assert r.returncode == 1 and "plugin-good" in r.stderr and "plugin-impostor" in r.stderr, r.stdout + r.stderr
    assert "Traceback" not in r.stderr


def _venv_site(path: Path) -> tuple[Path, Path]:
    """A real venv (no pip of its own; it sees this interpreter's packages through a .pth): (python, purelib)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    parent = sysconfig.get_paths()["purelib"]
    (purelib / "_envhub_test_parent.pth").write_text(f"import site; site.addsitedir({parent!r})\n")
    return python, purelib


@pytest.mark.slow
def test_uninstall_of_a_colliding_id_asks_which_then_removes_one(tmp_path):
    python, site = _venv_site(tmp_path / "v")
    for dist, module in (("plugin-good", "plugin_good"), ("plugin-impostor", "plugin_impostor")):
        make_dist(site, dist, {"good-env": module}, {module: PLUGIN.format(id="good-env")})
        _add_record(site, dist, module)
    py = ("--python", str(python))
    r = run_cli("uninstall", "good-env", *py)
    assert r.returncode == 1 and "--dist plugin-impostor" in r.stderr, r.stdout + r.stderr
    assert (site / "plugin_impostor.py").exists()  # nothing removed without a choice
    r = run_cli("uninstall", "good-env", "--dist", "plugin-nobody", *py)
    assert r.returncode == 1 and "does not claim" in r.stderr, r.stdout + r.stderr
    r = run_cli("uninstall", "good-env", "--dist", "plugin-impostor", *py)
    assert r.returncode == 0 and "uninstalled plugin-impostor" in r.stdout, r.stdout + r.stderr
    assert not (site / "plugin_impostor.py").exists() and (site / "plugin_good.py").exists()
    r = subprocess.run([str(python), "-c", "import envhub; print(envhub.get_spec('good-env').distribution)"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "plugin-good", r.stdout + r.stderr


def test_uninstall_that_pip_silently_skips_is_an_error(clash):
    """pip exits 0 but removes nothing for a distribution outside the target environment: envhub checks after."""
    r = run_cli("uninstall", "good-env", "--dist", "plugin-impostor", site=clash)
    assert r.returncode == 1 and "still claims 'good-env'" in r.stderr, r.stdout + r.stderr


def test_gymnasium_prefix_form_works_without_import_envhub():
    """The documented form for code that never imports envhub (README: Using an environment)."""
    r = run_py("""
        import gymnasium
        env = gymnasium.make('envhub:envhub/guess-number-v0')
        obs, info = env.reset(seed=0)
        print('ok', obs[-1]['role'])
    """)
    assert r.returncode == 0 and "ok user" in r.stdout, r.stdout + r.stderr
