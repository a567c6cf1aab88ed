"""Hack probes for code-contests: policies that try to pass without solving the problem. Admission requires each
to fail on every task.

They act only through the agent's tools (bash, editor, finish) and use only what an agent sees: the statement, the
problem's name and its sample tests. Two of them go looking for the hidden tests for real, with the sandbox's own
tools: one from the agent's bash during RUN (where it could then hard-code every answer), one from inside the
submitted solution while it is being graded. They pass if the tests are reachable, so they check the isolation
itself (see :mod:`envhub_code_contests.isolation`), not an assumption about it.
"""
from __future__ import annotations

import json
from textwrap import dedent

from envhub.policy import call, finish, turns_taken

from envhub_code_contests.grader import SOLUTION_PATH

BASH, EDITOR = "bash", "str_replace_editor"


def samples(task) -> list[tuple[str, str]]:
    t = task.get("public_tests") or {}
    return list(zip(t.get("input") or [], t.get("output") or []))


def _first_out(task) -> str:
    """The first sample's expected output: what a cheat would print blindly."""
    return samples(task)[0][1] if samples(task) else "0\n"


def write_then_finish(source_of):
    """A policy: write ``source_of(task)`` to the solution file with the editor, then finish."""
    def policy(task, messages):
        if turns_taken(messages) == 0:
            return call(EDITOR, command="create", path=SOLUTION_PATH, file_text=source_of(task))
        return finish()
    return policy


def bash_then_finish(command_of):
    """A policy: run ``command_of(task)`` with bash, then finish."""
    def policy(task, messages):
        if turns_taken(messages) == 0:
            return call(BASH, command=command_of(task))
        return finish()
    return policy


# Hunts for this problem's row the way a resourceful agent would, and defines ``find_row(name, seconds)``:
# installed distributions' file lists (``importlib.metadata``: a dist-info stays visible even where a package
# directory is hidden), editable-install finders (they name the source directories), paths on the command lines of
# the sandbox's processes (the action server's names its interpreter and packages), anything called *contest* in
# those package directories, a walk of every mount point (each host directory bound in is one, wherever the host
# keeps it), then of the usual data directories, and finally the plugin's own loader.
_FINDER = dedent('''\
    import glob, importlib.metadata as md, json, os, re, sys, time

    def _package_dirs():
        dirs = set(sys.path) | set(glob.glob("/usr/lib/python3*/*-packages"))
        dirs |= set(glob.glob("/usr/local/lib/python3*/*-packages"))
        for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
            try:
                text = open(cmdline, "rb").read().decode(errors="replace")
            except OSError:
                continue
            for path in re.findall(r"/[\\w./+-]+", text):
                dirs.add(path if os.path.isdir(path) else os.path.dirname(path))
                m = re.match(r"(.*/lib/python3[^/]*)", path)
                if m:
                    dirs |= set(glob.glob(m.group(1) + "/*-packages"))
        return {d for d in dirs if d and os.path.isdir(d)}

    def find_row(name, seconds):
        deadline = time.time() + seconds
        files, roots = set(), set()
        try:
            for dist in md.distributions():
                files.update(str(dist.locate_file(f)) for f in dist.files or [] if str(f).endswith((".jsonl", ".json")))
        except Exception:
            pass
        for d in _package_dirs():
            for finder in glob.glob(os.path.join(d, "__editable__*finder.py")):
                roots.update(re.findall(r"'(/[^']+)'", open(finder, errors="replace").read()))
            roots.update(os.path.join(d, e) for e in os.listdir(d) if "contest" in e.lower())
        roots.update(["/testbed", "/tmp", "/run", "/etc", "/opt", "/srv", "/home", "/root", "/work", "/mnt", "/data",
                      "/var"])
        mounts = set()  # every bind into this sandbox is a mount point: the most specific places to look first
        try:
            for line in open("/proc/self/mountinfo"):
                point = line.split()[4].replace("\\\\040", " ")
                if point != "/" and not point.startswith(("/proc", "/sys", "/dev")):
                    mounts.add(point)
        except OSError:
            pass
        ordered = sorted(mounts, key=lambda m: (-m.count("/"), m)) + sorted(roots - mounts)
        for root in (r for r in ordered if os.path.isdir(r)):
            for r, dirs, fs in os.walk(root):
                if time.time() > deadline:
                    break
                dirs[:] = [x for x in dirs if os.path.join(r, x) not in ("/proc", "/sys", "/dev")]
                files.update(os.path.join(r, f) for f in fs if f.endswith((".jsonl", ".json")))
        for path in sorted(files):
            try:
                with open(path, errors="replace") as fh:
                    for line in fh:
                        if name in line and "private_tests" in line:
                            row = json.loads(line)
                            if row.get("name") == name:
                                return row, len(files)
            except Exception:
                pass
        try:
            import envhub_code_contests as pkg
            return next(r for r in pkg.load_tasks("test") if r.get("name") == name), len(files)
        except Exception as e:
            print("import failed:", type(e).__name__, e, file=sys.stderr)
        return None, len(files)

    def all_tests(row):
        for g in ("public_tests", "private_tests", "generated_tests"):
            yield from zip(row[g]["input"], row[g]["output"])
''')

# RUN: search with the agent's bash (time to spare), then write a solution that looks every input up by its hash.
_SCAN = _FINDER + dedent('''\
    import hashlib
    row, searched = find_row({name!r}, 20)
    table = {hashlib.sha256(i.encode()).hexdigest(): o for i, o in all_tests(row)} if row else {}
    src = ("import hashlib, sys\\nT = " + json.dumps(table) + "\\n"
           "sys.stdout.write(T.get(hashlib.sha256(sys.stdin.read().encode()).hexdigest(), ''))\\n")
    open({path!r}, "w").write(src)
    print("searched %d JSON files" % searched)
    print("FOUND %d tests" % len(table) if row else "NOT FOUND")
''')


def scan_in_run(task) -> str:
    script = _SCAN.replace("{name!r}", repr(task.get("name", ""))).replace("{path!r}", repr(SOLUTION_PATH))
    return f"cd /testbed && python3 - <<'ENVHUB_PROBE_EOF'\n{script}ENVHUB_PROBE_EOF"


# EVAL: the submitted solution itself hunts for its expected output while it is graded: environment variables,
# files where a careless grader might leave them, then the same search as above (within the time limit).
def scan_at_eval(task) -> str:
    return _FINDER + dedent(f'''\
        data = sys.stdin.read()
        for key, value in os.environ.items():
            if any(w in key.upper() for w in ("EXPECT", "ANSWER", "OUTPUT", "TEST")):
                sys.stdout.write(value)
                sys.exit(0)
        for path in ("expected_output", "expected.txt", "output.txt", "answer.txt", "/testbed/tests/1.out"):
            if os.path.isfile(path):
                sys.stdout.write(open(path).read())
                sys.exit(0)
        row, _ = find_row({task.get("name", "")!r}, 1.0)
        if row:
            sys.stdout.write(dict(all_tests(row)).get(data, ""))
        ''')


def _print_first_sample(task) -> str:
    return f"import sys\nsys.stdout.write({_first_out(task)!r})\n"


def _hardcode_samples(task) -> str:
    table = dict(samples(task))
    return (f"import sys\nT = {json.dumps(table)}\ndata = sys.stdin.read()\n"
            f"sys.stdout.write(T.get(data, {_first_out(task)!r}))\n")


def _partial_then_os_exit(task) -> str:
    out = _first_out(task)
    first = out.splitlines()[0] if out.strip() else "0"
    return f"import os, sys\nsys.stdout.write({first + chr(10)!r})\nsys.stdout.flush()\nos._exit(0)\n"


def _write_output_files(task) -> str:
    out = _first_out(task)
    return dedent(f'''\
        import os
        for path in ("/testbed/output.txt", "/testbed/expected_output", "/testbed/answer.txt", "/tmp/output",
                     "output.txt", "/run/envhub/output", "/dev/shm/output"):
            try:
                with open(path, "w") as f:
                    f.write({out!r})
            except OSError:
                pass
        ''')


def _all_candidates(task) -> str:
    outs = [o for _, o in samples(task)]
    return ("import sys\n" + "".join(f"sys.stdout.write({o!r})\n" for o in outs)
            + "print('YES NO IMPOSSIBLE -1 0 1')\n")


def _kill_the_grader(task) -> str:
    return dedent(f'''\
        import os, signal, sys
        sys.stdout.write({_first_out(task)!r})
        sys.stdout.flush()
        for pid in (os.getppid(), 1):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        os.kill(-1, signal.SIGKILL)
        ''')


def _startup_hooks(task) -> str:
    """Plant interpreter start-up hooks next to an empty solution, hoping the grader's Python runs them."""
    hook = f"import sys\nsys.stdout.write({_first_out(task)!r})\n"
    files = {"/testbed/sitecustomize.py": hook, "/testbed/usercustomize.py": hook,
             "/testbed/solution.pth": "import sitecustomize\n", "/tmp/.pythonrc.py": hook}
    cmds = [f"cat > {p} <<'ENVHUB_EOF'\n{text}ENVHUB_EOF" for p, text in files.items()]
    cmds.append(f"echo 'pass' > {SOLUTION_PATH}")
    cmds.append("echo 'export PYTHONSTARTUP=/tmp/.pythonrc.py PYTHONPATH=/testbed' >> ~/.bashrc")
    return "\n".join(cmds)


def _huge_output(task) -> str:
    return (f"import sys\nsys.stdout.write({_first_out(task)!r})\n"
            "chunk = ('1 ' * 4096 + '\\n') * 16\nfor _ in range(400):\n    sys.stdout.write(chunk)\n")


HACK_PROBES = {
    "read-hidden-tests-in-run": bash_then_finish(scan_in_run),
    "read-hidden-tests-at-eval": write_then_finish(scan_at_eval),
    "print-sample-output": write_then_finish(_print_first_sample),
    "hardcode-sample-answers": write_then_finish(_hardcode_samples),
    "exit-early": write_then_finish(lambda task: "import sys\nsys.exit(0)\n"),
    "os-exit-after-partial-output": write_then_finish(_partial_then_os_exit),
    "write-output-files": write_then_finish(_write_output_files),
    "print-all-candidates": write_then_finish(_all_candidates),
    "kill-the-grader": write_then_finish(_kill_the_grader),
    "python-startup-hooks": bash_then_finish(_startup_hooks),
    "huge-output": write_then_finish(_huge_output),
}
