"""Shared fixtures: real tokenizers and a real tiny model, built offline once per session."""
import json
import os
from pathlib import Path

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


# ---- scheduling: longest first, the heaviest in two lanes --------------------------------------------------------
# `make test` runs the suite under pytest-xdist (`--dist loadgroup --no-loadscope-reorder`): workers take one test at
# a time, in collection order. Two rules, from measuring the suite on 2 cores:
# * longest first (the longest-processing-time rule): a 5-minute admission starts at once instead of being the last
#   thing running while the other workers idle;
# * the heaviest tests (>= HEAVY_S) in two lanes (xdist groups, one worker each, balanced by duration): they are
#   CPU-bound (model forwards, many sandboxes, many CLI start-ups), and several at once on 2 cores each ran 2-5x
#   slower, some past their time limits; the other workers meanwhile run the many light tests that mostly wait.
# `tests/durations.json` holds the last measured durations (setup + call + teardown, seconds, tests over 0.5 s);
# refresh it with `pytest --store-durations ...`. A test not in it counts as 0.1 s. Only scheduling changes: every
# test still runs, and no test depends on another's order.
_DURATIONS = Path(__file__).with_name("durations.json")
HEAVY_S = 20.0
HEAVY_LANES = 2


def pytest_addoption(parser):
    parser.addoption("--store-durations", action="store_true",
                     help="write the measured duration of every test run into tests/durations.json (merged)")


def pytest_collection_modifyitems(config, items):
    try:
        known = json.loads(_DURATIONS.read_text())
    except (OSError, ValueError):
        return
    cost = {id(item): known.get(item.nodeid, 0.1) for item in items}
    position = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (-cost[id(item)], position[id(item)]))
    lanes = [0.0] * HEAVY_LANES
    for item in items:
        if cost[id(item)] < HEAVY_S or item.get_closest_marker("xdist_group"):
            continue
        lane = lanes.index(min(lanes))
        lanes[lane] += cost[id(item)]
        item.add_marker(pytest.mark.xdist_group(f"heavy-{lane}"))


_measured: dict[str, float] = {}


def pytest_runtest_logreport(report):
    _measured[report.nodeid] = _measured.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session):
    config = session.config
    if not config.getoption("--store-durations") or hasattr(config, "workerinput"):
        return  # under xdist the controller sees every worker's reports and writes once
    try:
        known = json.loads(_DURATIONS.read_text())
    except (OSError, ValueError):
        known = {}
    known.update({k: round(v, 1) for k, v in _measured.items()})
    keep = {k: v for k, v in sorted(known.items()) if v >= 0.5}
    _DURATIONS.write_text(json.dumps(keep, indent=0, sort_keys=True) + "\n")
