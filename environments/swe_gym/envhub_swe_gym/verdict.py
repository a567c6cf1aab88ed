"""Host side of the grader's verdict channel: secrets, canaries, and reading back authenticated records.

The grader runs pytest through :mod:`envhub_swe_gym.verdict_runner` with a secret on stdin (HMAC key, run id,
records path); only records whose MAC checks out count, and nothing the test process prints is ever read for a
verdict. A test passes when its setup, call and teardown passed **and** its body reached its end (a ``body-end``
record written from inside the test function). Canaries — tests with random, ordinary-looking names planted at
random places in the test files — must fail.
"""
from __future__ import annotations

import ast
import hashlib
import hmac
import json
import random
import secrets
from dataclasses import dataclass, field

VOCABULARY = ("basic", "empty", "edge", "roundtrip", "unicode", "large", "negative", "nested", "default", "repeat",
              "single", "mixed", "order", "bounds", "invalid", "simple", "regression", "values", "cases", "zero")


@dataclass
class RunSecret:
    """What one run is told on stdin (and nothing else in the sandbox knows)."""

    run: str
    key: str
    out: str

    def payload(self, rootdir: str, files: list[str], truth: bool = True, audit: bool = True,
                unittest: bool = True, sources: dict[str, str] | None = None, memory: bool = True,
                dry_run: bool = True) -> str:
        """The JSON the runner reads: the test files (relative to ``rootdir``) it compiles before any code under
        test runs, and their text (``sources``: the grader empties them on disk; a file without one is read from
        disk). ``truth=False`` (no truth checks), ``audit=False`` (nothing refused), ``unittest=False``,
        ``memory=False`` (the compiled tests readable) and ``dry_run=False`` (test bodies run by anyone) switch
        defenses off, only so tests can show what each one stops."""
        return json.dumps({"run": self.run, "key": self.key, "out": self.out, "rootdir": rootdir, "files": files,
                           "truth": truth, "audit": audit, "unittest": unittest, "sources": sources or {},
                           "memory": memory, "dry_run": dry_run})


def new_secret() -> RunSecret:
    return RunSecret(run=secrets.token_hex(8), key=secrets.token_hex(32), out=f"/tmp/.{secrets.token_hex(8)}")


def identifier(rng: random.Random) -> str:
    return "_" + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(10))


@dataclass
class RunRecords:
    """The verified records of one run: outcome per (nodeid, phase), and whether pytest reached its end."""

    outcomes: dict[tuple[str, str], str] = field(default_factory=dict)
    finished: bool = False
    tampering: list[str] = field(default_factory=list)  # what the audit hook refused
    instrumented: set[str] = field(default_factory=set)  # test modules (absolute paths) the runner instrumented
    body_ends: set[str] = field(default_factory=set)  # tests whose body ran to its end
    rejected: int = 0  # lines whose MAC, run id or sequence number did not check out
    confinement: str = ""  # how the runner kept the test process out of /proc ("landlock-abi-N" or "none: why")

    def passed(self, nodeid: str) -> bool:
        return all(self.outcomes.get((nodeid, w)) == "passed" for w in ("setup", "call", "teardown"))

    def status(self, nodeid: str) -> str:
        """A SWE-bench-like status word for reports."""
        if self.passed(nodeid):
            return "PASSED"
        phases = [self.outcomes.get((nodeid, w)) for w in ("setup", "call", "teardown")]
        if phases[0] is None:
            return "MISSING"
        if "skipped" in phases:
            return "SKIPPED"
        if "xfail" in phases:
            return "XFAIL"
        if phases[0] == "failed" or phases[2] == "failed":
            return "ERROR"
        return "FAILED"


def read_records(text: str, secret: RunSecret) -> RunRecords:
    """Keep the lines authenticated with ``secret``'s key, from this run, in sequence; a gap ends the read.

    Taken in the order of their sequence numbers, not of the file: two threads' records may land in either order."""
    out, key, records = RunRecords(), bytes.fromhex(secret.key), {}
    for line in text.splitlines():
        body, _, mac = line.rpartition(" ")
        good = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
        try:
            run, n, nodeid, when, outcome = json.loads(body) if hmac.compare_digest(mac, good) else (None,) * 5
        except (ValueError, TypeError):
            run = n = None
        if run != secret.run or type(n) is not int or n in records:
            out.rejected += 1
            continue
        records[n] = (nodeid, when, outcome)
    seq = 0
    while seq in records:
        nodeid, when, outcome = records.pop(seq)
        seq += 1
        if when == "end":
            out.finished = True
            continue
        if when == "tamper":
            out.tampering.append(outcome)
            continue
        if when == "confine":
            out.confinement = outcome
            continue
        if when == "instrumented":
            out.instrumented.add(nodeid)
            continue
        if when == "body-end":
            out.body_ends.add(nodeid)
            continue
        previous = out.outcomes.get((nodeid, when))
        if previous is None or previous == "passed":  # a phase recorded twice: anything but a pass wins
            out.outcomes[(nodeid, when)] = outcome
    out.rejected += len(records)  # past a gap
    return out


# ---- canaries ---------------------------------------------------------------------------------------------------
CANARY_BODIES = (
    "    value = {a}\n    assert value * 2 == {b}\n",
    "    items = [{a}, {b}]\n    assert sorted(items)[0] == {b}\n",
    "    text = str({a})\n    assert text == \"{b}\"\n",
    "    total = sum(range({a} % 97))\n    assert total == {b} * 10007 + 1\n",
    "    result = {{\"n\": {a}}}\n    assert result[\"n\"] == {b}\n",
)


def canary_name(rng: random.Random, taken: set[str], words: list[str]) -> str:
    """A test name built like the file's own: ``test_`` + words seen in its test names or common test words."""
    pool = [w for w in words if w.isidentifier() and w.islower()] or list(VOCABULARY)
    while True:
        parts = rng.sample(pool, k=min(len(pool), rng.randint(1, 2))) + [rng.choice(VOCABULARY)]
        name = "test_" + "_".join(parts)
        if name not in taken:
            taken.add(name)
            return name


def plant_canaries(source: str, rng: random.Random, count: int) -> tuple[str, list[str]]:
    """``source`` with ``count`` failing tests inserted between random top-level statements; and their names."""
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    try:
        tree = ast.parse(source)
        stmts = tree.body
    except (SyntaxError, ValueError):
        stmts = []
    taken = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                               ast.ClassDef))} if stmts else set()
    words = sorted({w for n in taken if n.startswith("test_") for w in n[5:].split("_") if len(w) > 2})
    # after the imports at the top (a canary must not sit above a ``from __future__`` import), else anywhere
    first = next((i for i, s in enumerate(stmts) if not isinstance(s, (ast.Import, ast.ImportFrom, ast.Expr))),
                 len(stmts))
    slots = sorted({stmts[i].end_lineno or 0 for i in range(max(first - 1, 0), len(stmts))}) or [len(lines)]
    inserts: dict[int, list[str]] = {}
    names = []
    for _ in range(count):
        name = canary_name(rng, taken, words)
        a = rng.randrange(10**5, 10**6)
        body = rng.choice(CANARY_BODIES).format(a=a, b=a * 3 + rng.randrange(1, 10**4))
        inserts.setdefault(rng.choice(slots), []).append(f"\n\ndef {name}():\n{body}")
        names.append(name)
    out = []
    if 0 in inserts:
        out += inserts.pop(0)
    for i, line in enumerate(lines, start=1):
        out.append(line)
        out += inserts.pop(i, [])
    for rest in inserts.values():
        out += rest
    return "".join(out), names
