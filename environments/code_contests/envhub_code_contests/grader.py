"""EVAL for code-contests: run a submitted solution on every test in a fresh sandbox, judge-style.

The grader holds the tests; the sandbox never does. For each test, the solution runs as a new process with the
test's input on stdin, under the problem's CPU-time limit (``RLIMIT_CPU``), a wall-clock limit (sleeping or blocking
does not escape), an address-space limit (the memory limit), a file-size cap and a process cap. Only its stdout
and exit status come back; the expected output is compared *here*, on the host, by the problem's checker. So a
solution cannot read expected outputs, cannot write a file the grader reads (the grader reads none), and cannot
pass by exiting early (a silent exit is a wrong answer; a non-zero exit is a runtime error).

The interpreter is the host's base Python 3 run as ``python -I -S``: no site-packages, no ``PYTHON*`` variables, no
``sitecustomize``, no current directory on ``sys.path``, the standard library only (as on a judge).

Verdicts, as judges name them: ``OK``, ``WA`` (wrong answer), ``TLE`` (time limit exceeded), ``MLE`` (memory limit
exceeded), ``RE`` (runtime error: non-zero exit, killed), ``OLE`` (output limit exceeded). Grading stops at the first
failing test (as Codeforces does) unless ``stop_on_failure=False``.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envhub_code_contests.checker import check

SOLUTION_PATH = "/testbed/solution.py"
MAX_SOLUTION_BYTES = 256 * 1024
GROUPS = ("public_tests", "private_tests", "generated_tests")
PACKAGE = Path(__file__).parent


def python_for_solutions() -> str:
    """The host's base interpreter (not the venv's): inside the sandbox it sees only the standard library."""
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(base.resolve()) if base.exists() else os.path.realpath(sys.executable)


@dataclass
class TestResult:
    group: str
    index: int
    verdict: str
    time_s: float
    detail: str = ""


def limits_of(task: dict[str, Any]) -> tuple[float, int]:
    """``(time limit in s, memory limit in MB)`` of a task row (CodeContests fields, with judges' defaults)."""
    tl = task.get("time_limit") or {}
    seconds = float(tl.get("seconds") or 0) + float(tl.get("nanos") or 0) / 1e9
    mem = int(task.get("memory_limit_bytes") or 0) // 2**20
    return (seconds if seconds > 0 else 2.0), (mem if mem > 0 else 256)


def tests_of(task: dict[str, Any]) -> list[tuple[str, int, str, str]]:
    """Every test of the task as ``(group, index, input, expected output)``: public, then private, then generated."""
    out = []
    for group in GROUPS:
        tests = task.get(group) or {}
        for i, (inp, exp) in enumerate(zip(tests.get("input") or [], tests.get("output") or [])):
            out.append((group, i, inp, exp))
    return out


# The judge's launcher (#13): RLIMIT_CPU is per process, so a solution that hands its work down a chain of forked
# processes (each waiting for the next) gets a fresh CPU budget per process. The launcher makes itself the
# subreaper of everything the solution starts, waits until *all* of it has exited (a process left running keeps the
# test going until the wall clock: TLE), and sums their CPU time (RUSAGE_CHILDREN). Over the limit, it exits
# 128+SIGXCPU, the status a single process killed by RLIMIT_CPU gives. It is bound read-only and is not dumpable,
# so the solution can neither rewrite it between tests nor trace it.
LAUNCHER = """\
import ctypes, os, resource, signal, sys
limit, argv = float(sys.argv[1]), sys.argv[2:]
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(36, 1, 0, 0, 0) != 0 or libc.prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_CHILD_SUBREAPER, PR_SET_DUMPABLE
    sys.stderr.write("judge: cannot become the subreaper of the solution\\n")
    os._exit(125)
pid = os.fork()
if pid == 0:
    os.execv(argv[0], argv)
status = os.waitpid(pid, 0)[1]
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
used = resource.getrusage(resource.RUSAGE_CHILDREN)
if used.ru_utime + used.ru_stime > limit:
    os._exit(128 + signal.SIGXCPU)
code = os.waitstatus_to_exitcode(status)
os._exit(code if code >= 0 else 128 - code)
"""
LAUNCHER_PATH = "/judge/launch.py"


def launcher_dir() -> str:
    """A host directory holding the launcher (named by its content, so concurrent graders share it safely)."""
    import hashlib
    import tempfile

    d = Path(tempfile.gettempdir()) / f"envhub-judge-{hashlib.sha256(LAUNCHER.encode()).hexdigest()[:16]}"
    if not (d / "launch.py").exists():
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".launch.{os.getpid()}"
        tmp.write_text(LAUNCHER)
        tmp.replace(d / "launch.py")
    return str(d)


def eval_spec(memory_mb: int):
    """The fresh sandbox one grading runs in: a small tmpfs workspace, no network, the plugin's files hidden."""
    from envhub.sandbox import SandboxSpec

    from envhub_code_contests.isolation import hide_package

    return SandboxSpec(workspace_size_mb=32, tmp_size_mb=32, memory_mb=memory_mb + 512, max_procs=64,
                       max_file_mb=16, timeout_s=60.0, python_on_path=False, network=False, stdlib_only=True,
                       binds=hide_package(PACKAGE) + [(launcher_dir(), str(Path(LAUNCHER_PATH).parent), "ro")])


def wall_limit(time_limit_s: float) -> float:
    """The wall-clock cap: generous, because the verdict is on CPU time; it only stops sleeping or blocked runs (a
    busy machine slows the wall clock, never the CPU time, so a correct solution never hits this)."""
    return 3 * time_limit_s + 2.0


def judge_one(sandbox, python: str, inp: str, expected: str, *, time_limit_s: float, memory_mb: int,
              checker: str) -> tuple[str, float, str]:
    """Run the solution once: ``(verdict, wall seconds, detail)``."""
    limit = max(65536, 4 * len(expected) + 4096)
    r = sandbox.exec([python, "-I", "-S", LAUNCHER_PATH, f"{time_limit_s:g}", python, "-I", "-S", SOLUTION_PATH], input=inp, cwd="/testbed",
                     timeout=wall_limit(time_limit_s), cpu_s=time_limit_s, memory_mb=memory_mb, max_file_mb=16,
                     max_procs=16, output_limit=limit, env={"PYTHONHASHSEED": "0"})
    if r.error:
        return "RE", r.duration_s, f"the run could not complete: {r.error[:300]}"
    if r.timed_out:
        return "TLE", r.duration_s, f"wall clock over {wall_limit(time_limit_s):g} s"
    if r.signal == signal.SIGXCPU or r.exit_code == 128 + signal.SIGXCPU:
        return "TLE", r.duration_s, f"CPU time over {time_limit_s:g} s"
    if r.exit_code != 0:
        tail = r.stderr.strip().splitlines()[-1:] or [""]
        if "MemoryError" in r.stderr:
            return "MLE", r.duration_s, f"memory over {memory_mb} MB ({tail[0][:200]})"
        how = f"killed by signal {r.signal}" if r.signal else f"exit code {r.exit_code}"
        return "RE", r.duration_s, f"{how}: {tail[0][:300]}"
    if r.cut:
        return "OLE", r.duration_s, f"printed {r.cut + limit} bytes or more; expected {len(expected)}"
    ok, why = check(checker, r.stdout, expected)
    return ("OK" if ok else "WA"), r.duration_s, ("" if ok else why)


def grade(task: dict[str, Any], solution: str, *, stop_on_failure: bool = True, sandbox_factory=None) -> dict[str, Any]:
    """Run ``solution`` on all tests of ``task`` in a fresh sandbox. Returns ``{"passed", "results", ...}``."""
    time_limit_s, memory_mb = limits_of(task)
    tests = tests_of(task)
    if not tests:
        return {"passed": False, "reason": "the task has no tests", "results": []}
    if not solution.strip():
        return {"passed": False, "reason": f"no solution: write it to {SOLUTION_PATH}", "results": []}
    if len(solution.encode()) > MAX_SOLUTION_BYTES:
        return {"passed": False, "reason": f"the solution is over {MAX_SOLUTION_BYTES} bytes", "results": []}
    if sandbox_factory is None:
        from envhub.sandbox import start as sandbox_factory
    checker = task.get("checker") or "tokens"
    python = python_for_solutions()
    t0 = time.perf_counter()
    results: list[TestResult] = []
    sandbox = sandbox_factory(eval_spec(memory_mb))
    try:
        sandbox.write_file(SOLUTION_PATH, solution)
        for group, i, inp, exp in tests:
            verdict, dt, detail = judge_one(sandbox, python, inp, exp, time_limit_s=time_limit_s,
                                            memory_mb=memory_mb, checker=checker)
            results.append(TestResult(group, i, verdict, round(dt, 4), detail))
            if verdict != "OK" and stop_on_failure:
                break
    finally:
        sandbox.stop()
    failed = [r for r in results if r.verdict != "OK"]
    passed = not failed and len(results) == len(tests)
    reason = "all tests passed" if passed else f"{failed[0].verdict} on {failed[0].group}[{failed[0].index}]: " \
                                                f"{failed[0].detail}"
    return {"passed": passed, "reason": reason, "tests": len(tests), "run": len(results),
            "verdicts": {v: sum(r.verdict == v for r in results) for v in sorted({r.verdict for r in results})},
            "time_limit_s": time_limit_s, "memory_mb": memory_mb, "eval_s": round(time.perf_counter() - t0, 3),
            "results": [asdict(r) for r in results]}
