"""swe-gym (#13): the verdict sealed inside audit hooks.

Each attack here is code under test written against the grader that shipped before this change (commit
``PREVIOUS``, rebuilt from git history): it got its target test passed there, and gets nothing now. They run the
verdict runner on a tiny project on the host (no sandbox), as ``run_runner`` does.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from envhub_swe_gym import testrun, verdict
from envhub_swe_gym.in_process_hacks import HELPERS_PATCHED

from test_swe_gym_verdicts import REPO_ROOT, run_runner

PREVIOUS = "6e1e1fe"  # the last commit whose runner kept the recorder in closures the code under test could reach
BAD = "tests/test_m.py::test_bad"


def run_previous_runner(tmp_path: Path, module_code: str, test_code: str) -> verdict.RunRecords:
    """The runner of commit ``PREVIOUS`` on the same tiny project."""
    r = subprocess.run(["git", "show", f"{PREVIOUS}:environments/swe_gym/envhub_swe_gym/verdict_runner.py"],
                       cwd=REPO_ROOT, capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"commit {PREVIOUS} is not in this clone's history (shallow clone?): {r.stderr.strip()}")
    (tmp_path / "mod.py").write_text(module_code)
    (tmp_path / "tests").mkdir(exist_ok=True)
    (tmp_path / "tests" / "test_m.py").write_text(test_code)
    (tmp_path / "pytest.ini").write_text(testrun.pytest_ini(str(tmp_path)))
    (tmp_path / "old_runner.py").write_text(r.stdout)
    secret = verdict.new_secret()
    secret.out = str(tmp_path / f"records-{secret.run}")
    argv = testrun.runner_command(sys.executable, str(tmp_path / "old_runner.py"), ["tests/test_m.py"],
                                  str(tmp_path / "pytest.ini"), str(tmp_path))
    payload = json.dumps({"run": secret.run, "key": secret.key, "out": secret.out, "module": "_h", "end": "_e",
                          "cmp": "_c", "truth": "_t", "audit": True, "unittest": True})
    subprocess.run(argv, cwd=tmp_path, input=payload, text=True, capture_output=True, timeout=120,
                   env={**testrun.PYTEST_ENV, "PATH": os.environ["PATH"]})
    return verdict.read_records(Path(secret.out).read_text(), secret)


def when_test_bad_runs(action: str, prelude: str = "") -> str:
    """Module code for an attack that runs ``action`` (statements using ``item``, pytest's test item) as pytest is
    about to call ``test_bad``, by wrapping ``_pytest.runner.call_and_report``; ``prelude``: module code before it."""
    return ("import sys\n" + textwrap.dedent(prelude) + "\n\ndef _install():\n"
            "    runner = vars(sys)['modules']['_pytest.runner']\n    original = runner.call_and_report\n\n"
            "    def car(item, when, log=True, **kw):\n        if when == 'call' and item.name == 'test_bad':\n"
            + textwrap.indent(textwrap.dedent(action).strip("\n"), " " * 12) + "\n"
            "        return original(item, when, log, **kw)\n    runner.call_and_report = car\n\n\n_install()\n")



def forced(rec: verdict.RunRecords) -> bool:
    """What the grader would count as a pass for ``test_bad``: all phases passed and its body's end recorded."""
    return rec.passed(BAD) and BAD in rec.body_ends


FORGE_BY_CLOSURE = when_test_bad_runs('''
    write = _write()

    def body():
        if write is not None:
            write(item.nodeid, 'body-end', '')
        sys.audit('envhub.verdict.end')  # and the new grader's event, raised from here
    item.runtest = body
''', prelude='''

    def _write():
        for m in list(vars(sys)['modules'].values()):
            end = getattr(m, 'end', None)
            if callable(end) and hasattr(m, 'cmp') and getattr(end, '__closure__', None):
                for cell in end.__closure__:
                    if getattr(cell.cell_contents, '__name__', '') == 'write':
                        return cell.cell_contents
        return None
''')
CMP_REPLACED = when_test_bad_runs('''
    space = vars(item.module)
    for name, value in list(space.items()):
        if getattr(value, '__name__', '') in ('cmp', 'truth'):
            space[name] = lambda *args: True
''')
CHECKS_DISABLED = '''
import sys


class _Agree:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


A = _Agree()
for _m in list(vars(sys)['modules'].values()):
    for _name in ('_lies', '_truth_lies', 'lies', 'equal', 'lies_inside', 'truth_lies'):
        if callable(vars(_m).get(_name)) if hasattr(_m, '__dict__') else False:
            setattr(_m, _name, lambda *args, **kwargs: False)
'''
PROBE_AWARE = '''
class _Knowing:
    """Equal to every value of a builtin type (what tests compare with), unequal to anything else (a probe)."""

    def __eq__(self, other):
        return type(other).__module__ == 'builtins'

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = object.__hash__


A = _Knowing()
'''
ISINSTANCE_PATCHED = HELPERS_PATCHED + "\nVALUE = 'not a number'\n"  # the helpers-patched probe's code
RAISES_PATCHED = HELPERS_PATCHED + "\n\ndef parse(text):\n    return 0  # should raise ValueError on bad input\n"
PROC_MEM_BY_SYMLINK = '''
import os
import tempfile

try:
    link = os.path.join(tempfile.mkdtemp(), 'memory')
    os.symlink('/proc/self/mem', link)
    with open('/proc/self/maps') as maps:
        start = int(maps.readline().split('-')[0], 16)
    with open(link, 'rb') as memory:
        memory.seek(start)
        if memory.read(16):
            open('read-my-memory', 'w').close()
except OSError:
    pass
'''
ATTACKS = {
    "forge-by-closure": (FORGE_BY_CLOSURE, "def test_bad():\n    assert 1 == 2\n"),
    "cmp-replaced": (CMP_REPLACED, "def test_bad():\n    assert 1 == 2\n"),
    "checks-disabled": (CHECKS_DISABLED, "import mod\n\n\ndef test_bad():\n    assert mod.A == 3\n"),
    "probe-aware-equal": (PROBE_AWARE, "import mod\n\n\ndef test_bad():\n    assert mod.A == 3\n    assert mod.A == 'x'\n"),
    "isinstance-patched": (ISINSTANCE_PATCHED, "import mod\n\n\ndef test_bad():\n    assert isinstance(mod.VALUE, int)\n"),
    "raises-patched": (RAISES_PATCHED, "import pytest\n\nimport mod\n\n\ndef test_bad():\n"
                                       "    with pytest.raises(ValueError):\n        mod.parse('bad')\n"),
}


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_attack_beat_the_previous_runner_and_gets_nothing_now(attack, tmp_path):
    module, test = ATTACKS[attack]
    (tmp_path / "old").mkdir()
    old = run_previous_runner(tmp_path / "old", module, "import mod  # noqa\n\n\n" + test)
    assert old.finished and forced(old), f"{attack} should get test_bad passed by the previous runner: {old}"
    (tmp_path / "new").mkdir()
    log: list[str] = []
    new = run_runner(tmp_path / "new", module, "import mod  # noqa\n\n\n" + test, log=log)
    assert new.finished, log
    assert not forced(new), f"{attack} still gets test_bad passed: {new}\n{log[0][-3000:]}"


def test_raising_the_graders_events_from_other_code_is_tampering(tmp_path):
    new = run_runner(tmp_path, FORGE_BY_CLOSURE, "import mod  # noqa\n\n\ndef test_bad():\n    assert 1 == 2\n")
    assert "envhub.verdict.end raised by code that is not the grader's" in new.tampering


def test_patching_what_tests_call_is_recorded_as_tampering(tmp_path):
    rec = run_runner(tmp_path, RAISES_PATCHED, "import mod  # noqa\n\n\ndef test_ok():\n    assert 1 == 1\n")
    assert "pytest.raises was replaced during the test run" in rec.tampering, rec.tampering


def test_the_process_cannot_read_its_own_memory(tmp_path):
    """``/proc/self/mem`` behind a symlink: the previous runner's path check missed it (the key is in that memory);
    now the kernel refuses every access under /proc (Landlock), whatever the path."""
    old_dir, new_dir = tmp_path / "old", tmp_path / "new"
    old_dir.mkdir()
    new_dir.mkdir()
    test = "import mod  # noqa\n\n\ndef test_ok():\n    assert 1 == 1\n"
    old = run_previous_runner(old_dir, PROC_MEM_BY_SYMLINK, test)
    assert old.finished and (old_dir / "read-my-memory").exists(), "the previous runner let it read its memory"
    new = run_runner(new_dir, PROC_MEM_BY_SYMLINK, test)
    if not new.confinement.startswith("landlock"):
        pytest.skip(f"no Landlock on this kernel: {new.confinement}")
    assert new.finished and not (new_dir / "read-my-memory").exists()


def test_the_checker_compares_where_values_cannot_look(tmp_path):
    """A value that looks at who compares it (frames) cannot: inside the checker's comparisons every way to a frame
    is refused, so it sees the same thing for the real comparison and for each probe."""
    module = ("import sys\n\n\nclass Peeking:\n    def __eq__(self, other):\n"
              "        try:\n            vars(sys)['_get' + 'frame'](1)\n        except RuntimeError:\n"
              "            open('refused', 'a').write('x')\n            return False\n        return True\n\n"
              "    __hash__ = object.__hash__\n\n\nA = Peeking()\n")
    rec = run_runner(tmp_path, module, "import mod\n\n\ndef test_bad():\n    assert mod.A == 3\n")
    assert rec.status(BAD) == "FAILED"
    assert len((tmp_path / "refused").read_text()) >= 2, "the real comparison and the probes were all refused"


SPOOFED_BEGIN = when_test_bad_runs('''
    def body():
        # the grader's own plugin function, told that test_bad runs, then a passing test's body
        plugin = next(p for p in item.config.pluginmanager.get_plugins() if type(p).__name__ == 'Recorder')
        steps = type(plugin).pytest_runtest_call(plugin, item)
        next(steps)
        item.module.test_good()
    item.runtest = body
''')
OWN_COMPILE = '''
import ast
import sys

_rewrite = vars(sys)['modules']['_pytest.assertion.rewrite']


def _rewrite_test(fn, config):
    tree = ast.parse(open(fn).read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            node.test = ast.Constant(True)
    return b'', compile(tree, str(fn), 'exec')


_rewrite._rewrite_test = _rewrite_test
_rewrite._read_pyc = lambda *args, **kwargs: None
'''
DEFAULTS_REPLACED = when_test_bad_runs('''
    for const in item.obj.__code__.co_consts:
        if getattr(const, '__name__', '') == 'cmp':
            try:
                # cmp(op, left, right, lax, _audit, _event) would then say True to everything
                const.__defaults__ = (lambda event, *args: args[-1].__setitem__(0, True), 'nothing')
            except RuntimeError:
                pass
''')
TWO_FILES = "import mod  # noqa\n\n\ndef test_good():\n    assert 1 == 1\n\n\ndef test_bad():\n    assert 1 == 2\n"


@pytest.mark.parametrize("attack", ["spoofed-begin", "own-compile", "defaults-replaced"])
def test_attacks_on_the_sealed_runner_itself(attack, tmp_path):
    module = {"spoofed-begin": SPOOFED_BEGIN, "own-compile": OWN_COMPILE, "defaults-replaced": DEFAULTS_REPLACED}
    log: list[str] = []
    # the package is imported by an earlier test file, so its hooks are in before test_m.py is loaded
    rec = run_runner(tmp_path, module[attack], TWO_FILES, log=log, first="import mod  # noqa\n")
    assert rec.finished, log
    assert not forced(rec), f"{attack} got test_bad passed: {rec}"
    if attack == "own-compile":
        assert str(tmp_path / "tests" / "test_m.py") not in rec.instrumented and not rec.body_ends, \
            "the hack's own code objects are not the grader's"
    if attack == "defaults-replaced":  # (it finds cmp in the test's code: #29's memory defence refuses that first)
        assert any("reading the compiled tests (__code__)" in t for t in rec.tampering), rec.tampering
        (tmp_path / "memory-off").mkdir()
        rec = run_runner(tmp_path / "memory-off", module[attack], TWO_FILES, log=log, first="import mod  # noqa\n",
                         memory=False)
        assert rec.finished and not forced(rec), f"{attack} got test_bad passed: {rec}"
        assert "setting __defaults__ of a grader function" in rec.tampering


INHERITED = '''import mod  # noqa


class Base:
    def test_shared(self):
        assert mod.X == 1

    def test_overridden(self):
        assert mod.X == 1


class TestChild(Base):
    def test_overridden(self):
        assert mod.X == 2


class TestOther(Base):
    pass
'''


def test_inherited_tests_end_as_their_base_body_and_overrides_as_their_own(tmp_path):
    rec = run_runner(tmp_path, "X = 1\n", INHERITED)
    ids = {n: f"tests/test_m.py::{n}" for n in ("TestChild::test_shared", "TestOther::test_shared",
                                                 "TestOther::test_overridden", "TestChild::test_overridden")}
    assert rec.finished and rec.tampering == []
    assert {ids[n] for n in ids if n != "TestChild::test_overridden"} == rec.body_ends
    assert rec.status(ids["TestChild::test_overridden"]) == "FAILED"


# A hook's frames must never reach the code under test: through the traceback of an exception raised inside a hook
# (a refusal, a lie found), a frame's locals lead to the hook's helpers and their closure cells (rewritable).
TRACEBACK_TO_RECORDER = when_test_bad_runs('''
    if WRITE is not None:
        item.runtest = lambda: WRITE(item.nodeid, 'body-end', '')
''', prelude='''

def _frames(error):
    tb = error.__traceback__
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _writer():
    try:
        vars(sys)['set' + 'trace'](lambda *args: None)
    except RuntimeError as error:
        for frame in _frames(error):
            for value in frame.f_locals.values():
                for cell in getattr(value, '__closure__', None) or ():
                    inner = cell.cell_contents
                    if getattr(inner, '__name__', '') == 'write':
                        return inner
    return None


WRITE = _writer()

''')
TRACEBACK_TO_CHECKER = '''
import sys


class _Agree:
    def __eq__(self, other):
        return True

    __hash__ = object.__hash__


A = _Agree()


def _disarm():
    done = False
    try:
        sys.audit('envhub.verdict.compare', 0, A, 3, 0, [None])
    except AssertionError as error:
        tb = error.__traceback__
        while tb is not None:
            frame = tb.tb_frame
            while frame is not None:
                for value in list(frame.f_locals.values()):
                    for cell in getattr(value, '__closure__', None) or ():
                        if getattr(cell.cell_contents, '__name__', '') == 'equal':
                            cell.cell_contents = lambda a, b: False
                            done = True
                frame = frame.f_back
            tb = tb.tb_next
    return done


DISARMED = _disarm()
'''


@pytest.mark.parametrize("attack", ["traceback-to-recorder", "traceback-to-checker"])
def test_no_hook_frame_reaches_the_code_under_test(attack, tmp_path):
    module = {"traceback-to-recorder": TRACEBACK_TO_RECORDER, "traceback-to-checker": TRACEBACK_TO_CHECKER}[attack]
    test = "import mod  # noqa\n\n\ndef test_bad():\n    assert mod.A == 3\n" if "checker" in attack else TWO_FILES
    log: list[str] = []
    rec = run_runner(tmp_path, module, test, log=log)
    assert rec.finished, log
    assert not forced(rec), f"{attack} got test_bad passed through a hook's frame: {rec}"


LYING_ORDER = '''
class _Huge:
    """Greater, smaller, at least and at most anything: every ordering says yes."""

    def __lt__(self, other):
        return True

    __le__ = __gt__ = __ge__ = __lt__


class _Knowing:
    """Orders only against numbers (what tests compare with), not against an object it does not know."""

    def __lt__(self, other):
        return True if isinstance(other, (int, float)) else NotImplemented

    __le__ = __gt__ = __ge__ = __lt__


A, B = _Huge(), _Knowing()
'''


def test_lying_orderings_are_refused_and_honest_ones_pass(tmp_path):
    test = ("import mod\n\n\ndef test_huge():\n    assert mod.A > 10 ** 9\n\n\ndef test_knowing():\n"
            "    assert mod.B >= 3\n\n\ndef test_honest():\n    assert 3 < 4 <= 4 and 2.5 > 1 and 'b' >= 'a' and "
            "(1, 2) < (1, 3) and {1} < {1, 2}\n    assert 4 > 3\n    assert not (4 < 3)\n")
    rec = run_runner(tmp_path, LYING_ORDER, test)
    assert rec.status("tests/test_m.py::test_huge") == "FAILED", "an object bigger than everything"
    assert rec.status("tests/test_m.py::test_knowing") == "FAILED", "both a >= 3 and a < 3"
    assert rec.passed("tests/test_m.py::test_honest")
    old_dir = tmp_path / "old"
    old_dir.mkdir()
    old = run_previous_runner(old_dir, LYING_ORDER, test)
    assert forced(old) is False and old.passed("tests/test_m.py::test_huge") and \
        old.passed("tests/test_m.py::test_knowing"), "the previous runner let lying orderings through"


OTHER_THREADS_FRAMES = """
import sys
import threading


def _grab():
    try:
        vars(sys)['_current' + '_frames']()
    except RuntimeError:
        pass


threading.Thread(target=_grab).start()
"""


def test_another_threads_frames_are_refused(tmp_path):
    """A thread that reads the main thread's frames could catch a hook mid-run (while it writes, the GIL is free):
    ``sys._current_frames`` is refused and recorded, whatever the other switches."""
    for audit in (True, False):
        (tmp_path / str(audit)).mkdir()
        rec = run_runner(tmp_path / str(audit), OTHER_THREADS_FRAMES, TWO_FILES, audit=audit)
        assert rec.finished and "sys._current_frames" in rec.tampering, rec.tampering


DEPTH = """
import sys


def depth():
    # how deep this call is: the frames left before a RecursionError (no frame touched)
    n = [0]

    def down():
        n[0] += 1
        down()
    try:
        down()
    except RecursionError:
        pass
    return sys.getrecursionlimit() - n[0]
"""
WHERE_FROM = DEPTH + """
import warnings


def trail():
    # where each caller above sits, read without touching a frame (warnings walks the stack in C) ...
    out = []
    for level in range(3, 9):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter('always')
            warnings.warn('where', stacklevel=level)
        out.append(f"{seen[0].filename.rsplit('/', 1)[-1]}:{seen[0].lineno}" if seen else '-')
    return ' '.join(out) + f' depth={depth()}'  # ... and how deep


def note(label, what):
    open('calls', 'a').write(f'{label}|{what}|{trail()}\\n')


class Value:
    def __init__(self, label):
        self.label = label

    def __eq__(self, other):
        note(self.label, 'eq')
        return other is self

    def __ne__(self, other):
        note(self.label, 'ne')
        return other is not self

    def __lt__(self, other):
        note(self.label, 'lt')
        return False

    def __gt__(self, other):
        note(self.label, 'gt')
        return False

    def __bool__(self):
        note(self.label, 'bool')
        return False

    def __contains__(self, item):
        note(self.label, 'contains')
        return False

    __hash__ = object.__hash__
"""
WHERE_FROM_TESTS = ("import mod\n\n\ndef test_eq():\n    assert mod.Value('eq') == 3\n\n\ndef test_ne():\n"
                    "    assert mod.Value('ne') != mod.Value('other')\n\n\ndef test_lt():\n"
                    "    assert mod.Value('lt') < 3\n\n\ndef test_in():\n    assert 3 in mod.Value('in')\n\n\n"
                    "def test_truth():\n    assert mod.Value('truth')\n\n\ndef test_item():\n"
                    "    assert [mod.Value('item')] == [3]\n\n\ndef test_dict_value():\n"
                    "    assert {'k': (mod.Value('dict'),)} == {'k': (3,)}\n")


def test_a_value_is_called_from_one_place_at_one_depth_for_the_real_comparison_and_every_probe(tmp_path):
    """The checker decides a comparison among probes; a value that could tell which call is the real one would answer
    that one alone honestly-looking and lie to the rest. Frames are refused, but two channels need none: the file and
    line of each caller (``warnings.warn(stacklevel=k)`` walks the stack in C) and the depth (count frames to a
    ``RecursionError``). Before this change the real comparison ran at its own line of ``compare``, one frame above
    the probes (in ``equal``/``order``/``lies_inside``): a liar could answer by either. Now every call into tested code
    is made from one line at one depth, so each of a value's methods sees one caller trail, whichever job it is."""
    rec = run_runner(tmp_path, WHERE_FROM, WHERE_FROM_TESTS)
    calls: dict[tuple[str, str], set[str]] = {}
    counts: dict[tuple[str, str], int] = {}
    for line in (tmp_path / "calls").read_text().splitlines():
        label, what, where = line.split("|")
        calls.setdefault((label, what), set()).add(where)
        counts[(label, what)] = counts.get((label, what), 0) + 1
    # the real call and at least one probe of each kind were made ...
    assert counts[("eq", "eq")] >= 3 and counts[("ne", "ne")] >= 2 and counts[("lt", "lt")] >= 2
    assert counts[("in", "contains")] >= 2 and counts[("truth", "bool")] >= 1 and counts[("truth", "eq")] >= 1
    assert counts[("item", "eq")] >= 2 and counts[("dict", "eq")] >= 2
    # ... and each method saw one place and one depth
    assert {k: v for k, v in calls.items() if len(v) > 1} == {}
    assert all(rec.status(f"tests/test_m.py::test_{n}") == "FAILED" for n in ("eq", "lt", "in", "truth", "item"))


DEPTH_LIAR = DEPTH + """
REAL = []


class Liar:
    # equal to anything, but only when asked from the depth of the real comparison: mark() learns it from the test
    # body's depth and the grader's published code (the previous checker's probes ran one frame deeper)
    def __eq__(self, other):
        return depth() <= REAL[0]

    __ne__ = lambda self, other: not self.__eq__(other)
    __hash__ = object.__hash__


def mark(checker_depth_offset):
    REAL.append(depth() + checker_depth_offset)
"""


@pytest.mark.parametrize("offset", [3, 4, 5, 6])
def test_a_liar_that_answers_by_its_depth_gets_nothing(offset, tmp_path):
    """``mark`` is called from the test body; the real comparison of the previous checker (``7afcb5e``) ran 4 frames
    below it (cmp, the hook, compare), and this liar with offset 4 got ``test_bad`` passed there. Whatever offset it
    guesses now, it is caught: every probe runs as deep as the real comparison."""
    test = f"import mod\n\n\ndef test_bad():\n    mod.mark({offset})\n    assert mod.Liar() == 3\n    assert mod.Liar() == 4\n"
    rec = run_runner(tmp_path, DEPTH_LIAR, test)
    assert rec.status(BAD) == "FAILED"
