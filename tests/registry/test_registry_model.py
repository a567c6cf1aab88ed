"""registry.toml: the model, the content hash, source kinds and which file is used (fast, no pip)."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import envhub

from envhub.plugins import UnknownEnv
from envhub.registry import (
    Entry, Registry, RegistryError, compute_sha256, content_hash, file_hash, find_registry, parse_source,
    source_files, split_requirement,
)


def tree(root, files: dict[str, bytes | str]):
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
    return root


# ---- content hash ---------------------------------------------------------------------------------------------------
def test_content_hash_is_the_documented_encoding(tmp_path):
    root = tree(tmp_path / "p", {"b.txt": "B", "a/x.py": b"\x00\x01"})
    h = hashlib.sha256()
    for rel, data in [("a/x.py", b"\x00\x01"), ("b.txt", b"B")]:
        h.update(rel.encode() + b"\0" + str(len(data)).encode() + b"\0" + data)
    assert content_hash(root) == h.hexdigest() == compute_sha256(root)


def test_content_hash_ignores_build_outputs_caches_and_vcs(tmp_path):
    root = tree(tmp_path / "p", {"pyproject.toml": "[project]\n", "pkg/__init__.py": "x = 1\n"})
    before = content_hash(root)
    tree(root, {
        "pkg/__pycache__/__init__.cpython-311.pyc": b"junk", "pkg/mod.pyc": b"junk", ".git/HEAD": "ref",
        "pkg.egg-info/PKG-INFO": "Name: pkg", "build/lib/pkg/__init__.py": "x = 2", "dist/pkg-0.1.whl": b"zip",
        ".pytest_cache/v": "1",
    })
    assert content_hash(root) == before
    assert source_files(root) == ["pkg/__init__.py", "pyproject.toml"]


def test_content_hash_is_stable_across_copies_and_mtimes_but_sees_every_byte_and_name(tmp_path):
    root = tree(tmp_path / "p", {"pkg/__init__.py": "x = 1\n", "pkg/data/t.jsonl": '{"task_id": "a"}\n'})
    digest = content_hash(root)
    copy = shutil.copytree(root, tmp_path / "elsewhere" / "q")
    (copy / "pkg/__init__.py").touch()
    assert content_hash(copy) == digest  # other place, other name, other mtime: same content, same hash
    (copy / "pkg/__init__.py").write_text("x = 2\n")
    assert content_hash(copy) != digest
    shutil.rmtree(copy)
    copy = shutil.copytree(root, tmp_path / "r")
    (copy / "pkg/data/t.jsonl").rename(copy / "pkg/data/u.jsonl")
    assert content_hash(copy) != digest  # a rename changes the hash
    (copy / "pkg/data/u.jsonl").rename(copy / "pkg/data/t.jsonl")
    (copy / "pkg/build").mkdir()
    (copy / "pkg/build/__init__.py").write_text("")  # 'build' is excluded only at the root
    assert content_hash(copy) != digest


@pytest.mark.slow
def test_content_hash_unchanged_by_a_real_build_in_the_tree(plugin):
    root = plugin("built-env")
    digest = content_hash(root)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(root / "dist"), str(root)], check=True, capture_output=True)
    assert (root / "build").is_dir() and list(root.glob("*.egg-info")) and list((root / "dist").glob("*.whl"))
    assert content_hash(root) == digest


def test_file_hash_is_plain_sha256(tmp_path):
    f = tmp_path / "x-0.1-py3-none-any.whl"
    f.write_bytes(b"abc" * 1_000_000)
    assert file_hash(f) == hashlib.sha256(b"abc" * 1_000_000).hexdigest() == compute_sha256(f)
    with pytest.raises(RegistryError, match="does not exist"):
        compute_sha256(tmp_path / "missing")


# ---- the file -------------------------------------------------------------------------------------------------------
def test_registry_round_trip_is_sorted_tidy_and_keeps_header_and_unknown_keys(tmp_path):
    path = tmp_path / "registry.toml"
    path.write_text(
        "# envhub registry\n# edit with `envhub registry add`\n\n"
        '[envs.zeta]\nversion = "1.0.0"\nsource = "z"\nsha256 = "ABC"\nlicense = "MIT"\n'
        '[envs.alpha]\nversion = "0.1.0"\nsummary = "first"\nsource = "a"\nsha256 = "def"\ntags = ["t"]\n'
        '[envs.alpha.admission]\nreport = "reports/alpha-0.1.0.json"\npassed = 3\ntasks = 4\n'
    )
    reg = Registry.load(path)
    assert reg.ids() == ["alpha", "zeta"]
    assert reg.entries["zeta"].sha256 == "abc" and reg.entries["zeta"].extra == {"license": "MIT"}
    assert reg.entries["alpha"].admission_summary == "3/4" and reg.entries["zeta"].admission_summary == "-"
    reg.save()
    text = path.read_text()
    assert text.startswith("# envhub registry\n# edit with `envhub registry add`\n")
    assert text.index("[envs.alpha]") < text.index("[envs.alpha.admission]") < text.index("[envs.zeta]")
    assert text.index("tasks = 4") < text.index("passed = 3") < text.index("report =")  # fixed key order
    assert 'license = "MIT"' in text
    again = Registry.load(path)
    assert {k: v.to_toml() for k, v in again.entries.items()} == {k: v.to_toml() for k, v in reg.entries.items()}
    again.save()
    assert path.read_text() == text  # stable: a second write changes nothing


def test_bad_registry_files_give_clear_errors(tmp_path):
    path = tmp_path / "registry.toml"
    path.write_text("[envs.x\n")
    with pytest.raises(RegistryError, match="not valid TOML"):
        Registry.load(path)
    path.write_text('[envs.x]\ntags = "swe"\n')
    with pytest.raises(RegistryError, match="tags must be a list"):
        Registry.load(path)
    path.write_text('envs = 3\n')
    with pytest.raises(RegistryError, match=r"\[envs\] must be a table"):
        Registry.load(path)


def test_unknown_id_suggests_close_names(tmp_path):
    reg = Registry(tmp_path / "registry.toml", {i: Entry(i) for i in ("countdown", "guess-number", "swe-gym")})
    with pytest.raises(UnknownEnv) as e:
        reg.get("countdwn")
    assert "Did you mean: countdown?" in str(e.value) and "does not exist" in str(e.value)
    reg.save()
    with pytest.raises(UnknownEnv, match=r"guess-number\?.*registry: "):
        reg.get("guess_numbr")


def test_search_matches_every_word_in_id_summary_or_tags(tmp_path):
    reg = Registry(tmp_path / "r.toml", {
        "countdown": Entry("countdown", summary="Reach a target number", tags=["math", "single-turn"]),
        "swe-gym": Entry("swe-gym", summary="Fix real bugs", tags=["swe", "tools"]),
    })
    assert [e.id for e in reg.search("MATH target")] == ["countdown"]
    assert [e.id for e in reg.search("tools")] == ["swe-gym"]
    assert reg.search("math tools") == []


def test_find_registry_precedence(tmp_path, monkeypatch):
    monkeypatch.delenv("ENVHUB_REGISTRY", raising=False)
    top = tmp_path / "proj"
    deep = top / "a" / "b"
    deep.mkdir(parents=True)
    (top / "registry.toml").write_text("")
    assert find_registry(cwd=deep) == top / "registry.toml"  # nearest upward
    (top / "a" / "registry.toml").write_text("")
    assert find_registry(cwd=deep) == top / "a" / "registry.toml"
    monkeypatch.setenv("ENVHUB_REGISTRY", str(tmp_path / "env.toml"))
    assert find_registry(cwd=deep) == tmp_path / "env.toml"  # $ENVHUB_REGISTRY beats the search
    assert find_registry(tmp_path / "x.toml", cwd=deep) == tmp_path / "x.toml"  # --registry beats everything
    monkeypatch.delenv("ENVHUB_REGISTRY")
    checkout = Path(envhub.__file__).resolve().parents[1] / "registry.toml"
    expected = checkout if checkout.is_file() else tmp_path / "registry.toml"
    assert find_registry(cwd=tmp_path) == expected  # nothing upward: the checkout's, else ./registry.toml


def test_source_kinds(tmp_path):
    (tmp_path / "envs" / "p").mkdir(parents=True)
    (tmp_path / "w-0.1-py3-none-any.whl").write_bytes(b"w")
    (tmp_path / "notes.txt").write_text("x")
    assert parse_source("envs/p", tmp_path).kind == "tree"
    assert parse_source("envs/p", tmp_path).location == str((tmp_path / "envs" / "p").resolve())
    assert parse_source("w-0.1-py3-none-any.whl", tmp_path).kind == "file"
    assert parse_source("https://example.org/w-0.1-py3-none-any.whl", tmp_path).kind == "url"
    req = parse_source("envhub-countdown == 0.1.0", tmp_path)
    assert (req.kind, req.location) == ("requirement", "envhub-countdown==0.1.0")
    with pytest.raises(RegistryError, match="not a wheel or sdist"):
        parse_source("notes.txt", tmp_path)
    with pytest.raises(RegistryError, match="neither an existing path"):
        parse_source("envs/missing", tmp_path)
    with pytest.raises(RegistryError, match="no source"):
        parse_source("", tmp_path)


def test_split_requirement():
    assert split_requirement("countdown") == ("countdown", None)
    assert split_requirement("countdown==0.2.0") == ("countdown", "0.2.0")
    for bad in ("countdown==", "countdown>=1", "==1.0", "a b"):
        with pytest.raises(RegistryError, match="ID or ID==VERSION"):
            split_requirement(bad)
