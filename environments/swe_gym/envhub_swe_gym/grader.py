"""EVAL: grade an agent's diff in fresh sandboxes, the SWE-bench way, hardened against reward hacks.

``SweGymVerifier().verify(task, {"patch": diff})`` does, for one task row:

1. **Filter** the diff (:func:`~envhub_swe_gym.patchguard.filter_patch`): file sections touching tests, runner
   configuration, start-up hooks, shims, binaries... are dropped and reported. **Scan** what is left
   (:func:`~envhub_swe_gym.patchguard.scan_patch`): added code that reaches for the test runner or the process
   rejects the diff. A diff with nothing left resolves nothing (no test run needed: FAIL_TO_PASS fail at
   ``base_commit`` by construction).
2. **Prepare** (sandbox A, fresh, no network): a clean copy of the repository at ``base_commit`` at ``/testbed``;
   ``git apply`` the diff; **reset** every test file the test patch touches to ``base_commit`` (and, as a second
   line, any protected file the diff still changed); apply the ``test_patch``; plant one or two *canaries* per test
   file: failing tests with names built from the file's own words, between random top-level statements.
3. **Run** (sandbox B, fresh, no network, tree **read-only**): our pytest command (absolute interpreter, ``-I``, our
   ini, no plugin autoload) runs through the grader's launcher (:mod:`~envhub_swe_gym.verdict_runner`), which gets
   a per-run secret on stdin before any code under test is imported.
4. **Read** the HMAC-authenticated records (:mod:`~envhub_swe_gym.verdict`); the pytest log is kept for people,
   never read for a verdict. **Check integrity**: the run finished; the audit hook refused no tampering; every
   canary failed; every test that passed also recorded, from inside its own body, that the body ran to its end.
5. **Resolve**: every FAIL_TO_PASS and PASS_TO_PASS test passed (setup, call and teardown; skipped, xfail, errors,
   missing count as not passed). Reward 1.0 / 0.0; ``details`` holds SWE-bench's ``tests_status`` report.

Why each step holds against code that runs inside the test process: docs/decisions.md, "#13 swe-gym verdicts".

Defenses can be switched off one by one (``defenses=``) only so tests can show that each remaining line still
holds; graders in use keep them all.
"""
from __future__ import annotations

import json
import random
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from envhub import Score
from envhub_swe_gym import repos
from envhub_swe_gym.patchguard import filter_patch, protected_reason, scan_patch
from envhub_swe_gym.testrun import PYTEST_ENV, diff_files, files_of_tests, is_test_path, pytest_ini, \
    runner_command, write_runner
from envhub_swe_gym.verdict import identifier, new_secret, plant_canaries, read_records

DEFENSES = frozenset({"filter", "scan", "reset", "readonly", "canary", "body-end", "audit", "truth", "unittest", "hide",
                      "memory", "dry-run"})
GIT = ["git", "-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false", "-c", "safe.directory=*"]
GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TERMINAL_PROMPT": "0"}
MAX_PATCH_BYTES = 2 << 20


RC_MARKER = "__envhub_rc="


def sandbox_run(sb, argv: list[str], *, input: str | None = None, cwd: str = "/testbed", timeout: float = 120,
                env: dict | None = None):
    """Run ``argv`` in sandbox ``sb``; return its ``ExecResult`` with the exit status the command itself reported.

    A wrapper shell prints the command's status as the last line of stderr, and that is what ``exit_code`` becomes:
    a supervisor that kills the process group once output has closed (to reap stragglers) cannot turn a finished
    command's success into a failure. Without the line (the wrapper itself was killed), the transport's status
    stands.
    """
    wrapped = ["bash", "-c", f'"$@"; rc=$?; echo "{RC_MARKER}$rc" >&2; exit $rc', "envhub-run", *argv]
    r = sb.exec(wrapped, input=input, cwd=cwd, timeout=timeout, env=env)
    head, _, last = r.stderr.rstrip("\n").rpartition("\n")
    if last.startswith(RC_MARKER) and last[len(RC_MARKER):].isdigit():
        r.exit_code = int(last[len(RC_MARKER):])
        r.stderr = head + "\n" if head else ""
        r.signal = None
    return r


def as_list(value: Any) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS as a list: SWE-Gym stores lists, SWE-bench JSON strings."""
    if value is None:
        return []
    if isinstance(value, str):
        value = value.strip()
        return [str(v) for v in json.loads(value)] if value else []
    return [str(v) for v in value]


class SweGymVerifier:
    """Grades ``artifacts["patch"]`` against a SWE-Gym row (see the module docstring for the steps).

    Args:
        timeout_s: wall-clock limit of the test run.
        defenses: which defenses are on (default: all of :data:`DEFENSES`).
        memory_mb: memory cap of each grading sandbox.
        python: the interpreter that runs pytest (default: this one; it must have pytest).
    """

    def __init__(self, timeout_s: float = 300.0, defenses: frozenset[str] | set[str] = DEFENSES,
                 memory_mb: int = 2048, python: str | None = None):
        unknown = set(defenses) - DEFENSES
        if unknown:
            raise ValueError(f"unknown defenses {sorted(unknown)}; known: {sorted(DEFENSES)}")
        self.timeout_s = timeout_s
        self.defenses = frozenset(defenses)
        self.memory_mb = memory_mb
        self.python = python or sys.executable

    @property
    def hack_probes(self) -> dict:
        """The probes that come with this grader, whichever env grades with it: admission plays them on every task.
        The answer-key reader (#29) reads the expected values from the tests it runs: it must score 0."""
        from envhub_swe_gym.policies import HACK_PROBES

        return {"answer-key-reader": HACK_PROBES["answer-key-reader"]}

    def verify(self, task: dict, artifacts: dict) -> Score:
        f2p, p2p = as_list(task.get("FAIL_TO_PASS")), as_list(task.get("PASS_TO_PASS"))
        details: dict[str, Any] = {"instance_id": task.get("instance_id", task.get("task_id", "")), "resolved": False}
        artifacts = artifacts if isinstance(artifacts, dict) else {}
        patch = artifacts.get("patch")
        if artifacts.get("error"):
            details["artifact_error"] = str(artifacts["error"])[:2000]
        if not isinstance(patch, str):
            return _fail(details, "no patch in the artifacts (the episode produced no diff)")
        if len(patch.encode("utf-8", errors="replace")) > MAX_PATCH_BYTES:
            return _fail(details, f"the patch is larger than {MAX_PATCH_BYTES} bytes")
        if not f2p:
            return _fail(details, "the task lists no FAIL_TO_PASS test: nothing to grade")
        if "filter" in self.defenses:
            patch, dropped = filter_patch(patch)
            details["dropped"] = dropped
        if "scan" in self.defenses:
            findings = scan_patch(patch)
            if findings:
                details["findings"] = findings
                return _fail(details, "the patch was rejected: its code reaches for the test runner or the process "
                                      f"({findings[0]['rule']}: {findings[0]['path']}:{findings[0]['line']})")
        if not patch.strip():
            why = " after dropping changes to protected files" if details.get("dropped") else ""
            return _fail(details, f"the patch is empty{why}: nothing changed in the code")
        return self._run(task, patch, f2p, p2p, details)

    # ---- steps 2-5 ------------------------------------------------------------------------------------------------
    def _run(self, task: dict, patch: str, f2p: list[str], p2p: list[str], details: dict) -> Score:
        from envhub.sandbox import SandboxSpec, start

        t0 = time.perf_counter()
        rng = random.Random(secrets.randbits(64))
        checkout = repos.checkout(task["repo"], task["base_commit"])
        test_patch = task.get("test_patch") or ""
        patch_tests = [f for f in diff_files(test_patch) if f.endswith(".py") and is_test_path(f)
                       and Path(f).name != "conftest.py"]
        run_files = list(dict.fromkeys(files_of_tests(f2p + p2p) + patch_tests))
        prep = Path(tempfile.mkdtemp(prefix="swe-gym-eval-"))
        try:
            tree, grader_dir = prep / "testbed", prep / "grader"
            subprocess.run(["cp", "-a", f"{checkout}/.", str(tree)], check=True, capture_output=True)
            grader_dir.mkdir()
            (grader_dir / "pytest.ini").write_text(pytest_ini("/testbed"))
            runner = f"/grader/{write_runner(grader_dir, identifier(rng)[1:]).name}"
            base = dict(workdir="/grader-work", network=False, memory_mb=self.memory_mb, timeout_s=self.timeout_s,
                        output_limit=4 << 20, env=dict(GIT_ENV))
            with start(SandboxSpec(binds=[(str(tree), "/testbed", "rw"), (str(grader_dir), "/grader", "ro")],
                                   **base)) as sb:
                problem, canaries, sources = self._prepare(sb, task, patch, test_patch, run_files, rng, details)
            if problem:
                return _fail(details, problem)
            mode = "ro" if "readonly" in self.defenses else "rw"
            secret = new_secret()
            with start(SandboxSpec(binds=[(str(tree), "/testbed", mode), (str(grader_dir), "/grader", "ro")],
                                   **base)) as sb:
                r = sandbox_run(sb, runner_command(self.python, runner, run_files, "/grader/pytest.ini", "/testbed"),
                                input=secret.payload("/testbed", run_files, truth="truth" in self.defenses,
                                                     audit="audit" in self.defenses,
                                                     unittest="unittest" in self.defenses, sources=sources,
                                                     memory="memory" in self.defenses,
                                                     dry_run="dry-run" in self.defenses), env=PYTEST_ENV,
                                timeout=self.timeout_s)
                try:
                    text = sb.read_file(secret.out).decode("utf-8", errors="replace")
                except Exception:  # no records file: the run left nothing we can trust
                    text = ""
                records = read_records(text, secret)
        finally:
            shutil.rmtree(prep, ignore_errors=True)
        details["duration_s"] = round(time.perf_counter() - t0, 3)
        return self._judge(r, records, f2p, p2p, canaries, details)

    def _prepare(self, sb, task: dict, patch: str, test_patch: str, run_files: list[str], rng: random.Random,
                 details: dict) -> tuple[str | None, list[str], dict[str, str]]:
        """Apply the diff, reset test files, apply the test patch, plant canaries, then take the test files' text
        out of the tree (it goes to the runner on stdin) with git's store and every compiled cache.

        Returns (a failure reason or None, the canaries' node ids, the test files' text by path)."""
        base = task["base_commit"]

        def git(*args: str, input: str | None = None):
            return sandbox_run(sb, [*GIT, *args], input=input)

        r = git("apply", "--whitespace=nowarn", "-", input=patch)
        if not r.ok:
            details["apply_log"] = r.output[-2000:]
            return "the patch does not apply to base_commit", [], {}
        reset: list[str] = []
        if "reset" in self.defenses:
            status = git("status", "--porcelain=v1", "-z", "--untracked-files=all")
            changed = _porcelain_paths(status.stdout)
            reset = [p for p in changed if protected_reason(p)]
        touched = diff_files(test_patch)
        at_base = set(git("ls-tree", "-r", "--name-only", base).stdout.splitlines())
        to_restore = sorted({p for p in touched + reset if p in at_base})
        to_remove = sorted({p for p in touched + reset if p not in at_base})
        if to_restore:
            r = git("checkout", "-q", base, "--", *to_restore)
            if not r.ok:
                return f"could not reset test files: {r.output[-500:]}", [], {}
        if to_remove:
            sandbox_run(sb, ["rm", "-rf", "--", *to_remove])
        details["reset"] = sorted(set(to_restore) | set(to_remove))
        if test_patch.strip():
            r = git("apply", "--whitespace=nowarn", "-", input=test_patch)
            if not r.ok:
                details["apply_log"] = r.output[-2000:]
                return "the test patch does not apply after the agent's patch (the task row is broken)", [], {}
        canaries: list[str] = []
        sources: dict[str, str] = {}
        hide = "hide" in self.defenses
        for f in run_files:
            r = sandbox_run(sb, ["sh", "-c", 'test -f "$1" && ! test -L "$1" && cat "$1"', "sh", f])
            if not r.ok:
                return f"could not read the test file {f} (missing or not a regular file)", [], {}
            text = r.stdout
            if "canary" in self.defenses:
                # canaries are ordinary-looking tests with names built from the file's own words, at random places,
                # one or two per file: a hack cannot pick them out by name, shape or position
                text, names = plant_canaries(text, rng, rng.randint(1, 2))
                canaries += [f"{f}::{n}" for n in names]
            sources[f] = text
            if hide or "canary" in self.defenses:  # (hidden: an empty file, which pytest still collects)
                r = sandbox_run(sb, ["sh", "-c", 'cat > "$1"', "sh", f], input="" if hide else text)
                if not r.ok:
                    return f"could not prepare the test file {f}: {r.output[-300:]}", [], {}
        if hide:  # no copy of the tests left to read: git's store (the tests at base_commit), compiled caches
            r = sandbox_run(sb, ["sh", "-c", "rm -rf .git && find . \\( -name __pycache__ -o -name .pytest_cache "
                                             "-o -name '*.pyc' \\) -prune -exec rm -rf {} +"])
            if not r.ok:
                return f"could not clear git's store and the caches from the tree: {r.output[-300:]}", [], {}
            details["hidden"] = sorted(sources) + [".git", "__pycache__", ".pytest_cache"]
        return None, canaries, sources

    def _judge(self, r, rec, f2p: list[str], p2p: list[str], canaries: list[str], details: dict) -> Score:
        """The verdict from the authenticated records only; the log is kept for people to read."""
        details.update(exit_code=r.exit_code, log_tail=(r.stdout + r.stderr)[-3000:])
        integrity = []
        if r.timed_out:
            integrity.append(f"the test run timed out after {self.timeout_s:g} s")
        elif not rec.finished:
            integrity.append(f"the test run did not finish (exit code {r.exit_code}, {len(rec.outcomes)} "
                             "authenticated records): the run was cut short")
        if rec.rejected:
            details["forged_records"] = rec.rejected
        details["confinement"] = rec.confinement
        if rec.tampering:
            integrity.append(f"the code under test tried {', '.join(sorted(set(rec.tampering)))} during the test "
                             "run (refused): the test run was tampered with")
        for c in canaries:
            if rec.outcomes.get((c, "call")) != "failed":
                integrity.append(f"the canary test {c} must fail but was {rec.outcomes.get((c, 'call'), 'not run')}: "
                                 "the test run was tampered with")
        statuses = {t: rec.status(t) for t in f2p + p2p}
        if "body-end" in self.defenses:
            for t in f2p + p2p:
                if statuses[t] != "PASSED" or t in rec.body_ends:
                    continue
                if f"/testbed/{t.split('::')[0]}" not in rec.instrumented:
                    statuses[t] = "UNVERIFIED"
                    integrity.append(f"{t} cannot be verified: its file was not instrumented (pytest did not "
                                     "rewrite it: assertion rewriting off, or not collected as a test module)")
                else:
                    statuses[t] = "UNTRUSTED"
                    integrity.append(f"{t} was reported passed, but its body never ran to its end: the test "
                                     "outcome was forced")
        report = {}
        for key, names in (("FAIL_TO_PASS", f2p), ("PASS_TO_PASS", p2p)):
            report[key] = {"success": [t for t in names if statuses[t] == "PASSED"],
                           "failure": [t for t in names if statuses[t] != "PASSED"]}
        details["tests_status"] = report
        details["tests"] = statuses
        if integrity:
            details["integrity"] = integrity[:20]
            return _fail(details, integrity[0])
        failed = report["FAIL_TO_PASS"]["failure"] + report["PASS_TO_PASS"]["failure"]
        if failed:
            return _fail(details, f"{len(failed)} named test(s) did not pass: "
                                  + ", ".join(f"{t} ({statuses[t]})" for t in failed[:5]))
        details["resolved"] = True
        details["reason"] = f"resolved: {len(f2p)} FAIL_TO_PASS and {len(p2p)} PASS_TO_PASS tests pass"
        return Score(1.0, True, details)


def _fail(details: dict, reason: str) -> Score:
    details["resolved"] = False
    details["reason"] = reason
    return Score(0.0, False, details)


def _porcelain_paths(z: str) -> list[str]:
    """Paths from ``git status --porcelain=v1 -z`` (both sides of renames)."""
    out, items, i = [], z.split("\0"), 0
    while i < len(items):
        item = items[i]
        i += 1
        if len(item) < 4:
            continue
        out.append(item[3:])
        if item[0] in "RC":  # a rename/copy is followed by its source path
            if i < len(items) and items[i]:
                out.append(items[i])
            i += 1
    return out
