"""Wheel entries: `registry add` builds a reproducible wheel beside the index, `verify` tells a wheel gone stale from
its source tree (and, with --rebuild, one that is not what its tree builds to), `--reuse-admission` keeps an
admission only for the very tree it ran on."""
from __future__ import annotations

import os
import shutil

import pytest
from click.testing import CliRunner

from envhub.cli import main
from envhub.registry import (
    PublishRefused, Registry, build_wheel, compare_wheels, content_hash, copy_tree, file_hash, publish, verify,
)


def cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_wheel_build_is_reproducible_from_content_alone(plugin, tmp_path):
    root = plugin("repro-env")
    a = build_wheel(root, tmp_path / "a")
    # another copy of the tree: other mtimes, modes, build droppings, path; the same content
    other = copy_tree(root, tmp_path / "elsewhere" / "repro-env")
    module = other / "envhub_repro_env" / "__init__.py"
    os.utime(module, (1e9, 1e9))
    os.chmod(module, 0o775)
    (other / "build" / "lib").mkdir(parents=True)
    (other / "build" / "lib" / "stale.py").write_text("left behind by an old build\n")
    b = build_wheel(other, tmp_path / "b")
    assert a.path.name == b.path.name == "envhub_repro_env-0.1.0-py3-none-any.whl"
    assert a.sha256 == b.sha256 == file_hash(a.path) and a.source_sha256 == content_hash(root)
    assert compare_wheels(a.path, b.path) == []
    module.write_text(module.read_text() + "\n# one more line\n")
    c = build_wheel(other, tmp_path / "c")
    assert c.sha256 != a.sha256 and c.source_sha256 != a.source_sha256
    assert compare_wheels(a.path, c.path) == ["differs: envhub_repro_env/__init__.py"]


@pytest.mark.slow
def test_verify_tells_a_stale_wheel_and_rebuild_a_forged_one(plugin, tmp_path):
    root = plugin("stale-env")
    reg_path = tmp_path / "registry.toml"
    publish(root, Registry.load(reg_path), n=2)
    entry = Registry.load(reg_path).get("stale-env")
    wheel = tmp_path / entry.source
    res = cli("registry", "verify", "--registry", str(reg_path))
    assert res.exit_code == 0 and "source tree envs/stale-env unchanged" in res.output, res.output
    res = cli("registry", "verify", "--rebuild", "--registry", str(reg_path))
    assert res.exit_code == 0 and "the same bytes" in res.output, res.output

    # the tree changes after its wheel was built: the wheel's own hash still matches, but it is stale
    data = root / "envhub_stale_env" / "data" / "test.jsonl"
    original = data.read_bytes()
    data.write_bytes(original.replace(b'"numbers": [', b'"numbers": [7, ', 1))
    res = cli("registry", "verify", "--registry", str(reg_path))
    assert res.exit_code == 1, res.output
    assert f"STALE  stale-env: {entry.source} was built from envs/stale-env" in res.output
    assert f"now hashes to {content_hash(root)}" in res.output and "Rebuild it: envhub registry add" in res.output
    data.write_bytes(original)
    assert cli("registry", "verify", "--registry", str(reg_path)).exit_code == 0

    # a wheel built from another tree, its sha256 written into the entry (source_sha256 left as it was): the hash
    # checks pass; only a rebuild from the tree shows that the wheel is not what the tree builds to
    forged_tree = copy_tree(root, tmp_path / "forged" / "stale-env")
    (forged_tree / "envhub_stale_env" / "__init__.py").write_text(
        (root / "envhub_stale_env" / "__init__.py").read_text() + "\nBACKDOOR = True\n")
    forged = build_wheel(forged_tree, tmp_path / "forged-out")
    shutil.copyfile(forged.path, wheel)
    reg_path.write_text(reg_path.read_text().replace(entry.sha256, forged.sha256))
    assert cli("registry", "verify", "--registry", str(reg_path)).exit_code == 0
    res = cli("registry", "verify", "--rebuild", "--registry", str(reg_path))
    assert res.exit_code == 1 and "DIFFER stale-env" in res.output, res.output
    assert "is not what envs/stale-env builds to: differs: envhub_stale_env/__init__.py" in res.output
    checks = verify(Registry.load(reg_path), rebuild=True)
    assert [(c.status, c.env_id) for c in checks] == [("DIFFER", "stale-env")]


@pytest.mark.slow
def test_reuse_admission_only_for_the_tree_it_ran_on(plugin, tmp_path, monkeypatch):
    root = plugin("reuse-env")
    reg_path = tmp_path / "registry.toml"
    publish(root, Registry.load(reg_path), n=2, wheel=False)  # a tree entry: its sha256 is the tree's content hash
    before = Registry.load(reg_path).get("reuse-env")
    report = tmp_path / "reports" / "reuse-env-0.1.0.json"
    report_bytes = report.read_bytes()

    import envhub.admission

    def no_admission(*a, **k):
        raise AssertionError("admission must not run with --reuse-admission")

    monkeypatch.setattr(envhub.admission, "admit", no_admission)
    res = cli("registry", "add", str(root), "--reuse-admission", "--registry", str(reg_path))
    assert res.exit_code == 0 and "admission 2/2 (reused)" in res.output, res.output
    after = Registry.load(reg_path).get("reuse-env")
    assert after.admission == before.admission and report.read_bytes() == report_bytes
    assert after.source == "wheels/envhub_reuse_env-0.1.0-py3-none-any.whl"
    assert after.sha256 == file_hash(tmp_path / after.source)
    assert (after.source_tree, after.source_sha256) == ("envs/reuse-env", before.sha256)
    # again from the wheel entry (its source_sha256 is now the admitted hash): the same wheel, byte for byte
    assert cli("registry", "add", str(root), "--reuse-admission", "--registry", str(reg_path)).exit_code == 0
    assert Registry.load(reg_path).get("reuse-env") == after

    # one changed byte in the tree: the admission was not run on it, so it cannot be kept; nothing is written
    index_bytes = reg_path.read_bytes()
    wheel_bytes = (tmp_path / after.source).read_bytes()
    readme = root / "README.md"
    readme.write_text(readme.read_text() + "x")
    with pytest.raises(PublishRefused, match=f"admission ran on a source tree with content hash {before.sha256}"):
        publish(root, Registry.load(reg_path), reuse_admission=True)
    res = cli("registry", "add", str(root), "--reuse-admission", "--registry", str(reg_path))
    assert res.exit_code == 1 and "cannot reuse its admission" in res.output and "nothing written" in res.output
    assert reg_path.read_bytes() == index_bytes and (tmp_path / after.source).read_bytes() == wheel_bytes
    assert sorted(os.listdir(tmp_path / "wheels")) == [after.source.split("/")[1]]

    # back to the tree that was admitted, and back to a tree entry: the wheel no entry names any more is removed
    readme.write_text(readme.read_text()[:-1])
    publish(root, Registry.load(reg_path), reuse_admission=True, wheel=False)
    assert Registry.load(reg_path).get("reuse-env") == before and os.listdir(tmp_path / "wheels") == []

    with pytest.raises(PublishRefused, match="has no admitted entry for it"):
        publish(root, Registry.load(tmp_path / "other.toml"), reuse_admission=True)
    with pytest.raises(Exception, match="--tasks does not apply"):
        publish(root, Registry.load(reg_path), reuse_admission=True, n=3)
