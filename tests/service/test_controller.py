"""The concurrency controller's decisions (issue #26 point 3), pure: AIMD's increase, decrease and hold, its bounds
(the limit never passes the sandbox limit or the staleness gate's largest admission: a random walk of signals checks
it, and fails with the clamp taken out), the oversampling factor following acceptance, and the LLM servers' own
figures read from real vLLM ``/metrics`` text (captured from vLLM 0.32's CPU build serving the tests' tiny model:
``vllm_metrics_busy.txt`` with 4 requests running and 60 waiting under ``--max-num-seqs 4``, ``vllm_metrics_idle.txt``
at rest)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from envhub.rollout.staleness import StalenessGate
from envhub.service.controller import AIMD, Knobs, Signals, gate_ceiling, oversampling_factor, parse_server_metrics

pytestmark = pytest.mark.timeout(30)
HERE = Path(__file__).parent


def room(in_flight: int, **kw) -> Signals:
    """A server with an empty queue and every slot in use."""
    return Signals(in_flight=in_flight, waiting=0, running=in_flight, **kw)


def queued(in_flight: int, waiting: int, **kw) -> Signals:
    return Signals(in_flight=in_flight, waiting=waiting, running=in_flight - waiting, **kw)


# ---- increase ----------------------------------------------------------------------------------------------------
def test_slow_start_doubles_then_additive_increase_after_the_first_cut():
    c = AIMD(Knobs(start=4, max=100, step=2, patience=1))
    seen = []
    for _ in range(3):
        d = c.decide(room(c.limit))
        seen.append((d.action, d.new))
    assert seen == [("increase", 8), ("increase", 16), ("increase", 32)]
    d = c.decide(queued(32, 20))  # 20 waiting > 0.5 x 12 running
    assert (d.action, d.new, d.signal) == ("decrease", 22, "queue") and "x0.7" in d.reason
    assert not c.slow_start
    d = c.decide(room(22))
    assert (d.action, d.new) == ("increase", 24)  # additive now: +step


def test_no_increase_while_the_limit_does_not_bind_or_at_the_ceiling():
    c = AIMD(Knobs(start=8, max=16))
    d = c.decide(room(5))  # 5 of 8 slots used: the client sends less, more slots would not help
    assert (d.action, d.new, d.signal) == ("hold", 8, "bind")
    c.decide(room(8))
    d = c.decide(room(16))
    assert (d.action, d.new, d.signal) == ("hold", 16, "ceiling")


def test_a_small_queue_is_the_band_where_it_holds():
    c = AIMD(Knobs(start=10))
    d = c.decide(queued(10, 3))  # 3 waiting for 7 running: above 0.1 x, below 0.5 x
    assert (d.action, d.new) == ("hold", 10) and d.reason.startswith("in band")


def test_no_signal_means_no_move():
    c = AIMD(Knobs(start=4))
    d = c.decide(Signals(in_flight=4))
    assert (d.action, d.new, d.signal) == ("hold", 4, "none")


# ---- decrease ----------------------------------------------------------------------------------------------------
def test_a_queue_must_persist_for_patience_ticks():
    c = AIMD(Knobs(start=20, patience=2))
    d = c.decide(queued(20, 15))  # one tick: could be a burst
    assert (d.action, d.signal) == ("hold", "queue") and "for 1 of 2 ticks" in d.reason
    d = c.decide(queued(20, 15))
    assert (d.action, d.new) == ("decrease", 14) and "for 2 ticks" in d.reason
    c2 = AIMD(Knobs(start=20, patience=2))
    c2.decide(queued(20, 15))
    c2.decide(queued(20, 2))  # the queue went away: the count starts again
    assert c2.decide(queued(20, 15)).action == "hold"


def test_kv_cache_full_or_preemptions_cut_at_once():
    c = AIMD(Knobs(start=20))
    d = c.decide(Signals(in_flight=20, kv_usage=0.95, waiting=0, running=20))
    assert (d.action, d.new, d.signal) == ("decrease", 14, "kv") and "95%" in d.reason
    d = c.decide(Signals(in_flight=14, kv_usage=0.5, preempted=3, waiting=0, running=14))
    assert (d.action, d.new, d.signal) == ("decrease", 9, "preemption")
    d = c.decide(Signals(in_flight=9, kv_usage=0.7, waiting=0, running=9))  # between kv_low and kv_high
    assert d.action == "hold" and d.signal == "kv"
    d = c.decide(Signals(in_flight=9, kv_usage=0.3, waiting=0, running=9))
    assert (d.action, d.new) == ("increase", 10)


def test_no_second_cut_while_the_first_drains():
    c = AIMD(Knobs(start=20, patience=1))
    assert c.decide(queued(20, 15)).new == 14
    d = c.decide(queued(19, 14))  # 19 still in flight above the limit 14: the cut has not taken effect yet
    assert (d.action, d.new) == ("hold", 14) and "draining" in d.reason
    assert c.decide(queued(14, 10)).new == 9  # drained, still saturated: cut again


def test_never_below_the_floor():
    c = AIMD(Knobs(start=3, min=2, patience=1))
    assert c.decide(queued(3, 3)).new == 2
    d = c.decide(queued(2, 2))
    assert (d.action, d.new) == ("hold", 2) and "floor" in d.reason


# ---- bounds ------------------------------------------------------------------------------------------------------
def test_a_ceiling_that_drops_below_the_limit_clamps_it_at_once():
    c = AIMD(Knobs(start=32, max=64))
    d = c.decide(room(32, gate_limit=10))
    assert (d.action, d.new, d.signal) == ("clamp", 10, "ceiling") and "staleness gate" in d.reason
    d = c.decide(room(32, gate_limit=10, sandbox_limit=6))
    assert (d.action, d.new) == ("clamp", 6) and "sandbox limit" in d.reason


def test_gate_ceiling_is_the_most_the_gate_ever_admits():
    assert gate_ceiling(StalenessGate().status()) is None
    assert gate_ceiling(StalenessGate(max_concurrent=12).status()) == 12
    assert gate_ceiling(StalenessGate(max_staleness=1, batch_size=8).status()) == 16  # (eta + 1) x B
    assert gate_ceiling(StalenessGate(max_staleness=2, batch_size=8, max_concurrent=20).status()) == 20
    # a replica's share, not the global figure (AReaL#1396: divided once, by the gate)
    assert gate_ceiling(StalenessGate(max_staleness=0, batch_size=8, replicas=2, replica=1).status()) == 4
    # what the gate really admits at once matches: fill a fresh gate with leases until it refuses
    gate = StalenessGate(max_staleness=1, batch_size=4, max_concurrent=7)
    n = 0
    while gate.try_acquire() is not None:
        n += 1
    assert n == gate_ceiling(gate.status()) == 7


def random_walk(seed: int, ticks: int = 3000) -> list[str]:
    """Random signals (queues, KV, preemptions, bounds that move); returns every tick where the limit left
    ``[1, min(max, sandbox limit, gate)]``."""
    rng = random.Random(seed)
    c = AIMD(Knobs(start=4, max=200, patience=1, step=3))
    sandbox, gate = 50, None
    bad = []
    for i in range(ticks):
        if rng.random() < 0.05:
            sandbox = rng.choice([8, 20, 50, 120])
        if rng.random() < 0.05:
            gate = rng.choice([None, 5, 16, 40])
        in_flight = rng.randint(0, c.limit + 5)
        s = Signals(in_flight=in_flight, waiting=rng.choice([0, 0, 0, rng.randint(0, 40)]),
                    running=max(1, in_flight), kv_usage=rng.choice([None, rng.random()]),
                    preempted=int(rng.random() < 0.02), sandbox_limit=sandbox, gate_limit=gate)
        d = c.decide(s)
        top = min(x for x in (200, sandbox, gate) if x is not None)
        if not 1 <= d.new <= top:
            bad.append(f"tick {i}: limit {d.new} outside [1, {top}] ({d.action}: {d.reason})")
    return bad


def test_the_limit_never_passes_the_sandbox_limit_or_the_gate():
    for seed in range(5):
        assert random_walk(seed) == []


def test_break_it_without_the_clamp_the_walk_passes_the_bounds(monkeypatch):
    # the clamp is AIMD.ceiling (every bound in one place); without it the limit grows past the sandbox limit
    monkeypatch.setattr(AIMD, "ceiling", lambda self, s: (self.knobs.max, "max"))
    bad = [b for seed in range(5) for b in random_walk(seed)]
    assert bad, "the walk stayed inside the bounds with the clamp removed: the check cannot fail"


# ---- oversampling ------------------------------------------------------------------------------------------------
def test_oversampling_follows_acceptance():
    assert oversampling_factor(None) is None
    assert oversampling_factor(1.0) == 1.2
    assert oversampling_factor(0.4) == pytest.approx(3.0)
    assert oversampling_factor(0.05) == 8.0 and oversampling_factor(0.0) == 8.0  # capped
    c = AIMD(Knobs())
    d = c.oversample(0.5)
    assert d is not None and (d.action, d.oversampling, d.signal) == ("oversample", 2.4, "acceptance")
    assert "acceptance 50%" in d.reason
    assert c.oversample(0.48) is None  # 2.5 is within 10 % of 2.4: not a decision
    d = c.oversample(0.2)
    assert d is not None and c.oversampling == 6.0
    assert c.oversample(None) is None and c.oversampling == 6.0  # nothing measured: kept


def test_bad_knobs_are_refused_naming_them():
    for kw, name in (({"beta": 1.5}, "beta"), ({"growth": 1.0}, "growth"), ({"start": 0}, "start"),
                     ({"max": 0}, "max"), ({"queue_low": 0.9, "queue_high": 0.5}, "queue_low"),
                     ({"kv_high": 1.5}, "kv_low")):
        with pytest.raises(ValueError, match=name):
            Knobs(**kw)


# ---- the servers' figures ----------------------------------------------------------------------------------------
def test_parses_real_vllm_metrics():
    busy = parse_server_metrics((HERE / "vllm_metrics_busy.txt").read_text())
    assert busy == {"running": 4.0, "waiting": 60.0, "kv_usage": pytest.approx(0.0010987669393236477),
                    "preemptions": 0.0}
    idle = parse_server_metrics((HERE / "vllm_metrics_idle.txt").read_text())
    assert idle == {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0, "preemptions": 0.0}
    # and the controller reads the busy server as saturated: 60 waiting for 4 running
    c = AIMD(Knobs(start=64, patience=1))
    d = c.decide(Signals(in_flight=64, **{k: busy[k] for k in ("waiting", "running", "kv_usage")}))
    assert d.action == "decrease" and "60.0 waiting" in d.reason


def test_several_engines_and_the_older_names():
    text = (HERE / "vllm_metrics_busy.txt").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith(("vllm:num_requests_waiting{", "vllm:kv_cache_usage_perc{",
                                                               "vllm:num_requests_running{"))]
    # a second engine (data parallel): the same samples under engine="1", with other values
    more = [ln.replace('engine="0"', 'engine="1"').rsplit(" ", 1)[0] + f" {v}" for ln, v in zip(lines, (3, 7, 0.5))]
    two = text.replace(lines[-1], lines[-1] + "\n" + "\n".join(more))
    got = parse_server_metrics(two)
    assert got["waiting"] == 60 + 7 and got["running"] == 4 + 3 and got["kv_usage"] == 0.5  # sums; the fullest
    # vLLM's older engine called the KV gauge gpu_cache_usage_perc
    old = text.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert parse_server_metrics(old)["kv_usage"] == pytest.approx(0.0010987669393236477)


def test_text_that_is_not_prometheus_is_a_clear_error():
    with pytest.raises(ValueError):
        parse_server_metrics("<html>502 Bad Gateway</html>\n")
    assert parse_server_metrics("# nothing here\n") == {}
