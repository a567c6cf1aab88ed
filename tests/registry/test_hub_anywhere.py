"""The hub outside the checkout: a fresh venv, run from an unrelated directory, installs envs whose index and
sources are served from a loopback HTTP server (an index URL in $ENVHUB_REGISTRY, a wheel URL + sha256) and a local
git remote (``git+file://…@commit#subdirectory=`` + content hash checked after fetch). Indexes are layered, and
``envhub list`` says which one each entry comes from. And envhub installed from its own wheel into a venv that holds
no other envhub installs the shipped envs from the built-in index alone (the wheels inside the package)."""
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest

from envhub.registry import build_wheel, content_hash, copy_tree, file_hash, source_files
from helpers import ROOT

pytestmark = pytest.mark.slow


@pytest.fixture
def served(tmp_path):
    """An HTTP server on 127.0.0.1 (ephemeral port) serving ``tmp_path/srv``; yields (dir, base URL)."""
    root = tmp_path / "srv"
    root.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def git_remote(tmp_path: Path, env_dir: str, sub: str) -> tuple[Path, str]:
    """A local git repository holding a copy of ``environments/<env_dir>`` at ``sub``; (repo, commit)."""
    repo = tmp_path / "remote"
    src = ROOT / "environments" / env_dir
    for rel in source_files(src):
        (repo / sub / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / rel, repo / sub / rel)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "env"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    return repo, commit


def envhub_in(python: Path, cwd: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    code = f"import sys; sys.argv = ['envhub', *{list(args)!r}]; from envhub.cli import main; main()"
    return subprocess.run([str(python), "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def purelib(python: Path) -> Path:
    return Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())


def test_install_from_any_directory_with_index_and_sources_served(tmp_path, served, venv):
    srv, url = served
    wheels = srv / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(ROOT / "environments" / "swe_gym")], check=True)
    (wheel,) = wheels.glob("*.whl")
    repo, commit = git_remote(tmp_path, "countdown", "envs/countdown")
    index = {
        "swe-gym": {"version": "0.1.0", "summary": "served", "source": f"wheels/{wheel.name}",
                    "sha256": file_hash(wheel)},
        "countdown": {"version": "0.1.0", "summary": "from git",
                      "source": f"git+file://{repo}@{commit}#subdirectory=envs/countdown",
                      "sha256": content_hash(repo / "envs" / "countdown")},
        "countdown-tampered": {"version": "0.1.0", "summary": "bad hash",
                               "source": f"git+file://{repo}@{commit}#subdirectory=envs/countdown",
                               "sha256": "0" * 64},
    }
    import tomli_w

    (srv / "index.toml").write_text(tomli_w.dumps({"envs": index}))
    elsewhere = tmp_path / "elsewhere"  # no registry.toml here or above, and not the checkout
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XDG_CONFIG_HOME")}
    env.update(HOME=str(tmp_path / "home"), ENVHUB_REGISTRY=f"{url}/index.toml")

    r = envhub_in(venv, elsewhere, env, "list", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["id"]: row for row in json.loads(r.stdout)}
    assert rows["swe-gym"]["index"] == "ENVHUB_REGISTRY" and rows["swe-gym"]["shadows"] == ["built-in 0.1.0"]
    assert rows["math-python"]["index"] == "built-in"  # the other layers stay: nothing is replaced

    r = envhub_in(venv, elsewhere, env, "install", "swe-gym", "--no-index")
    assert r.returncode == 0 and "installed swe-gym 0.1.0" in r.stdout, r.stdout + r.stderr
    assert f"url {url}/wheels/{wheel.name}" in " ".join(r.stdout.split())
    site = purelib(venv)
    assert (site / "envhub_swe_gym").is_dir()  # in the fresh venv, not the checkout's

    r = envhub_in(venv, elsewhere, env, "install", "countdown", "--no-index", "--no-build-isolation")
    assert r.returncode == 0 and "installed countdown 0.1.0" in r.stdout, r.stdout + r.stderr
    assert (site / "envhub_countdown").is_dir()

    r = envhub_in(venv, elsewhere, env, "install", "countdown-tampered", "--no-index", "--no-build-isolation")
    assert r.returncode == 1 and "sha256 mismatch" in r.stderr and "Nothing was installed" in r.stderr, r.stderr


def test_index_layers_have_a_stated_order(tmp_path, monkeypatch):
    from envhub.registry.layers import load_index

    def write(path: Path, version: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'[envs.countdown]\nversion = "{version}"\nsource = "x"\nsha256 = "{"0" * 64}"\n'
                        f'[envs.only-{version.replace(".", "")}]\nversion = "{version}"\nsource = "x"\n')

    project = tmp_path / "proj"
    write(tmp_path / "cfg" / "envhub" / "registry.toml", "9.0.0")
    write(project / "registry.toml", "8.0.0")
    write(tmp_path / "env.toml", "7.0.0")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.setenv("ENVHUB_REGISTRY", str(tmp_path / "env.toml"))
    reg = load_index(cwd=project / "sub")
    assert [layer.name for layer in reg.layers] == ["user", "project", "ENVHUB_REGISTRY", "built-in"]
    c = reg.entries["countdown"]
    assert (c.version, c.origin, c.shadows) == ("9.0.0", "user", ["project 8.0.0", "ENVHUB_REGISTRY 7.0.0",
                                                                   "built-in 0.1.0"])
    assert {"only-900", "only-800", "only-700", "swe-gym"} <= set(reg.entries)  # every layer contributes
    monkeypatch.setenv("ENVHUB_REGISTRY", str(tmp_path / "missing.toml"))
    with pytest.raises(Exception, match=r"missing.toml\) does not exist"):
        load_index(cwd=project)


def venv_without_envhub(path: Path) -> Path:
    """A fresh venv that reaches the project's dependencies but not envhub or its envs: this interpreter's
    site-packages minus every envhub distribution (the editable envhub and env installs), through a directory of
    symlinks added as a site directory. Returns its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    shadow = path / "parent-site"
    shadow.mkdir()
    parent = Path(sysconfig.get_paths()["purelib"])
    for item in parent.iterdir():
        if not item.name.lower().startswith(("envhub", "__editable__")):
            (shadow / item.name).symlink_to(item)
    (purelib(python) / "_envhub_test_parent.pth").write_text(f"import site; site.addsitedir({str(shadow)!r})\n")
    return python


def test_pip_installed_envhub_installs_shipped_envs_from_the_builtin_index(tmp_path):
    t0 = time.perf_counter()
    stage = tmp_path / "stage"  # envhub's package sources only, as an sdist would carry them
    copy_tree(ROOT / "envhub", stage / "envhub")
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(ROOT / name, stage / name)
    envhub_wheel = build_wheel(stage, tmp_path / "dist").path
    python = venv_without_envhub(tmp_path / "venv")
    site = purelib(python)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(envhub_wheel)], check=True)
    elsewhere = tmp_path / "elsewhere"  # not the checkout, no registry.toml here or above
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XDG_CONFIG_HOME", "ENVHUB_REGISTRY")}
    env["HOME"] = str(tmp_path / "home")  # no user index
    envhub_cli = str(python.parent / "envhub")  # the console script pip wrote

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([*args], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=600)

    where = run(str(python), "-c", "import envhub; print(envhub.__file__)")
    assert where.stdout.strip() == str(site / "envhub" / "__init__.py"), where.stdout + where.stderr

    r = run(envhub_cli, "list", "--json")
    assert r.returncode == 0, r.stderr
    rows = {row["id"]: row for row in json.loads(r.stdout)}
    assert sorted(rows) == ["code-contests", "countdown", "guess-number", "judged-qa", "math-python", "swe-gym"]
    assert {(row["index"], row["installed"], row["admission"] != "-") for row in rows.values()} == \
        {("built-in", None, True)}
    r = run(envhub_cli, "list")
    assert r.returncode == 0 and "countdown" in r.stdout, r.stderr
    index = site / "envhub" / "registry" / "index.toml"
    assert f"indexes, highest priority first: built-in ({index})" in " ".join(r.stdout.split())

    r = run(envhub_cli, "install", "countdown", "--no-index")
    assert r.returncode == 0 and "installed countdown 0.1.0" in r.stdout, r.stdout + r.stderr
    shipped = site / "envhub" / "registry" / "wheels" / "envhub_countdown-0.1.0-py3-none-any.whl"
    assert f"fetchingfile{shipped}" in "".join(r.stdout.split())  # the wheel inside the installed envhub (the
    # console wraps long lines)

    r = run(envhub_cli, "info", "countdown", "--json")
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["installed"]["distribution"] == "envhub-countdown" and info["installed"]["tasks"] == 32
    assert info["index"]["from"] == "built-in" and info["admission_report"]["fit"] is True  # the report ships too
    play = run(str(python), "-c", "import envhub, envhub_countdown\n"
               "env = envhub.make('countdown'); task = envhub.get_spec('countdown').load_tasks()[0]\n"
               "msgs, _ = env.reset(options={'task': task}); print(envhub_countdown.__file__, len(msgs))")
    assert play.returncode == 0, play.stderr
    assert play.stdout.split()[0] == str(site / "envhub_countdown" / "__init__.py")
    print(f"fresh-venv hub test: {time.perf_counter() - t0:.1f} s; envhub wheel {envhub_wheel.stat().st_size} bytes")
