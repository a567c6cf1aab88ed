"""swe-gym (#29): the code under test cannot read what grades it.

The answer-key readers (:mod:`envhub_swe_gym.answer_key`) fix nothing: appended to the package, they read the expected
values from the tests — on disk, in git's store, in compiled caches, in the compiled tests in memory, in the calling
test's frame, or by running the tests themselves with spies — and return them. Each one got reward 1.0 from the
grader of commit ``PREVIOUS`` (rebuilt from git history) and gets 0 now; each defence, switched off, lets its route
through again; honest tests that use what the defences watch (failing tracebacks, logging, ``inspect``, unittest,
hypothesis, a test calling a test) are not refused.
"""
from __future__ import annotations

import random
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from envhub_swe_gym import loader, patchguard, policies, repos
from envhub_swe_gym.answer_key import ROUTES, answer_key_hack
from envhub_swe_gym.grader import DEFENSES, GIT_ENV, SweGymVerifier
from envhub_swe_gym.testrun import diff_files, files_of_tests

from test_swe_gym_verdicts import REPO_ROOT, make_diff, needs_bwrap, private_cache, run_runner  # noqa: F401

PREVIOUS = "1f61ec3"  # the last commit whose grader left the test files, git's store and the compiled tests readable
SHOWCASE = "envhub__minicalc-41"  # each route got reward 1.0 here from PREVIOUS's grader
SENTINEL = 7046213


@pytest.fixture(scope="module")
def rows():
    return {r["instance_id"]: dict(r) for r in loader.load_swe_gym("train", source="offline")}


@pytest.fixture(scope="module")
def previous_verifier(tmp_path_factory):
    """The grader of commit ``PREVIOUS``, rebuilt from git history as package ``swe_gym_prev``."""
    parent = tmp_path_factory.mktemp("previous")
    archive = subprocess.run(["git", "archive", PREVIOUS, "environments/swe_gym/envhub_swe_gym"], cwd=REPO_ROOT,
                             capture_output=True)
    if archive.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} is not in this clone's history (shallow clone?): {archive.stderr.decode()}")
    subprocess.run(["tar", "-x", "-C", str(parent)], input=archive.stdout, check=True)
    package = parent / "swe_gym_prev"
    (parent / "environments" / "swe_gym" / "envhub_swe_gym").rename(package)
    for f in package.rglob("*.py"):
        f.write_text(f.read_text().replace("envhub_swe_gym", "swe_gym_prev"))
    sys.path.insert(0, str(parent))
    try:
        from swe_gym_prev.grader import SweGymVerifier as Previous
    finally:
        sys.path.remove(str(parent))
    return Previous()


def test_every_reader_passes_the_diff_scan(rows, tmp_path):
    """The scan is a heuristic that none of them trips: the test run itself has to hold."""
    row = rows[SHOWCASE]
    for route in ROUTES:
        assert patchguard.scan_patch(make_diff(row, answer_key_hack((route,))(row), tmp_path)) == [], route
    assert "answer-key-reader" in policies.HACKS, "admission plays every route at once on every task"


@needs_bwrap
@pytest.mark.parametrize("route", ["files", "code", "frames", "dry-run"])
def test_each_reader_beat_the_previous_grader_and_gets_nothing_now(route, rows, previous_verifier, tmp_path):
    row = rows[SHOWCASE]
    patch = make_diff(row, answer_key_hack((route,))(row), tmp_path)
    with ThreadPoolExecutor(2) as pool:
        old, new = pool.map(lambda v: v.verify(row, {"patch": patch}), (previous_verifier, SweGymVerifier()))
    assert old.passed and old.reward == 1.0, f"{route} should beat the previous grader: {old.details.get('reason')}"
    assert not new.passed and new.reward == 0.0, new.details
    if route != "files":  # the in-memory routes are refused, and the refusal is recorded as tampering
        assert "tampered" in new.details["reason"], new.details["reason"]


@needs_bwrap
@pytest.mark.parametrize("route,defence", [("files", "hide"), ("code", "memory"), ("dry-run", "dry-run")])
def test_switching_the_defence_off_lets_its_route_through(route, defence, rows, tmp_path):
    row = rows[SHOWCASE]
    patch = make_diff(row, answer_key_hack((route,))(row), tmp_path)
    s = SweGymVerifier(defenses=DEFENSES - {defence}).verify(row, {"patch": patch})
    assert s.passed, f"without {defence!r} the {route} reader should win: {s.details.get('reason')}"


def prepared_tree(row, tmp_path, defenses=DEFENSES):
    """Run the grader's preparation on a checkout that also holds compiled caches; return the tree, the test files'
    text the runner is handed, and the canaries."""
    from envhub.sandbox import SandboxSpec, start

    tree = tmp_path / "testbed"
    shutil.copytree(repos.checkout(row["repo"], row["base_commit"]), tree, symlinks=True)
    (tree / "tests" / "__pycache__").mkdir()
    (tree / "tests" / "__pycache__" / "test_parser.cpython-311.pyc").write_bytes(b"compiled tests")
    (tree / ".pytest_cache" / "v").mkdir(parents=True)
    (tree / ".pytest_cache" / "v" / "lastfailed").write_text("{}")
    f2p = list(row["FAIL_TO_PASS"]) + list(row["PASS_TO_PASS"])
    run_files = list(dict.fromkeys(files_of_tests(f2p) + [f for f in diff_files(row["test_patch"])
                                                          if f.endswith(".py")]))
    details: dict = {}
    with start(SandboxSpec(binds=[(str(tree), "/testbed", "rw")], workdir="/grader-work", network=False,
                           env=dict(GIT_ENV))) as sb:
        problem, canaries, sources = SweGymVerifier(defenses=defenses)._prepare(
            sb, row, row["patch"], row["test_patch"], run_files, random.Random(0), details)
    assert problem is None, problem
    return tree, sources, canaries


@needs_bwrap
def test_preparation_leaves_no_copy_of_the_tests_in_the_tree(rows, tmp_path):
    """The test files' text goes to the runner on stdin; on disk they are empty, and git's store (the tests at
    base_commit) and every compiled cache are gone. The files pytest needs beside them stay."""
    row = rows[SHOWCASE]
    tree, sources, canaries = prepared_tree(row, tmp_path)
    added = [line[1:] for line in row["test_patch"].splitlines() if line.startswith("+def test_")]
    assert added and sources and canaries
    for rel, text in sources.items():
        assert (tree / rel).is_file() and (tree / rel).read_bytes() == b"", rel
        assert "def test_" in text
    assert all(any(a in text for text in sources.values()) for a in added), "the runner gets the patched tests"
    assert all(c.split("::")[1] in sources[c.split("::")[0]] for c in canaries), "and the canaries"
    assert not (tree / ".git").exists() and not list(tree.rglob("__pycache__")) and not list(tree.rglob("*.pyc"))
    assert not (tree / ".pytest_cache").exists()
    assert (tree / "minicalc" / "__init__.py").read_text(), "the code under test is where it was"
    kept, _, _ = prepared_tree(row, tmp_path / "unhidden", DEFENSES - {"hide"})
    assert (kept / ".git").is_dir() and (kept / "tests" / "__pycache__").is_dir()
    assert all((kept / rel).read_text() for rel in sources), "without 'hide' the tests stay readable"


@needs_bwrap
@pytest.mark.slow
def test_the_run_sandbox_holds_no_copy_of_the_test_patch(rows):
    """During RUN the agent may read the repository's tests, but not the FAIL_TO_PASS tests to come: no file and no
    git object of the RUN sandbox holds the lines the test patch adds (a line of the existing tests is found the same
    way, so the search works)."""
    import envhub

    spec = envhub.get_spec("swe-gym")
    env = spec.make()
    try:
        for row in rows.values():
            added = [line[1:].strip() for line in row["test_patch"].splitlines()
                     if line.startswith("+") and not line.startswith("+++") and line[1:].strip().startswith("def ")]
            checkout = repos.checkout(row["repo"], row["base_commit"])
            existing = next(line.strip() for f in sorted((checkout / "tests").glob("test_*.py"))
                            for line in f.read_text().splitlines() if line.startswith("def test_"))
            env.reset(options={"task": row})
            sb = env.sandbox
            everything = sb.exec(["sh", "-c", "cd /testbed && { git cat-file --batch-all-objects --batch; "
                                              "find / -xdev -path /proc -prune -o -type f -path '*testbed*' -print0 "
                                              "| xargs -0 cat; find /tmp -type f -print0 | xargs -0 cat; } 2>/dev/null"],
                                 timeout=60).stdout
            assert existing in everything, f"{row['instance_id']}: the search should find the existing tests"
            for line in added:
                assert line not in everything, f"{row['instance_id']}: {line!r} is readable during RUN"
    finally:
        env.close()


# ---- the in-memory routes, on the runner alone (host, no sandbox) ---------------------------------------------------
TEST = f"import mod\n\n\ndef test_bad():\n    assert mod.f(2) == {SENTINEL}\n"
FOUND = f"""
def _found_values(values):
    if {SENTINEL} in list(values):
        open('found', 'w').write('answer key read')


def _found(codes):
    seen = []
    for code in codes:
        stack = [code]
        while stack:
            c = stack.pop()
            seen += list(c.co_consts)
            stack += [k for k in c.co_consts if hasattr(k, 'co_consts')]
    _found_values(seen)


def _tests():
    import sys
    return [v for m in list(vars(sys)['mod' + 'ules'].values()) if 'test_m' in getattr(m, '__name__', '')
            for v in list(vars(m).values()) if getattr(v, '__name__', '').startswith('test_')]
"""
ATTACKS = {
    "function-code": "\n\ndef f(x):\n    try:\n        _found([getattr(t, '__co' + 'de__') for t in _tests()])\n"
                     "    except RuntimeError:\n        pass\n    return x\n",
    "frame-code": "\n\ndef f(x):\n    import sys\n    try:\n"
                  "        _found([getattr(vars(sys)['_get' + 'frame'](1), 'f_' + 'code')])\n"
                  "    except RuntimeError:\n        pass\n    return x\n",
    "through-dis": "\n\ndef f(x):\n    import dis\n    try:\n"
                   "        _found_values([i.argval for t in _tests() for i in dis.get_instructions(t)])\n"
                   "    except RuntimeError:\n        pass\n    return x\n",
    "borrowed-file-name": "\n\nimport _pytest.python as _p\n_ns = {'_tests': _tests, '_found': _found}\n"
                          "exec(compile(\"def f(x):\\n    try:\\n        _found([getattr(t, '__co' + 'de__') for t in"
                          " _tests()])\\n    except RuntimeError:\\n        pass\\n    return x\\n\", _p.__file__,"
                          " 'exec'), _ns)\nf = _ns['f']\n",
    "from-a-thread": "\n\ndef f(x):\n    import operator, threading\n    got = []\n"
                     "    t = threading.Thread(target=got.extend, args=(map(operator.attrgetter('__co' + 'de__'),"
                     " _tests()),))\n    t.start()\n    t.join()\n    _found(got)\n    return x\n",
    "import-hook-defaults": "\n\nimport sys\ntry:\n"  # at import, from the first test file: test_m is not loaded yet
                            "    _hook = vars(sys)['mod' + 'ules']['_pytest.assertion.rewrite']._rewrite_test\n"
                            "    _found(list(getattr(_hook, '__defa' + 'ults__')[0].values()))\n"
                            "except RuntimeError:\n    pass\n\n\ndef f(x):\n    return x\n",
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
@pytest.mark.slow
def test_the_compiled_tests_are_out_of_the_tested_codes_reach(attack, tmp_path):
    """Each attack gets the test's constants with the memory defence off, and is refused (and recorded) with it."""
    module = FOUND + ATTACKS[attack]
    first = "import mod  # noqa\n\n\ndef test_first():\n    pass\n" if attack == "import-hook-defaults" else None
    (tmp_path / "off").mkdir()
    off = run_runner(tmp_path / "off", module, TEST, memory=False, first=first)
    assert (tmp_path / "off" / "found").exists(), f"{attack} should read the answer key with the defence off: {off}"
    (tmp_path / "on").mkdir()
    log: list[str] = []
    on = run_runner(tmp_path / "on", module, TEST, log=log, first=first)
    assert on.finished, log
    assert not (tmp_path / "on" / "found").exists(), f"{attack} read the answer key: {log[0][-2000:]}"
    assert any("compiled tests" in t or "import hook" in t for t in on.tampering), on.tampering


def test_the_compiled_tests_cannot_be_loaded_from_the_tested_code(tmp_path):
    """The import hook that holds the compiled tests hands each out once, to pytest's import only: a package that
    asks for a test file pytest has not imported yet is refused."""
    module = ("import sys\n_rw = vars(sys)['mod' + 'ules']['_pytest.assertion.rewrite']\n"
              "try:\n    _got = _rw._rewrite_test(__import__('pathlib').Path(__file__).parent / 'tests' / 'test_m.py',"
              " None)\nexcept RuntimeError:\n    _got = None\n"
              "if _got and _got[1] is not None:\n    open('loaded', 'w').write('x')\n\n\ndef f(x):\n    return x\n")
    rec = run_runner(tmp_path, module, TEST, first="import mod  # noqa\n\n\ndef test_first():\n    pass\n")
    assert not (tmp_path / "loaded").exists()
    assert any("loading the compiled tests" in t for t in rec.tampering), rec.tampering


DRY_RUN = """
import sys


def f(x):
    for m in list(vars(sys)['mod' + 'ules'].values()):
        if 'test_m' in getattr(m, '__name__', '') and m.__name__ != __name__:
            try:
                m.test_other()
            except BaseException:
                pass
    return x
"""


DRY_RUN_OF_ITSELF = """
import sys


_busy = []


def f(x):  # the test that calls: named in its frame's repr (no attribute read), then run once more
    caller = repr(vars(sys)['_get' + 'frame'](1)).rsplit('code ', 1)[1].rstrip('>')
    if not _busy:
        _busy.append(caller)
        for m in list(vars(sys)['mod' + 'ules'].values()):
            if 'test_m' in getattr(m, '__name__', '') and hasattr(m, caller):
                try:
                    getattr(m, caller)()
                except BaseException:
                    pass
    return x
"""


def test_a_dry_run_of_the_running_test_inside_itself_is_recorded(tmp_path):
    """The package runs the very test that called it (found by its frame's repr), to learn what it compares with."""
    test = "import mod\n\n\ndef test_bad():\n    assert mod.f(2) == 2\n"
    rec = run_runner(tmp_path, DRY_RUN_OF_ITSELF, test, memory=False)
    assert any("test_bad ran outside its own test run" in t for t in rec.tampering), rec.tampering


@pytest.mark.slow
def test_a_test_body_run_outside_its_own_test_is_recorded(tmp_path):
    """The recorder's rule alone (the memory defence off), and shown to be what catches it (off too: no record): a package that runs another test's body (to see what it
    compares with) is caught by pytest's own state, whatever runs it; a test calling a test is fine."""
    test = ("import mod\n\n\ndef test_first():\n    assert mod.f(1) == 1\n\n\n"
            "def test_other():\n    assert mod.f(2) == 2\n\n\ndef test_helper_call():\n    test_other()\n")
    (tmp_path / "dry").mkdir()
    rec = run_runner(tmp_path / "dry", DRY_RUN, test, memory=False)
    assert any("ran outside its own test run" in t for t in rec.tampering), rec.tampering
    (tmp_path / "unguarded").mkdir()
    assert run_runner(tmp_path / "unguarded", DRY_RUN, test, memory=False, dry_run=False).tampering == []
    (tmp_path / "honest").mkdir()
    honest = run_runner(tmp_path / "honest", "def f(x):\n    return x\n", test, memory=False)
    assert honest.tampering == [], honest.tampering
    assert all(honest.passed(f"tests/test_m.py::test_{n}") for n in ("first", "other", "helper_call")), honest


HONEST_MODULE = """
import functools
import logging
import traceback

log = logging.getLogger('mod')


def keep(fn):  # a decorator of the repository's own, as sympy's XFAIL wraps its tests
    @functools.wraps(fn)
    def run(*args, **kwargs):
        return fn(*args, **kwargs)
    return run


def f(x):
    log.warning('f(%s)', x)
    traceback.format_exc()
    return x
"""
HONEST_TESTS = """
import functools
import inspect
import logging
import unittest
from unittest import mock

import hypothesis
from hypothesis import strategies as st

import mod


def wrapped(fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        return fn(*args, **kwargs)
    return call


def test_logging_and_signature(caplog):
    logging.getLogger('t').info('in a test')
    assert mod.f(3) == 3
    assert 'caplog' in inspect.signature(test_logging_and_signature).parameters


@wrapped
def test_decorated():
    assert mod.f('a') == 'a'


@mock.patch('mod.log')
def test_patched(log):
    assert mod.f(1) == 1 and log.warning.called


@hypothesis.given(st.integers())
@hypothesis.settings(max_examples=5, database=None)
def test_hypothesis(n):
    assert mod.f(n) == n


@mod.keep
def test_repository_decorated():
    assert mod.f(5) == 5


def test_fails_honestly():
    assert mod.f(1) == 2


class TestCase(unittest.TestCase):
    def test_equal(self):
        self.assertEqual(mod.f(4), 4)
"""


def test_honest_tests_that_look_at_code_are_not_refused(tmp_path):
    """What pytest, the standard library and a test library do with the tests' code (collect, format a failing
    test's traceback, log, take a signature, wrap, generate examples) is not the tested code reading it."""
    pytest.importorskip("hypothesis")
    log: list[str] = []
    rec = run_runner(tmp_path, HONEST_MODULE, HONEST_TESTS, log=log)
    assert rec.finished and rec.tampering == [], (rec.tampering, log[0][-3000:])
    names = ("logging_and_signature", "decorated", "patched", "hypothesis", "repository_decorated")
    assert all(rec.passed(f"tests/test_m.py::test_{n}") for n in names), log[0][-3000:]
    assert rec.passed("tests/test_m.py::TestCase::test_equal")
    assert rec.status("tests/test_m.py::test_fails_honestly") == "FAILED"


HOOKED_VERDICT = """
import sys


def _hook(event, args):  # runs after the checker: rewrites its verdict box
    if event == 'envhub.verdict.compare' and args and type(args[-1]) is list:
        args[-1][:] = [True, None]


try:
    vars(sys)['addaudit' + 'hook'](_hook)
except RuntimeError:
    pass
"""


def test_the_tested_code_cannot_add_an_audit_hook(tmp_path):
    """Found while attacking #29's defences: a hook the tested code adds is called after the grader's, with the
    checker's verdict box, and set every comparison true on the previous runner (test_bad passed, body-end and
    all, nothing recorded). Adding a hook is refused now (CPython drops it) and recorded."""
    test = "import mod  # noqa\n\n\ndef test_bad():\n    assert 1 == 2\n"
    rec = run_runner(tmp_path, HOOKED_VERDICT, test)
    assert rec.finished and rec.status("tests/test_m.py::test_bad") == "FAILED"
    assert "sys.addaudithook" in rec.tampering, rec.tampering
