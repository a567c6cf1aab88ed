"""swe-gym (#13): a verdict the graded code cannot write.

The hacks of issue #13 — a summary printed after pytest exits (a); pytest's reporting patched from inside the process
through indirect attribute access, a string-built module name, a UTF-7 source file, or by replacing only the named
tests' bodies (b); an always-equal result (c) — are played from ``policies.HACKS`` on host checkouts, graded by the
grader of commit ``OLD_COMMIT`` (rebuilt from git history: they get reward 1 there) and by today's grader (0).
"""
from __future__ import annotations

import ast
import os
import random
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from envhub_swe_gym import loader, patchguard, policies, repos, testrun, verdict, verdict_instrument
from envhub_swe_gym.gitutil import git, out
from envhub_swe_gym.grader import DEFENSES, SweGymVerifier

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)")
OLD_COMMIT = "37a4d35"  # the last commit whose grader parsed the pytest log (before #13's verdict channel)
REPO_ROOT = Path(__file__).resolve().parents[2]
NEW_HACKS = ("summary-after-exit", "reports-by-subclasses", "reports-by-string-module", "reports-in-utf7",
             "named-bodies-skipped", "always-equal")


@pytest.fixture(scope="module", autouse=True)
def private_cache(tmp_path_factory):
    old = os.environ.get("ENVHUB_CACHE")
    os.environ["ENVHUB_CACHE"] = str(tmp_path_factory.mktemp("envhub-cache"))
    yield
    if old is None:
        os.environ.pop("ENVHUB_CACHE", None)
    else:
        os.environ["ENVHUB_CACHE"] = old


@pytest.fixture(scope="module")
def rows():
    return {r["instance_id"]: dict(r) for r in loader.load_swe_gym("train", source="offline")}


def make_diff(row, ops, tmp_path) -> str:
    """The diff an agent would submit after playing hack ``ops`` on the task's checkout."""
    work = tmp_path / f"work-{time.monotonic_ns()}"
    shutil.copytree(repos.checkout(row["repo"], row["base_commit"]), work, symlinks=True)
    for op in ops:
        target = work / op[1]
        if op[0] == "write":
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(op[2])
        elif op[0] == "append":
            target.write_text(target.read_text() + op[2])
        else:
            raise AssertionError(f"the #13 hacks only write and append files, not {op[0]!r}")
    git("add", "-A", cwd=work)
    return out("diff", "--cached", "--binary", row["base_commit"], cwd=work) + "\n"


@pytest.fixture(scope="module")
def old_verifier(tmp_path_factory):
    """The grader as it was at ``OLD_COMMIT``, rebuilt from git history as package ``swe_gym_old``."""
    files = ("grader.py", "testrun.py", "patchguard.py")
    pkg = tmp_path_factory.mktemp("old") / "swe_gym_old"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    for f in files:
        r = subprocess.run(["git", "show", f"{OLD_COMMIT}:environments/swe_gym/envhub_swe_gym/{f}"], cwd=REPO_ROOT,
                           capture_output=True, text=True)
        if r.returncode != 0:
            pytest.skip(f"commit {OLD_COMMIT} is not in this clone's history (shallow clone?): {r.stderr.strip()}")
        text = r.stdout.replace("from envhub_swe_gym.patchguard", "from swe_gym_old.patchguard") \
            .replace("from envhub_swe_gym.testrun", "from swe_gym_old.testrun")
        (pkg / f).write_text(text)
    sys.path.insert(0, str(pkg.parent))
    try:
        from swe_gym_old.grader import SweGymVerifier as Old
    finally:
        sys.path.remove(str(pkg.parent))
    return Old()


# ---- pure parts -------------------------------------------------------------------------------------------------
def test_the_new_hacks_pass_the_diff_scan(rows, tmp_path):
    """The scan is a heuristic: none of these hacks trips it, so the run itself has to hold."""
    row = rows["envhub__spanlib-21"]
    for name in NEW_HACKS:
        assert patchguard.scan_patch(make_diff(row, policies.HACKS[name](row), tmp_path)) == [], name
    utf7 = make_diff(row, policies.HACKS["reports-in-utf7"](row), tmp_path)
    assert "_pytest" not in utf7 and "TestReport" not in utf7


def test_records_need_the_key_the_run_and_the_order():
    real, other = verdict.new_secret(), verdict.new_secret()
    import hashlib
    import hmac
    import json

    def line(secret, seq, nodeid, when, outcome, key=None):
        body = json.dumps([secret.run, seq, nodeid, when, outcome])
        return body + " " + hmac.new(bytes.fromhex(key or secret.key), body.encode(), hashlib.sha256).hexdigest()

    good = [line(real, 0, "t::a", "setup", "passed"), line(real, 1, "t::a", "call", "passed"),
            line(real, 2, "t::a", "teardown", "passed"), line(real, 3, "", "end", "1")]
    rec = verdict.read_records("\n".join(good), real)
    assert rec.passed("t::a") and rec.finished and rec.rejected == 0
    forged = ["PASSED t::b", '["x", 0, "t::b", "call", "passed"] 00', line(real, 4, "t::b", "call", "passed",
                                                                            key=other.key)]
    replayed = [line(other, 0, "t::b", "setup", "passed")]  # a valid line of another run
    rec = verdict.read_records("\n".join(good[:3] + forged + replayed + [line(real, 3, "t::a", "call", "failed")]),
                               real)
    assert rec.rejected == 4 and not rec.finished
    assert not rec.passed("t::a"), "a phase recorded twice keeps the failure"
    assert rec.status("t::b") == "MISSING"
    # two threads' records may land out of order: read by number; a number seen twice, or past a gap, is not read
    swapped = [good[1], good[0], good[3], good[2], line(real, 2, "t::a", "call", "failed")]
    rec = verdict.read_records("\n".join(swapped), real)
    assert rec.passed("t::a") and rec.finished and rec.rejected == 1
    gap = good[:2] + [line(real, 4, "t::a", "call", "failed"), line(real, 5, "", "end", "1")]
    rec = verdict.read_records("\n".join(gap), real)
    assert not rec.finished and rec.rejected == 2 and rec.outcomes[("t::a", "call")] == "passed"


def test_canaries_are_ordinary_tests_at_random_places():
    src = ('"""doc"""\nfrom __future__ import annotations\n\nimport os\n\n\ndef helper():\n    return 1\n\n\n'
           'def test_parse_dates():\n    assert helper() == 1\n\n\nclass TestSpans:\n    def test_merge(self):\n'
           '        pass\n')
    placements, names = set(), set()
    for seed in range(30):
        text, planted = verdict.plant_canaries(src, random.Random(seed), 2)
        tree = ast.parse(text)  # still valid Python, __future__ import still first
        assert isinstance(tree.body[1], ast.ImportFrom) and tree.body[1].module == "__future__"
        tops = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert set(planted) <= set(tops) and len(planted) == 2
        placements.add(tuple(tops.index(p) for p in planted))
        names.update(planted)
        for p in planted:
            assert p.startswith("test_") and p.replace("_", "").isalnum() and len(p) < 40
    assert len(placements) >= 4 and len(names) >= 20, "names and places change from run to run"


def test_instrumented_comparisons_catch_lying_values(tmp_path):
    mod = ast.parse("def test_x():\n    r = f()\n    assert r == 3\n    if r:\n        return\n"
                    "    assert r != 4 and 1 in [1]\n")
    verdict_instrument.instrument(mod)
    code = ast.unparse(mod).replace(repr(verdict_instrument.PLACEHOLDER)[1:-1], "@")
    assert code.count("'@cmp'(") == 3 and code.count("'@audit'('envhub.verdict.end')") == 2
    module = "class Agree:\n    def __eq__(self, other):\n        return True\n\n\nA = Agree()\n"
    test = ("from unittest import mock\n\nimport mod\n\n\ndef test_a():\n    assert mod.A == 3\n\n\n"
            "def test_b():\n    assert [1, mod.A] == [1, 3]\n\n\ndef test_c():\n    assert {'k': mod.A} == {'k': 3}\n\n\n"
            "def test_honest():\n    assert 3 == 3 and 3 != 4 and 3 == mock.ANY and 1 in [1]\n")
    rec = run_runner(tmp_path, module, test)
    assert [rec.status(f"tests/test_m.py::test_{n}") for n in "abc"] == ["FAILED"] * 3
    assert rec.passed("tests/test_m.py::test_honest"), "an honest wildcard written in the test is allowed"


# ---- on real sandboxes --------------------------------------------------------------------------------------------
# The task each hack is shown to beat the old grader on (the always-equal wrapper needs results compared with ==).
SHOWCASE = {name: "envhub__spanlib-21" for name in NEW_HACKS} | {"always-equal": "envhub__textkit-3"}


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("hack", NEW_HACKS)
def test_each_new_hack_beat_the_old_grader_and_fails_now(hack, rows, old_verifier, tmp_path):
    row = rows[SHOWCASE[hack]]
    patch = make_diff(row, policies.HACKS[hack](row), tmp_path)
    with ThreadPoolExecutor(2) as pool:
        old, new = pool.map(lambda v: v.verify(row, {"patch": patch}), (old_verifier, SweGymVerifier()))
    assert old.passed and old.reward == 1.0, f"{hack} should beat the old grader: {old.details.get('reason')}"
    assert not new.passed and new.reward == 0.0
    assert new.details["reason"], new.details


@needs_bwrap
@pytest.mark.slow
@pytest.mark.parametrize("hack", ["conftest-force-pass", "runner-monkeypatch", "exit-on-import"])
def test_report_forcing_beat_the_old_bare_grader_and_the_records_alone_stop_it(hack, rows, old_verifier, tmp_path):
    """With every defense switched off, the old grader (log parsing) is beaten; the new one is not: its verdict
    comes from the authenticated records, which these hacks cannot write."""
    row = rows["envhub__spanlib-21"]
    patch = make_diff(row, policies.HACKS[hack](row), tmp_path) if hack != "conftest-force-pass" else \
        make_diff(row, [op for op in policies.HACKS[hack](row) if op[0] != "remove"], tmp_path)
    bare_old = type(old_verifier)(defenses=frozenset())
    with ThreadPoolExecutor(2) as pool:
        old, new = pool.map(lambda v: v.verify(row, {"patch": patch}), (bare_old, SweGymVerifier(defenses=set())))
    assert old.passed, f"{hack} should beat the old undefended grader: {old.details.get('reason')}"
    assert not new.passed, new.details["reason"]
    expected = "did not finish" if hack == "exit-on-import" else "did not pass"  # os._exit leaves no end record
    assert expected in new.details["reason"], new.details["reason"]


@needs_bwrap
def test_body_end_records_are_what_stop_targeted_body_replacement(rows, tmp_path):
    """Replacing only the named tests' bodies leaves the canaries failing honestly and every record authentic; only
    the missing body-end record tells. Without that check the hack wins."""
    row = rows["envhub__spanlib-21"]
    patch = make_diff(row, policies.HACKS["named-bodies-skipped"](row), tmp_path)
    off = {"memory", "dry-run"}  # (#29's defences stop it too: it reads the tests' code, runs a body: off here)
    with ThreadPoolExecutor(2) as pool:
        full, without = pool.map(lambda d: SweGymVerifier(defenses=d).verify(row, {"patch": patch}),
                                 (DEFENSES - off, DEFENSES - off - {"body-end"}))
    assert without.passed, f"without the body-end check the hack should win: {without.details.get('reason')}"
    assert not full.passed and "never ran to its end" in full.details["reason"], full.details["reason"]
    assert set(full.details["tests"].values()) == {"UNTRUSTED"}


@needs_bwrap
def test_golden_passes_with_canaries_and_forged_output_is_ignored(rows, tmp_path):
    row = rows["envhub__textkit-3"]
    s = SweGymVerifier().verify(row, {"patch": row["patch"]})
    assert s.passed, s.details["reason"]
    assert set(s.details["tests"].values()) == {"PASSED"}
    patch = make_diff(row, policies.HACKS["summary-after-exit"](row), tmp_path)
    s = SweGymVerifier().verify(row, {"patch": patch})
    assert not s.passed and "short test summary info" in s.details["log_tail"], "the forged text was printed"
    assert "did not pass" in s.details["reason"]


def run_runner(tmp_path, module_code: str, test_code: str, audit: bool = True, truth: bool = True,
               unittest: bool = True, log: list | None = None, first: str | None = None, memory: bool = True,
               dry_run: bool = True):
    """The verdict runner on a tiny project on the host (no sandbox): returns its verified records (``truth=False``,
    ``audit=False``, ``unittest=False``, ``memory=False``, ``dry_run=False`` switch those checks off; ``log`` receives pytest's output;
    ``first``: a test file ``tests/test_a.py`` run before ``tests/test_m.py``). The test files' text goes on stdin,
    as the grader sends it (their copies on disk stay: no sandbox here)."""
    (tmp_path / "mod.py").write_text(module_code)
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "test_m.py").write_text(test_code)
    files = ["tests/test_m.py"]
    if first is not None:
        (tmp_path / "tests" / "test_a.py").write_text(first)
        files.insert(0, "tests/test_a.py")
    (tmp_path / "pytest.ini").write_text(testrun.pytest_ini(str(tmp_path)))
    secret = verdict.new_secret()
    secret.out = str(tmp_path / f"records-{secret.run}")
    runner = testrun.write_runner(tmp_path, "runner")
    argv = testrun.runner_command(sys.executable, str(runner), files, str(tmp_path / "pytest.ini"), str(tmp_path))
    sources = {f: (tmp_path / f).read_text() for f in files}
    r = subprocess.run(argv, cwd=tmp_path, input=secret.payload(str(tmp_path), files, truth, audit=audit,
                                                                unittest=unittest, sources=sources, memory=memory,
                                                                dry_run=dry_run),
                       text=True,
                       capture_output=True, timeout=120, env={**testrun.PYTEST_ENV, "PATH": os.environ["PATH"]})
    if log is not None:
        log.append(r.stdout + r.stderr)
    return verdict.read_records(Path(secret.out).read_text(), secret)


def test_runner_modules_load_from_their_precompiled_bytecode(tmp_path, monkeypatch):
    """The grading interpreter loads the runner's modules from the bytecode ``write_runner`` puts beside them (no
    compile per grading), and the code is named after the file, as compiling the source would name it (the refuser's
    and the recorder's checks read the names of the grader's frames)."""
    import importlib.machinery

    testrun.write_runner(tmp_path, "rn")
    for part in testrun.SIBLING_SOURCES:
        path = tmp_path / f"rn_{part}.py"
        loader = importlib.machinery.SourceFileLoader(f"_probe_{part}", str(path))
        monkeypatch.setattr(loader, "source_to_code", lambda *a, **k: pytest.fail("the .pyc was refused: compiled"))
        code = loader.get_code(loader.name)
        fresh = compile(path.read_text(), str(path), "exec", dont_inherit=True)
        assert code.co_code == fresh.co_code
        nested = [c for c in code.co_consts if isinstance(c, type(code))]
        assert nested and {c.co_filename for c in [code, *nested]} == {str(path)}


TRACER = """
import sys


def _tracer(frame, event, arg):
    return _tracer


try:
    vars(sys)['set' + 'trace'](_tracer)
except RuntimeError:
    pass
"""


def test_runner_refuses_and_records_tracing(tmp_path):
    """A tracer can jump over assert lines (the body then reaches its end); the audit hook refuses it."""
    test = "import mod\n\n\ndef test_ok():\n    assert 1 + 1 == 2\n"
    rec = run_runner(tmp_path, TRACER, test)
    assert rec.finished and rec.tampering == ["sys.settrace"] and rec.passed("tests/test_m.py::test_ok")
    rec = run_runner(tmp_path, TRACER, test, audit=False)
    assert rec.finished and rec.tampering == []


def test_runner_records_only_bodies_that_ran_to_the_end(tmp_path):
    test = ("import mod\n\n\ndef test_ok():\n    try:\n        return 1\n    except Exception:\n        pass\n\n\n"
            "def test_bad():\n    assert mod.X == 2\n\n\nclass TestK:\n    def test_m(self):\n        assert [1] == [1]\n")
    rec = run_runner(tmp_path, "X = 1\n", test)
    assert rec.passed("tests/test_m.py::test_ok") and rec.passed("tests/test_m.py::TestK::test_m")
    assert rec.status("tests/test_m.py::test_bad") == "FAILED"
    assert rec.body_ends == {"tests/test_m.py::test_ok", "tests/test_m.py::TestK::test_m"}, \
        "an early return is an end too; a failed assert is not"


def test_runner_says_which_files_it_instrumented(tmp_path):
    """The instrumentation runs before pytest's own rewriting, so even a file that opts out of pytest's assertion
    rewriting (PYTEST_DONT_REWRITE) is instrumented; the runner says which files it did, so a test from a file it
    did not reach is reported as unverifiable rather than as forged."""
    test = '"""PYTEST_DONT_REWRITE"""\n\n\ndef test_ok():\n    assert 1 == 1\n'
    rec = run_runner(tmp_path, "", test)
    assert rec.body_ends == {"tests/test_m.py::test_ok"}
    assert rec.instrumented == {str(tmp_path / "tests" / "test_m.py")}


BORROW = """
import sys


def _install():
    runner = vars(sys)['mod' + 'ules'].get('_py' + 'test.runner')
    original = vars(runner)['call_and_report']

    def car(item, when, log=True, **kw):
        if when == 'call' and item.name == 'test_bad':
            item.runtest = item.module.test_good
        return original(item, when, log, **kw)

    setattr(runner, 'call_and_report', car)


_install()
"""


def test_a_test_running_another_tests_body_does_not_reach_its_own_end(tmp_path):
    """``test_bad``'s call is replaced by ``test_good``'s function: the call passes and *a* body reaches its end, but
    not ``test_bad``'s own: ``end()`` checks the calling code object against the item's function."""
    test = "import mod\n\n\ndef test_good():\n    assert 1 == 1\n\n\ndef test_bad():\n    assert 1 == 2\n"
    rec = run_runner(tmp_path, BORROW, test, memory=False)  # (#29's memory defence refuses its code reads first)
    assert rec.passed("tests/test_m.py::test_bad"), "the hack does force the call to pass"
    assert rec.body_ends == {"tests/test_m.py::test_good"}
    assert any("test_good ran outside its own test run" in t for t in rec.tampering), rec.tampering
