"""``envhub.astguard``: ``ast.parse`` takes turns across threads on the CPython versions whose AST constructor keeps
its depth counter per interpreter (a re-grade once crashed with ``SystemError: AST constructor recursion depth
mismatch`` while another grader thread parsed). The race itself needs a collection at the wrong allocation and
cannot be forced; what is tested is that the guard is in place wherever verifiers run and that it serialises."""
from __future__ import annotations

import ast
import threading
import time

import pytest

import envhub.verifier  # noqa: F401  (importing it installs the guard)
from envhub import astguard

pytestmark = pytest.mark.timeout(60)


def overlap(monkeypatch, parse) -> int:
    """The most ``ast.parse`` calls inside the parser at once, over 4 threads calling ``parse``."""
    inside, most, lock = [0], [0], threading.Lock()

    def slow_original(*args, **kwargs):
        with lock:
            inside[0] += 1
            most[0] = max(most[0], inside[0])
        time.sleep(0.02)  # a construction long enough for the threads to meet
        with lock:
            inside[0] -= 1
        return ast.Expression(body=ast.Constant(0))

    monkeypatch.setattr(astguard, "_ORIGINAL", slow_original)
    threads = [threading.Thread(target=lambda: [parse("1+2", mode="eval") for _ in range(5)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return most[0]


@pytest.mark.skipif(not astguard.NEEDED, reason="this interpreter's AST constructor is thread-safe")
def test_importing_the_verifier_module_puts_the_guard_in_place():
    assert ast.parse is astguard.guarded_parse
    assert astguard.install() is True  # idempotent
    assert ast.parse("(1 + 2) * 3", mode="eval").body.op.__class__ is ast.Mult  # still the real parser


def test_guarded_parses_take_turns(monkeypatch):
    assert overlap(monkeypatch, astguard.guarded_parse) == 1


def test_break_it_unguarded_parses_overlap(monkeypatch):
    assert overlap(monkeypatch, lambda *a, **k: astguard._ORIGINAL(*a, **k)) > 1


def test_a_parse_inside_a_parse_on_the_same_thread_does_not_deadlock(monkeypatch):
    """A finalizer run by the collector mid-construction may parse in the thread holding the lock."""
    real = astguard._ORIGINAL
    nested: list = []

    def reentrant(*args, **kwargs):
        if not nested:
            nested.append("entered")
            nested.append(astguard.guarded_parse("4", mode="eval"))  # in the thread that holds the lock
        return real(*args, **kwargs)

    monkeypatch.setattr(astguard, "_ORIGINAL", reentrant)
    done = []
    t = threading.Thread(target=lambda: done.append(astguard.guarded_parse("1", mode="eval")), daemon=True)
    t.start()
    t.join(10)
    assert done and isinstance(done[0], ast.Expression) and isinstance(nested[1], ast.Expression), \
        "a nested parse on the lock's own thread deadlocked"
