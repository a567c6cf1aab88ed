"""install / uninstall / registry add, for real: scaffolded plugins, real admission, real pip into a throwaway venv."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from envhub.cli import main
from envhub.plugins import UnknownEnv
from envhub.registry import (
    Entry, HashMismatch, InstallError, PipOptions, PublishRefused, Registry, RegistryError, content_hash, file_hash,
    install, probe, publish, uninstall,
)


def opts(venv, **kw) -> PipOptions:
    # --no-deps / --no-build-isolation: the test venv already sees envhub and setuptools; nothing is downloaded
    return PipOptions(python=str(venv), no_deps=True, no_build_isolation=True, **kw)


def published(plugin, tmp_path, name: str, kind: str = "text") -> Registry:
    """A local development index: the entry names the source tree (``registry add --tree``)."""
    root = plugin(name, kind)
    reg = Registry.load(tmp_path / "registry.toml")
    publish(root, reg, n=2, wheel=False)
    return Registry.load(tmp_path / "registry.toml")


def cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def run_cli_in(venv, *args: str) -> subprocess.CompletedProcess:
    code = f"import sys; sys.argv = ['envhub', *{list(args)!r}]; from envhub.cli import main; main()"
    return subprocess.run([str(venv), "-c", code], capture_output=True, text=True, cwd="/", timeout=300)


# ---- registry add / publish -----------------------------------------------------------------------------------------
@pytest.mark.slow
def test_registry_add_writes_entry_with_hash_and_admission(plugin, tmp_path):
    root = plugin("pub-env", "tool")
    reg_path = tmp_path / "registry.toml"
    res = cli("registry", "add", str(root), "--registry", str(reg_path))
    assert res.exit_code == 0, res.output
    entry = Registry.load(reg_path).get("pub-env")
    wheel = tmp_path / "wheels" / "envhub_pub_env-0.1.0-py3-none-any.whl"  # built into wheels/ beside the index
    assert entry.source == "wheels/envhub_pub_env-0.1.0-py3-none-any.whl"  # relative to the registry file
    assert entry.sha256 == file_hash(wheel)
    assert (entry.source_tree, entry.source_sha256) == ("envs/pub-env", content_hash(root))
    assert not (root / "build").exists() and not list(root.glob("*.egg-info"))  # built from a private copy
    assert entry.version == "0.1.0" and entry.tags == ["example", "tools", "multi-turn"]
    assert "basket" in entry.summary
    assert entry.admission == {"tasks": 8, "passed": 8, "report": "reports/pub-env-0.1.0.json"}
    report = json.loads((tmp_path / "reports" / "pub-env-0.1.0.json").read_text())
    assert report["fit"] is True and report["tasks_admitted"] == 8

    # `publish` is the same command; re-publishing updates the entry in place and keeps keys envhub does not know
    text = reg_path.read_text().replace('[envs.pub-env.admission]', 'homepage = "https://example.org"\n\n'
                                        '[envs.pub-env.admission]')
    reg_path.write_text(text)
    res = cli("registry", "publish", str(root), "--registry", str(reg_path), "--tasks", "3")
    assert res.exit_code == 0, res.output
    reg = Registry.load(reg_path)
    assert reg.ids() == ["pub-env"]
    assert reg.get("pub-env").admission["tasks"] == 3
    assert reg.get("pub-env").extra == {"homepage": "https://example.org"}


@pytest.mark.slow
def test_registry_add_refuses_an_unfit_verifier(plugin, tmp_path):
    root = plugin("lax-env")
    module = root / "envhub_lax_env" / "__init__.py"
    src = module.read_text()
    lax = src.replace('    answer = parse_answer(str(artifacts.get("answer", "")))\n',
                      '    return Score(1.0, True, {"lax": True})  # accepts anything: the no-op passes\n', 1)
    assert lax != src
    module.write_text(lax)
    reg_path = tmp_path / "registry.toml"
    with pytest.raises(PublishRefused, match="noop check failed"):
        publish(root, Registry.load(reg_path))
    assert not reg_path.exists() and not (tmp_path / "reports").exists()  # nothing written: no entry, no report,
    assert not (tmp_path / "wheels").exists()  # no wheel
    # the attack: a refused publish of the same id+version must not overwrite the report a valid entry points to
    valid = tmp_path / "reports" / "lax-env-0.1.0.json"
    valid.parent.mkdir()
    valid.write_text('{"fit": true}\n')
    with pytest.raises(PublishRefused, match="nothing written"):
        publish(root, Registry.load(reg_path))
    assert valid.read_text() == '{"fit": true}\n'

    with pytest.raises(RegistryError, match="inside the plugin tree"):
        publish(root, Registry.load(root / "registry.toml"))
    res = cli("registry", "add", str(root), "--registry", str(reg_path))  # same module: already imported
    assert res.exit_code == 1 and "unfit" in res.output and "--force" in res.output
    assert not (tmp_path / "wheels").exists()
    res = cli("registry", "add", str(root), "--registry", str(reg_path), "--force")
    assert res.exit_code == 0, res.output
    assert Registry.load(reg_path).get("lax-env").admission["passed"] == 0
    assert (tmp_path / "wheels" / "envhub_lax_env-0.1.0-py3-none-any.whl").is_file()


# ---- install / uninstall --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_install_local_tree_checks_hash_installs_and_uninstalls(plugin, tmp_path, venv, pip_list):
    reg = published(plugin, tmp_path, "good-env")
    root = tmp_path / "envs" / "good-env"
    res = install(reg, "good-env==0.1.0", opts(venv))
    assert (res.env_id, res.version, res.distribution) == ("good-env", "0.1.0", "envhub-good-env")
    assert res.sha256 == reg.get("good-env").sha256 and res.warnings == []
    assert "envhub-good-env" in pip_list(venv)
    assert not (root / "build").exists() and not list(root.glob("*.egg-info"))  # the author's tree stays clean

    # a fresh process of that venv finds it and loads it; `envhub info` shows the installed spec
    p = probe("good-env", str(venv))
    assert p["found"] and p["loaded"] and p["spec_version"] == "0.1.0" and p["gym_id"] == "envhub/good-env-v0"
    out = run_cli_in(venv, "info", "good-env", "--json", "--registry", str(reg.path))
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["installed"]["distribution"] == "envhub-good-env" and info["installed"]["tasks"] == 8
    assert info["registry"]["sha256"] == res.sha256 and info["admission_report"]["fit"] is True

    gone = uninstall("good-env", opts(venv))
    assert (gone.distribution, gone.version) == ("envhub-good-env", "0.1.0")
    assert "envhub-good-env" not in pip_list(venv)
    assert not probe("good-env", str(venv), load=False)["found"]
    with pytest.raises(UnknownEnv, match="unknown env 'good-env'"):
        uninstall("good-env", opts(venv))


@pytest.mark.slow
def test_tampered_source_is_refused_before_pip_runs(plugin, tmp_path, venv, pip_list):
    reg = published(plugin, tmp_path, "tamper-env")
    data = tmp_path / "envs" / "tamper-env" / "envhub_tamper_env" / "data" / "test.jsonl"
    data.write_text(data.read_text().replace('"numbers": [', '"numbers": [1000, ', 1))  # one changed task row
    before = pip_list(venv)
    with pytest.raises(HashMismatch) as e:
        install(reg, "tamper-env", opts(venv))
    msg = str(e.value)
    assert reg.get("tamper-env").sha256 in msg and content_hash(data.parents[2]) in msg
    assert "Nothing was installed" in msg
    assert pip_list(venv) == before and not probe("tamper-env", str(venv), load=False)["found"]

    res = cli("install", "tamper-env", "--registry", str(reg.path), "--python", str(venv), "--no-deps")
    assert res.exit_code == 1 and "sha256 mismatch" in res.output
    assert pip_list(venv) == before


def test_install_refuses_unknown_ids_wrong_versions_and_unpinned_entries(tmp_path, venv):
    reg = Registry(tmp_path / "registry.toml", {
        "countdown": Entry("countdown", "0.1.0", source="envhub-countdown==0.1.0", sha256="ab" * 32),
        "unpinned": Entry("unpinned", "0.1.0", source="envs/unpinned"),
    })
    reg.save()
    with pytest.raises(UnknownEnv, match="Did you mean: countdown"):
        install(reg, "countdonw", opts(venv))
    with pytest.raises(RegistryError, match="has countdown 0.1.0, not 0.2.0"):
        install(reg, "countdown==0.2.0", opts(venv))
    with pytest.raises(RegistryError, match="no sha256: refusing"):
        install(reg, "unpinned", opts(venv))
    res = cli("install", "countdonw", "--registry", str(reg.path))
    assert res.exit_code == 1 and "Did you mean: countdown?" in res.output
    with pytest.raises(InstallError, match="does not exist"):
        PipOptions(python=str(tmp_path / "no-python"))


@pytest.mark.slow
def test_cli_list_search_info_install_uninstall(plugin, tmp_path, venv, pip_list):
    reg = published(plugin, tmp_path, "cli-env", "tool")
    r = str(reg.path)
    rows = json.loads(cli("list", "--registry", r, "--json").output)
    row = next(x for x in rows if x["id"] == "cli-env")
    assert row["admission"] == "2/2" and row["installed"] is None and row["version"] == "0.1.0"
    assert "cli-env" in cli("list", "--registry", r).output
    found = json.loads(cli("search", "basket", "tools", "--registry", r, "--json").output)
    assert [x["id"] for x in found] == ["cli-env"]
    assert "no environment matches" in cli("search", "nothing-like-it", "--registry", r).output
    info = json.loads(cli("info", "cli-env", "--registry", r, "--json").output)
    assert info["installed"] is None and info["registry"]["admission"]["passed"] == 2
    shown = cli("info", "cli-env", "--registry", r).output
    assert "basket" in shown and "2/2 tasks admitted" in shown and "envhub install cli-env" in shown
    res = cli("info", "cli-envv", "--registry", r)
    assert res.exit_code == 1 and "Did you mean: cli-env?" in res.output

    res = cli("install", "cli-env", "--registry", r, "--python", str(venv), "--no-deps", "--no-build-isolation")
    assert res.exit_code == 0, res.output
    assert "installed cli-env 0.1.0" in res.output and "envhub-cli-env" in pip_list(venv)
    out = run_cli_in(venv, "list", "--json", "--registry", r)
    assert next(x for x in json.loads(out.stdout) if x["id"] == "cli-env")["installed"] == "0.1.0"
    res = cli("uninstall", "cli-env", "--python", str(venv))
    assert res.exit_code == 0 and "uninstalled envhub-cli-env 0.1.0" in res.output
    assert "envhub-cli-env" not in pip_list(venv)


def test_registry_hash_and_verify_commands(plugin, tmp_path):
    reg = published(plugin, tmp_path, "verify-env")
    root = tmp_path / "envs" / "verify-env"
    assert cli("registry", "hash", str(root)).output.strip() == content_hash(root)
    res = cli("registry", "verify", "--registry", str(reg.path))
    assert res.exit_code == 0 and "ok" in res.output
    (root / "README.md").write_text("changed\n")
    res = cli("registry", "verify", "--registry", str(reg.path))
    assert res.exit_code == 1 and "DIFFER verify-env" in res.output


@pytest.mark.slow
def test_install_wheel_from_requirement_and_url_with_rollback(plugin, tmp_path, venv, pip_list):
    root = plugin("wheel-env")
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(root)], check=True, capture_output=True)
    (whl,) = wheels.glob("*.whl")
    digest = file_hash(whl)
    reg = Registry(tmp_path / "registry.toml", {
        "wheel-env": Entry("wheel-env", "0.1.0", source="envhub-wheel-env==0.1.0", sha256=digest),
        # an entry whose package does not provide its id: installed, not found, rolled back
        "misnamed": Entry("misnamed", "0.1.0", source=whl.as_uri(), sha256=digest),
        "bad-wheel": Entry("bad-wheel", "0.1.0", source=f"wheels/{whl.name}", sha256="0" * 64),
    })
    reg.save()
    find = PipOptions(python=str(venv), no_index=True, find_links=(str(wheels),))  # with deps, from local wheels
    res = install(reg, "wheel-env", find)
    assert res.distribution == "envhub-wheel-env" and res.sha256 == digest
    res = install(reg, "wheel-env", find)  # same version again: the wheel is forced back in, not skipped
    assert probe("wheel-env", str(venv))["loaded"]
    uninstall("wheel-env", opts(venv))

    before = pip_list(venv)
    with pytest.raises(InstallError, match="does not provide env 'misnamed'.*uninstalled again"):
        install(reg, "misnamed", opts(venv))
    assert pip_list(venv) == before
    with pytest.raises(HashMismatch, match=digest):
        install(reg, "bad-wheel", opts(venv))
    assert pip_list(venv) == before
