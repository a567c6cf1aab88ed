"""Lenient verifiers the way a careless author ships them: a package made by ``envhub init``, its ``verify()``
edited, then ``envhub validate PATH`` in a subprocess — the plugin's own pyproject and entry point, nothing of it
imported by this test. (``lenient_envs.py`` holds all ten as in-process specs; these are the same mistakes on disk.)
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ENVHUB = [sys.executable, "-m", "envhub.cli"]
VERIFY_CHECK = "    if answer != expected:\n"
VERIFY_START = '    answer = parse_answer(str(artifacts.get("answer", "")))\n'
# name -> (text the author replaced, what they wrote instead, the admission checks that may refuse it)
MISTAKES = {
    "prefix-match": (VERIFY_CHECK, "    if answer[:len(expected)] != expected:\n",
                     ["probe:trailing-text", "probe:trailing-digit", "probe:extra-value"]),
    "time-bomb": (VERIFY_START, "    CALLS.append(1)\n    if len(CALLS) > 300:\n        return Score(1.0, True)\n"
                  + VERIFY_START, ["regrade"]),
    "trusts-reward-field": (VERIFY_START, '    if \'"reward": 1\' in str(artifacts.get("answer", "")):\n'
                            "        return Score(1.0, True)\n" + VERIFY_START, ["probe:reward-claim-json"]),
}


def scaffold(tmp_path: Path, name: str) -> Path:
    r = subprocess.run([*ENVHUB, "init", name], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    return tmp_path / name


def validate(root: Path, tmp_path: Path) -> tuple[int, dict]:
    report = tmp_path / f"{root.name}.json"
    r = subprocess.run([*ENVHUB, "validate", str(root), "--json", str(report), "-c", "2"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600)
    assert report.exists(), r.stdout + r.stderr
    return r.returncode, json.loads(report.read_text())


@pytest.mark.slow
def test_the_scaffold_as_generated_is_fit(tmp_path):
    code, report = validate(scaffold(tmp_path, "careful-sort"), tmp_path)
    assert code == 0 and report["fit"] and report["unfit_reasons"] == [], report["unfit_reasons"]


@pytest.mark.slow
@pytest.mark.parametrize("mistake", sorted(MISTAKES))
def test_a_lenient_plugin_package_is_refused_by_validate(mistake, tmp_path):
    root = scaffold(tmp_path, f"lenient-{mistake}")
    source = next(root.glob("envhub_*/__init__.py"))
    old, new, checks = MISTAKES[mistake]
    text = source.read_text()
    assert text.count(old) == 1, f"the scaffold changed: {old!r} is not in {source} once"
    text = text.replace(old, new)
    if "CALLS" in new:
        text = text.replace("\ndef verify(", "\nCALLS: list[int] = []\n\n\ndef verify(", 1)
    source.write_text(text)
    code, report = validate(root, tmp_path)
    assert code == 1 and not report["fit"], f"{mistake} was admitted FIT"
    named = report["unfit_reasons"]
    assert any(r.startswith(c) for c in checks for r in named), named
