"""Running a repository's tests the way the grader trusts, and reading the results back.

Two halves, shared by the dataset generator (which computes FAIL_TO_PASS / PASS_TO_PASS on the host) and the grader
(which runs the same command in a fresh sandbox):

* :func:`pytest_command` builds an argv that ignores everything a patch could use to steer the run: the interpreter
  is named by absolute path (no ``PATH`` lookup, so a ``python``/``pytest`` shim in the repository is never run);
  ``-I`` isolates it (no ``PYTHON*`` variables, no user site, no current directory on ``sys.path``: a
  ``sitecustomize.py`` or ``usercustomize.py`` in the repository is never imported); ``-c`` points pytest at *our*
  configuration, so ``pytest.ini`` / ``pyproject.toml`` / ``setup.cfg`` / ``tox.ini`` of the repository (``addopts``,
  ``python_files``, ``-p plugin``) are never read; plugin auto-loading is off (:data:`PYTEST_ENV`); ``-p
  no:cacheprovider`` means no ``--lf``-style state survives between runs.
* :func:`parse_pytest_rA` reads pytest's ``-rA`` short summary (``PASSED tests/test_x.py::test_a``), as SWE-bench's
  log parser does, but only inside the summary section and matching node ids against the names we expect, so a
  stray line printed by the code under test earlier in the log means nothing, and a parametrized id that contains
  `` - `` is still read right.
"""
from __future__ import annotations

import functools
import importlib.util
import marshal
import re
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

from envhub_swe_gym.verdict_instrument import is_test_path  # noqa: F401 - (sandbox side: the runner uses it)

STATUSES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")

# Our pytest configuration: the only one the run reads. ``pythonpath`` makes the package importable from the
# repository root (``-I`` keeps the current directory off sys.path); pytest resolves it against the ini file's own
# directory, hence an absolute path.
PYTEST_INI = """\
[pytest]
addopts =
pythonpath = {rootdir}
python_files = test_*.py *_test.py
python_classes = Test
python_functions = test_*
xfail_strict = false
console_output_style = classic
"""


def pytest_ini(rootdir: str) -> str:
    """Our pytest configuration for a repository checked out at ``rootdir``."""
    return PYTEST_INI.format(rootdir=rootdir)

PYTEST_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",  # no entry-point plugins: only pytest itself runs the tests
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
    "LC_ALL": "C.UTF-8",
    "COLUMNS": "200",  # the summary truncates long lines to the terminal width
    "HOME": "/tmp",
}


def pytest_command(python: str, test_files: list[str], ini_path: str, rootdir: str) -> list[str]:
    """The argv that runs ``test_files`` (paths relative to ``rootdir``) under our configuration only."""
    return [
        python, "-I", "-B", "-m", "pytest", "-rA", "--tb=short", "--color=no",
        "-c", ini_path, "--rootdir", rootdir, "-p", "no:cacheprovider", "-p", "no:stepwise",
        *test_files,
    ]


RUNNER_SOURCE = (Path(__file__).parent / "verdict_runner.py").read_text()
SIBLING_SOURCES = {part: (Path(__file__).parent / f"verdict_{part}.py").read_text()
                   for part in ("instrument", "checker", "refuser")}


def write_runner(directory: Path, stem: str, precompiled: bool = True) -> Path:
    """Write the verdict runner as ``directory/stem.py`` with its modules beside it (``stem_instrument.py``,
    ``stem_checker.py``, ``stem_refuser.py``: the names the runner looks for); return the runner's path.

    ``precompiled``: each module's bytecode goes beside it too (``__pycache__``), compiled once per process, so the
    grading interpreter (``-B``: it writes no cache) loads it instead of compiling ~900 lines at every grading. The
    interpreter checks it against the source's size and time as any import does, and names the code after the
    file it loads (``co_filename``), as compiling it would; a mismatch (another Python version) compiles the
    source."""
    for part, source in SIBLING_SOURCES.items():
        path = directory / f"{stem}_{part}.py"
        path.write_text(source)
        if precompiled:
            write_bytecode(path, _sibling_code(part))
    runner = directory / f"{stem}.py"
    runner.write_text(RUNNER_SOURCE)
    return runner


@functools.lru_cache(maxsize=None)
def _sibling_code(part: str) -> types.CodeType:
    # optimize=0: the runner's interpreter runs without -O; the file name is replaced by the real one at load
    return compile(SIBLING_SOURCES[part], f"verdict_{part}.py", "exec", dont_inherit=True, optimize=0)


def write_bytecode(source: Path, code: types.CodeType) -> Path:
    """Write ``code`` as ``source``'s cached bytecode (a timestamp ``.pyc``, what ``py_compile`` writes by default),
    in the ``__pycache__`` beside it: where the sandboxed runner (``-I``, no ``PYTHONPYCACHEPREFIX``) looks, whatever
    ``sys.pycache_prefix`` this process has (a lazily compiled venv sets one: ``scripts/lazy-bytecode.sh``)."""
    st = source.stat()
    pyc = source.parent / "__pycache__" / f"{source.stem}.{sys.implementation.cache_tag}.pyc"
    pyc.parent.mkdir(exist_ok=True)
    header = importlib.util.MAGIC_NUMBER + b"\0\0\0\0" + (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") \
        + (st.st_size & 0xFFFFFFFF).to_bytes(4, "little")
    pyc.write_bytes(header + marshal.dumps(code))
    return pyc


def runner_command(python: str, runner: str, test_files: list[str], ini_path: str, rootdir: str) -> list[str]:
    """The grader's argv: :func:`pytest_command`'s options, run through the verdict runner at ``runner`` (a path in
    the sandbox) instead of ``-m pytest`` (see :mod:`envhub_swe_gym.verdict_runner`)."""
    argv = pytest_command(python, test_files, ini_path, rootdir)
    return [python, "-I", "-B", runner, *argv[argv.index("pytest") + 1:]]


_HEADER = re.compile(r"^=+ short test summary info =+$", re.M)
_FINAL = re.compile(r"^=+ (.*\bin [0-9.]+s.*) =+$", re.M)


@dataclass
class PytestLog:
    """What one pytest run reported: ``statuses`` by node id, plus whether the run looked complete."""

    statuses: dict[str, str] = field(default_factory=dict)
    has_summary: bool = False  # the "short test summary info" section was printed
    final_line: str = ""  # "2 failed, 10 passed in 0.12s": pytest got to its very end
    collection_errors: list[str] = field(default_factory=list)  # files that failed to import

    @property
    def complete(self) -> bool:
        return self.has_summary and bool(self.final_line)


def parse_pytest_rA(log: str, expected: list[str] | tuple[str, ...] = ()) -> PytestLog:
    """Parse a ``pytest -rA`` log into per-test statuses.

    Only lines inside the last "short test summary info" section count. ``expected`` names (node ids) are matched
    first, longest first, so ids containing spaces or `` - `` parse exactly; other lines are split at the first
    `` - `` (where pytest puts the failure message).
    """
    out = PytestLog()
    headers = list(_HEADER.finditer(log))
    finals = list(_FINAL.finditer(log))
    if finals:
        out.final_line = finals[-1].group(1).strip()
    if not headers:
        return out
    out.has_summary = True
    start = headers[-1].end()
    end = finals[-1].start() if finals and finals[-1].start() > start else len(log)
    known = sorted(set(expected), key=len, reverse=True)
    for line in log[start:end].splitlines():
        line = line.rstrip()
        status, _, rest = line.partition(" ")
        if status not in STATUSES or not rest:
            continue
        if status == "SKIPPED" and rest.startswith("["):
            continue  # "SKIPPED [1] path:line: reason" names no test id: the test simply did not pass
        name = next((k for k in known if rest == k or rest.startswith(k + " - ")), None)
        if name is None:
            name = rest.split(" - ", 1)[0].strip()
        if status == "ERROR" and "::" not in name:
            out.collection_errors.append(name)
            continue
        # a test that errors in teardown after passing is listed twice: the worst status wins
        previous = out.statuses.get(name)
        if previous is None or _rank(status) > _rank(previous):
            out.statuses[name] = status
    return out


def _rank(status: str) -> int:
    return {"PASSED": 0, "XPASS": 1, "XFAIL": 1, "SKIPPED": 2, "FAILED": 3, "ERROR": 4}.get(status, 5)


def files_of_tests(names: list[str]) -> list[str]:
    """The files holding the named tests (``tests/test_x.py::test_a[1]`` -> ``tests/test_x.py``), in first-seen order."""
    files: list[str] = []
    for n in names:
        path = n.split("::", 1)[0]
        if path and path not in files:
            files.append(path)
    return files


def diff_files(patch: str) -> list[str]:
    """Paths a unified git diff touches (both sides of renames), in order."""
    files: list[str] = []
    for m in re.finditer(r"^diff --git a/(.+?) b/(.+?)$", patch, re.M):
        for p in m.groups():
            if p not in files:
                files.append(p)
    return files
