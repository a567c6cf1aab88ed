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
# scripts/cpu_report.py sums and ranks. Sandboxed processes are not in it (bwrap re-parents them): the machine-wide
# share scripts/test-all.sh prints per stage is what sees them. Threads of this worker that outlive a test are
# charged to whichever test runs next.
_CPU_LOG = os.environ.get("ENVHUB_TEST_CPU_LOG")
if _CPU_LOG:

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        before = os.times()
        t0 = time.monotonic()
        yield
        after, wall = os.times(), time.monotonic() - t0
        own = (after.user - before.user) + (after.system - before.system)
        kids = (after.children_user - before.children_user) + (after.children_system - before.children_system)
        with open(_CPU_LOG, "a") as log:
            log.write(f"{item.nodeid}\t{own:.2f}\t{kids:.2f}\t{wall:.2f}\n")
