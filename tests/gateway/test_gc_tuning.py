"""The collector of an ``envhub gateway`` process (#28 item 10): start-up's objects frozen, young collections every
10,000 net allocations (``server.tune_gc``) -- and cyclic garbage still collected without anyone asking.

Each check runs in a fresh interpreter: freezing and thresholds are process-wide, and the pytest process must keep
its own collector as it was.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envhub.gateway.server import GC_THRESHOLDS

REPO = Path(__file__).resolve().parents[2]

# what `envhub gateway` sets up before it serves: serving itself is replaced by a report of the collector's state
CLI_CHECK = """
import gc, json, sys
import envhub.gateway.server as server
if sys.argv[1] == "break-it":
    server.tune_gc = lambda *a, **k: None  # the tuning taken away: the check below must see the defaults
def report(*a, **k):
    print(json.dumps({"thresholds": gc.get_threshold(), "frozen": gc.get_freeze_count(), "enabled": gc.isenabled()}))
server.serve_until_stopped = report
from envhub.cli import main
main(["gateway", "--model", "golden", "--policy", "gw_helpers:agent_policy", "--tokenizer", "tiny", "--port", "0"],
     standalone_mode=False)
"""

# cyclic garbage made after tune_gc, each cycle holding 1 KB (say, an error's traceback holding a request's body):
# reclaimed by the collector on its own, never by an explicit gc.collect()
CYCLES_CHECK = """
import gc, json, sys, weakref
from envhub.gateway.server import tune_gc
tune_gc(tuple(json.loads(sys.argv[1])))
class Node:
    pass
refs = []
for i in range(30_000):
    a, b = Node(), Node()
    a.other, b.other, a.payload = b, a, bytes(1024)
    refs.append(weakref.ref(a))
    del a, b
alive = sum(r() is not None for r in refs)
print(json.dumps({"alive": alive, "made": len(refs)}))
"""


def _run(code: str, arg: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, cwd=str(REPO),
                         timeout=120, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_envhub_gateway_serves_with_startup_frozen_and_the_young_threshold_raised():
    state = _run(CLI_CHECK, "check")
    assert state["enabled"] and tuple(state["thresholds"]) == GC_THRESHOLDS
    assert state["frozen"] > 10_000  # the modules and the tokenizer: nothing a later collection traverses again


@pytest.mark.timeout(150)
@pytest.mark.slow
def test_break_it_without_the_tuning_the_check_sees_the_defaults():
    state = _run(CLI_CHECK, "break-it")
    assert tuple(state["thresholds"]) != GC_THRESHOLDS and state["frozen"] == 0


@pytest.mark.timeout(120)
def test_cyclic_garbage_is_still_collected_on_its_own():
    state = _run(CYCLES_CHECK, json.dumps(GC_THRESHOLDS))
    # at most the cycles made since the last young collection are alive: one threshold's worth (2 objects each)
    assert state["alive"] <= GC_THRESHOLDS[0], state


@pytest.mark.timeout(120)
def test_break_it_automatic_collection_off_keeps_every_cycle():
    state = _run(CYCLES_CHECK, json.dumps([0, 10, 10]))  # threshold 0: the collector never runs by itself
    assert state["alive"] == state["made"]
