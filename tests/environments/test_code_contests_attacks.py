"""code-contests (#13): can a submission write its own verdict? The grader runs every test as a new process and
compares stdout on the host, so the attacks left are on what the grader *measures*: CPU time split across forked
processes (each gets a fresh ``RLIMIT_CPU``), processes that outlive the test, the exit status, stderr, and huge
outputs. Each attack is a real submission graded in a real sandbox."""
from __future__ import annotations

import pytest

import envhub
from envhub_code_contests.grader import grade
from envhub_code_contests.grader import tests_of as all_tests_of

# Each of ``hops`` processes in turn burns ``burn`` CPU seconds, then forks the next and waits for it (a waiting
# parent uses no CPU), so no single process reaches the 2 s RLIMIT_CPU; the last one prints the right answer. The
# process the grader started exits last, with the chain's status, so the output is all there.
FORK_CHAIN = """
import os
import time

for hop in range({hops}):
    t = time.process_time()
    while time.process_time() - t < {burn}:
        pass
    pid = os.fork()
    if pid:
        os._exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


@pytest.fixture(scope="module")
def rows():
    return {r["task_id"]: dict(r) for r in envhub.get_spec("code-contests").load_tasks("test")}


def one_test(task: dict) -> dict:
    """The task with only its first public test (these attacks cost seconds of CPU per test)."""
    group, _, inp, exp = all_tests_of(task)[0]
    empty = {"input": [], "output": []}
    return {**task, "public_tests": {"input": [inp], "output": [exp]}, "private_tests": empty,
            "generated_tests": empty}


def golden(task: dict) -> str:
    return task["solutions"]["solution"][0]


@pytest.mark.slow  # ~5 s of CPU burnt on purpose
def test_cpu_time_split_across_forked_processes_is_counted(rows):
    task = one_test(rows["cc-sum-of-pairs"])
    honest = grade(task, FORK_CHAIN.format(hops=1, burn=0.2) + golden(task))
    assert honest["passed"], honest["reason"]  # forking itself is allowed, and the answer is right
    g = grade(task, FORK_CHAIN.format(hops=3, burn=1.2) + golden(task))
    assert not g["passed"] and g["results"][-1]["verdict"] == "TLE", g["reason"]


@pytest.mark.slow  # waits for the 8 s wall clock
def test_a_process_left_running_after_the_answer_is_a_time_limit(rows):
    task = one_test(rows["cc-sum-of-pairs"])
    daemon = ("import os\nimport sys\nimport time\n" + golden(task) + "\nsys.stdout.flush()\n"
              "if os.fork() == 0:\n    os.setsid()\n    os.close(1)\n    os.close(2)\n    time.sleep(60)\n")
    g = grade(task, daemon)
    assert not g["passed"] and g["results"][-1]["verdict"] == "TLE", g["reason"]


@pytest.mark.parametrize("tail, verdict", [
    ("import sys\nsys.stdout.flush()\nsys.exit(1)\n", "RE"),  # right answer, non-zero exit
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "RE"),
])
def test_exit_status_after_a_right_answer_still_counts(rows, tail, verdict):
    task = one_test(rows["cc-sum-of-pairs"])
    g = grade(task, golden(task) + "\n" + tail)
    assert g["results"][-1]["verdict"] == verdict, g["reason"]


def test_answer_on_stderr_or_huge_output_does_not_pass(rows):
    task = one_test(rows["cc-sum-of-pairs"])
    on_stderr = "import sys\nsys.stdout = sys.stderr\n" + golden(task)
    assert grade(task, on_stderr)["results"][-1]["verdict"] == "WA"
    flood = golden(task) + "\nimport sys\nsys.stdout.write('0 ' * (8 << 20))\n"
    g = grade(task, flood)
    assert g["results"][-1]["verdict"] == "OLE", g["reason"]
    both = golden(task) + "\nimport sys\nsys.stderr.write('x' * (8 << 20))\n"
    g = grade(task, both)  # stderr is never compared; a flood there is over the output cap too, not a crash
    assert g["results"][-1]["verdict"] == "OLE", g["reason"]
