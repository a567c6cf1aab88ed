"""Shared fixtures: real tokenizers and a real tiny model, built offline once per session."""
import os
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_model_path():
    from envhub.testing.models import build_tiny_model

    return build_tiny_model(template="chatml")


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_path):
    from envhub.testing.models import load_tokenizer

    return load_tokenizer(tiny_model_path)


@pytest.fixture(scope="session")
def llama3_tokenizer():
    from envhub.testing.models import build_tiny_model, load_tokenizer

    return load_tokenizer(build_tiny_model(template="llama3"))


# ---- #27: which tests cost the CPU. The main tier is CPU-bound on 2 cores, so wall-clock durations (which include
# waiting for a core) mislead; with ENVHUB_TEST_CPU_LOG=PATH each test's CPU seconds (this process's user+system plus
# the children it reaped: CLI subprocesses, servers) are appended to PATH as tab-separated lines, which
# scripts/cpu_report.py sums and ranks. Sandboxed processes are not among the reaped children (bwrap re-parents
# them), so where the cgroup-v1 cpuacct hierarchy is writable (root in a container) each worker moves itself into
# a cgroup of its own and the log's fifth column is that cgroup's CPU: every process the test started, sandboxes
# included, because a process stays in its parent's cgroup whoever reaps it. Elsewhere the column is "-" and the
# machine-wide share scripts/test-all.sh prints per stage is what sees them. Work of this worker that outlives a
# test is charged to whichever test runs next.
_CPU_LOG = os.environ.get("ENVHUB_TEST_CPU_LOG")
_CPUACCT = "/sys/fs/cgroup/cpuacct"


def _own_cpu_cgroup() -> str | None:
    """Move this process into a cgroup of its own, under the cpuacct cgroup it is in (make test's stage: the
    stage's CPU still counts it); its usage file, or None where that is not allowed."""
    try:
        with open("/proc/self/cgroup") as f:
            here = next(line.rstrip("\n").split(":", 2)[2] for line in f
                        if "cpuacct" in line.split(":", 2)[1].split(","))
        group = os.path.join(_CPUACCT + here, "envhub-tests", str(os.getpid()))
        os.makedirs(group, exist_ok=True)
        with open(os.path.join(group, "cgroup.procs"), "w") as procs:
            procs.write(str(os.getpid()))
        return os.path.join(group, "cpuacct.usage")
    except (OSError, StopIteration):  # not writable, or no cgroup-v1 cpuacct hierarchy at all
        return None


def _cgroup_cpu(usage: str | None) -> float | None:
    if usage is None:
        return None
    with open(usage) as f:
        return int(f.read()) / 1e9


if _CPU_LOG:
    _usage: list[str | None] = []  # this process's cgroup usage file, made at its first test (the xdist controller
    # runs none, so its workers start in the stage's cgroup, not in one of its own)

    def pytest_unconfigure(config):
        """Back to the parent cgroup, and this worker's group removed (kept while a process the tests left runs)."""
        if _usage and _usage[0] is not None:
            group = os.path.dirname(_usage[0])
            try:
                with open(os.path.join(os.path.dirname(os.path.dirname(group)), "cgroup.procs"), "w") as procs:
                    procs.write(str(os.getpid()))
                os.rmdir(group)
                os.rmdir(os.path.dirname(group))  # the last worker out removes envhub-tests
            except OSError:
                pass

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        if not _usage:
            _usage.append(_own_cpu_cgroup())
        before, group_before = os.times(), _cgroup_cpu(_usage[0])
        t0 = time.monotonic()
        yield
        after, wall = os.times(), time.monotonic() - t0
        group_after = _cgroup_cpu(_usage[0])
        own = (after.user - before.user) + (after.system - before.system)
        kids = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        group = "-" if group_before is None or group_after is None else f"{group_after - group_before:.2f}"
        with open(_CPU_LOG, "a") as log:
            log.write(f"{item.nodeid}\t{own:.2f}\t{kids:.2f}\t{wall:.2f}\t{group}\n")
