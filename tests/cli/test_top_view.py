"""The screen of ``envhub top`` as a pure function (rows in, lines out): lines fit the width with colour codes kept
whole, a dead replica and a server with metrics off say so, and the figures print the way a person reads them."""
from __future__ import annotations

import re

import pytest

from envhub.cli.top_view import RESET, cut, num, pct, render, secs, visible_len
from envhub.rollout.live import row_of, total

pytestmark = pytest.mark.timeout(30)


def test_cut_counts_visible_columns_and_never_splits_a_colour_code():
    s = "\x1b[1mbold\x1b[0m plain \x1b[31mred text\x1b[0m"
    for width in range(0, visible_len(s) + 3):
        out = cut(s, width)
        assert visible_len(out) == min(width, visible_len(s))
        assert not re.search(r"\x1b\[[0-9;]*$", out)  # no half escape at the end
        if "\x1b[" in out and visible_len(s) > width:
            assert out.endswith(RESET)  # a cut inside a colour resets it


def test_numbers_read_as_a_person_reads_them():
    assert [num(None), num(3), num(3.0), num(2.345), num(12.34), num(123.4), num(2500.0), num(0.004)] == \
        ["-", "3", "3", "2.35", "12.3", "123", "2500", "0.004"]
    assert num(2512.7) == "2.5k" and num(float("nan")) == "-"
    assert [secs(None), secs(0.00006), secs(0.123), secs(2.5), secs(250)] == ["-", "0.06ms", "123ms", "2.50s", "250s"]
    assert pct(0.256) == "26%" and pct(None) == "-"


def test_a_dead_replica_and_a_server_without_metrics_are_named_not_zeros():
    down = row_of({"url": "http://h:1", "t": 0.0, "kind": "down", "error": "ConnectionRefusedError: refused"})
    off = row_of({"url": "http://h:2", "t": 0.0, "kind": "service", "body": {"status": "running", "stages": {
        "run": {"queued": 2, "in_flight": 1}}}})
    lines = render([down, off], total([down, off]), width=200)
    text = "\n".join(lines)
    assert "h:1" in text and "DOWN  ConnectionRefusedError: refused" in text
    assert "metrics are off on this server" in text
    assert "2 replica(s), 1 down" in lines[0]
    assert "no rollout service reported throughput figures" in text
    assert all(visible_len(ln) <= 60 for ln in render([down, off], total([down, off]), width=60))


def test_an_answer_of_an_unexpected_shape_is_a_down_row_not_a_crash():
    from envhub.rollout.livepoll import _row

    odd = {"url": "http://h:3", "t": 0.0, "kind": "service", "body": {"stages": {"run": 5}, "throughput": {}}}
    row = _row(odd, None)
    assert row["kind"] == "down" and row["error"].startswith("unreadable service answer: AttributeError")
    assert "DOWN  unreadable" in "\n".join(render([row], total([row])))


def test_bars_fall_back_to_ascii_off_a_utf8_terminal():
    row = {"url": "http://h:4", "t": 0.0, "kind": "service", "production_rate": 1.0, "trainer_idle_ratio": 0.5,
           "generator_idle_ratio": 0.0}
    lines = render([row], total([row]), unicode=False)
    assert "###...  50%" in lines[2] and "█" not in "\n".join(lines)
    assert "███░░░  50%" in render([row], total([row]))[2]
