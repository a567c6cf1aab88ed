"""The verdict runner's checker hook: where the instrumented comparisons and truths are decided (see
:mod:`envhub_swe_gym.verdict_runner`). Standard library only; copied into the sandbox beside the runner.

It holds no secret (the recorder hook does), so it may run the tested code's ``__eq__``/``__bool__``. Every
function here that runs inside the hook is **closure-free and global-free**: what it uses is bound as default
arguments (immutable tuples; the runner's refuser hook refuses replacing ``__code__``/``__defaults__``), so even a
frame of it that reached the tested code would show values it cannot change. It never raises: a verdict or an
error goes back in the caller's box, exceptions with their tracebacks cleared.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import os
import sys
import types
import unittest.mock
import warnings

HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by Python code (or a C extension's heap type)
CONTAINERS = (list, tuple, set, frozenset, dict)
LETTERS = "abcdefghijklmnopqrstuvwxyz"
ANY = unittest.mock.ANY
NON_CALLABLE_MOCK = unittest.mock.NonCallableMock
WRAPPER_DESCRIPTOR = type(object.__init__)
SET_TRACEBACK = BaseException.__dict__["__traceback__"].__set__
SET_CONTEXT = BaseException.__dict__["__context__"].__set__
SET_CAUSE = BaseException.__dict__["__cause__"].__set__
MRO_OF = type.__dict__["__mro__"].__get__
DICT_OF = type.__dict__["__dict__"].__get__
FLAGS_OF = type.__dict__["__flags__"].__get__


class Fresh:
    """An object no honest value equals."""

    __slots__ = ()


def rand(n, _urandom=os.urandom, _from=int.from_bytes):
    return _from(_urandom(4), "little") % n


def scrub(error, _tb=SET_TRACEBACK, _ctx=SET_CONTEXT, _cause=SET_CAUSE):
    """``error`` without its traceback and chain (they hold this hook's frames)."""
    _tb(error, None)
    _ctx(error, None)
    _cause(error, None)
    return error


def twins(v, _rand=rand, _type=type, _bool=bool, _int=int, _float=float, _str=str, _bytes=bytes, _list=list,
          _tuple=tuple, _dict=dict, _set=set, _frozenset=frozenset, _range=range, _len=len, _letters=LETTERS):
    """1-3 values of ``v``'s exact type that honest equality tells apart from ``v`` (none for other types)."""
    t, out = _type(v), []
    for _ in _range(1 + _rand(3)):
        k = 1 + _rand(99991)
        if t is _bool:
            out.append(not v)
        elif t is _int:
            out.append(v + k if _rand(2) else v - k)
        elif t is _float and v == v and v - v == 0:
            out.append(v + k)
        elif t is _str:
            out.append(v + _letters[k % 26] if _rand(2) or not v else v[:-1] + ("z" if v[-1] != "z" else "y"))
        elif t is _bytes:
            out.append(v + _bytes([97 + k % 26]))
        elif t is _list or t is _tuple:
            out.append(v + t([v[_rand(_len(v))] if v and _rand(2) else k]))
        elif t is _dict:
            d = _dict(v)
            d["%s%d" % (_letters[k % 26], k)] = k
            out.append(d)
        elif t is _set or t is _frozenset:
            out.append(t(v) | {k * 1000003})
    return out


def apply(op, a, b, _bool=bool):
    """The truth of ``a <op> b`` (0 ``==``, 1 ``!=``, 2 ``in``, 3 ``not in``, 5 ``<``, 6 ``<=``, 7 ``>``, 8 ``>=``),
    or of ``a`` itself (9): the only place the checker calls into tested code, always from :func:`run`'s one line."""
    return _bool(a if op == 9 else a == b if op == 0 else a != b if op == 1 else a in b if op == 2 else
                 a not in b if op == 3 else a < b if op == 5 else a <= b if op == 6 else a > b if op == 7 else a >= b)


def run(jobs, _apply=apply, _rand=rand, _len=len, _range=range, _BaseException=BaseException, _scrub=scrub):
    """Do ``jobs`` (``[op, a, b, result, ...]`` lists) in random order, each from the same line, at the same depth: a
    value cannot tell the real comparison from a probe by where it is called from (``warnings.warn`` with a
    ``stacklevel`` shows a caller's file and line without touching a frame) or how deep (a ``RecursionError``
    counts frames). ``result``: True/False, or the exception, scrubbed."""
    for i in _range(_len(jobs) - 1, 0, -1):
        j = _rand(i + 1)
        jobs[i], jobs[j] = jobs[j], jobs[i]
    for job in jobs:
        try:
            job[3] = _apply(job[0], job[1], job[2])
        except _BaseException as e:
            job[3] = _scrub(e)


def probe_items(value, side, jobs, _Fresh=Fresh, _type=type, _any=ANY, _containers=CONTAINERS, _dict=dict,
                _list=list, _tuple=tuple, _len=len):
    """Add ``==``/``!=`` probe jobs against a fresh object for the items of a builtin container (3 levels, 2,000 items
    at most). An item in lists, tuples and dict values is probed wrapped in the same containers as it sits in (the
    fresh object alike), so it is reached through the same C calls as by the real comparison; set members and dict
    keys (found by hash, not compared in place) bare."""
    stack, budget = [(value, ())], 2000
    while stack and budget > 0:
        item, path = stack.pop()
        budget -= 1
        if item is _any:
            continue
        if path:
            a, b, bare = item, _Fresh(), False
            for t in path:
                if t is not _list and t is not _tuple and t is not _dict:
                    bare = True  # a set member or a dict key (None)
            for t in () if bare else path:  # innermost first
                a, b = ([a], [b]) if t is _list else ((a,), (b,)) if t is _tuple else ({0: a}, {0: b})
            jobs.append([0, a, b, None, 1, side])
            jobs.append([1, a, b, None, 1, side])
        t = _type(item)
        if _len(path) < 3 and t in _containers:
            if t is _dict:
                stack.extend((k, (None,) + path) for k in item.keys())
                stack.extend((v, (_dict,) + path) for v in item.values())
            else:
                stack.extend((x, (t,) + path) for x in item)
    return jobs


def has_contains(t, _mro=MRO_OF, _dict=DICT_OF):
    """Whether ``in`` asks ``t`` (a ``__contains__`` in its MRO); else it iterates the container, and a probe would
    use up an iterator's items in place of the real comparison."""
    for klass in _mro(t):
        if "__contains__" in _dict(klass):
            return True
    return False


def claims(jobs, kind):
    """The first job of ``kind`` whose operand claimed what it cannot, or None. Kinds: 0 the real comparison, 1 an
    equality probe (equal to a fresh object or a twin), 2 an ordering probe (ordered with a fresh object), 3 the
    converse ordering (true as well), 5 a containment probe (holds a fresh object), 6 a blank instance (true)."""
    for job in jobs:
        if job[4] == kind and (job[3] is True if job[0] != 1 else job[3] is False):
            return job
    return None


def compare(op, left, right, lax, _run=run, _probe_items=probe_items, _claims=claims, _twins=twins, _Fresh=Fresh,
            _has_contains=has_contains, _type=type, _containers=CONTAINERS, _error=AssertionError,
            _converse=(7, 7, 5, 5)):
    """``[result, error]``: the truth of the real ``left <op> right`` (0 ``==``, 1 ``!=``, 2 ``in``, 3 ``not in``,
    5 ``<``, 6 ``<=``, 7 ``>``, 8 ``>=``; 4: the probes only), done among the probes of both operands (a fresh object,
    same-type twins of the other operand, their items; for an ordering, the fresh object and the converse ordering;
    for ``in``, a fresh object in a container with a ``__contains__``); ``error`` when an operand claims what it
    cannot, or the comparison raised."""
    real = None if op == 4 else [op, left, right, None, 0, 0]
    jobs = [] if real is None else [real]
    for side, value, other in ((0, left, right), (1, right, left)):
        if (lax >> side) & 1:
            continue
        if op >= 5:
            jobs.append([op, value, _Fresh(), None, 2, side])
        else:
            for probe in [_Fresh()] + (_twins(other) if op < 2 or op == 4 else []):
                jobs += [[0, value, probe, None, 1, side], [1, value, probe, None, 1, side]]
        if _type(value) in _containers:
            _probe_items(value, side, jobs)
    if op >= 5:
        jobs.append([_converse[op - 5], left, right, None, 3, 0])
    if (op == 2 or op == 3) and _has_contains(_type(right)):
        jobs.append([2, _Fresh(), right, None, 5, 1])
    _run(jobs)
    lie = _claims(jobs, 1)
    if lie is not None:
        return [False, _error(f"{'an item of ' if lie[1] is not (left, right)[lie[5]] else ''}the "
                              f"{('left', 'right')[lie[5]]} operand of this comparison "
                              f"({_type((left, right)[lie[5]]).__qualname__}) claims to equal a value it was never "
                              "given: its __eq__/__ne__ lie")]
    lie = _claims(jobs, 2)
    if lie is not None:
        return [False, _error(f"the {('left', 'right')[lie[5]]} operand of this comparison "
                              f"({_type(lie[1]).__qualname__}) claims an order with an object it has never seen: its "
                              "ordering methods lie")]
    if _claims(jobs, 5) is not None:
        return [False, _error(f"the container ({_type(right).__qualname__}) claims to hold an object it was never "
                              "given: its __contains__ lies")]
    if op == 4:
        return [None, None]
    if _type(real[3]) is not bool:
        return [False, real[3]]
    if op >= 5 and real[3] and _claims(jobs, 3) is not None:
        return [False, _error(f"the operands of this comparison ({_type(left).__qualname__}, "
                              f"{_type(right).__qualname__}) say both a {('<', '<=', '>', '>=')[op - 5]} b and its "
                              "converse: their ordering methods lie")]
    return [real[3], None]


def truth_lies(value, _type=type, _flags=FLAGS_OF, _mro=MRO_OF, _dict=DICT_OF, _isinstance=isinstance,
               _mock=NON_CALLABLE_MOCK, _slot=WRAPPER_DESCRIPTOR, _object=object, _BaseException=BaseException,
               _heap=HEAP_TYPE, _scrub=scrub):
    """A fresh, uninitialised instance of ``value``'s class when its truth comes from a Python-level
    ``__bool__``/``__len__`` (honest truth reads state such an instance lacks: it raises, or finds it empty); None."""
    t = _type(value)
    if not _flags(t) & _heap or _isinstance(value, _mock):
        return None
    source = None
    for name in ("__bool__", "__len__"):
        for klass in _mro(t):
            if name in _dict(klass):
                source = _dict(klass)[name]
                break
        if source is not None:
            break
    if source is None or _type(source) is _slot:
        return None
    base = _object
    for b in _mro(t):
        if not _flags(b) & _heap:
            base = b
            break
    try:
        return base.__new__(t)
    except _BaseException as e:
        _scrub(e)
        return None


def check_truth(value, lax, truths, _run=run, _probe_items=probe_items, _claims=claims, _truth_lies=truth_lies,
                _Fresh=Fresh, _type=type, _bool=bool, _containers=CONTAINERS, _error=AssertionError):
    """``[bool(value), error]``, the truth taken among the probes: a fresh object must not equal the value (nor one
    of its items), and a fresh, uninitialised instance of its class must not be true as well."""
    real = [9, value, None, None, 0, 0]
    jobs = [real]
    if not lax:
        probe = _Fresh()
        jobs += [[0, value, probe, None, 1, 0], [1, value, probe, None, 1, 0]]
        if _type(value) in _containers:
            _probe_items(value, 0, jobs)
        blank = _truth_lies(value) if truths else None
        if blank is not None:
            jobs.append([9, blank, None, None, 6, 0])
    _run(jobs)
    if _claims(jobs, 1) is not None:
        return [False, _error(f"the operand of this assert ({_type(value).__qualname__}) claims to equal an object it "
                              "has never seen: its __eq__/__ne__ lie")]
    if _claims(jobs, 6) is not None:
        return [False, _error(f"the operand of this assert ({_type(value).__qualname__}) is true whatever its state: "
                              "its __bool__/__len__ lie")]
    if _type(real[3]) is not bool:
        return [False, real[3]]
    return [real[3], None]


def intact(watched, taint_event, _audit=sys.audit, _isinstance=isinstance, _type=type, _dict=DICT_OF, _vars=vars):
    """Report (to the recorder) each watched ``(owner, name, expected, label)`` whose object was replaced."""
    for owner, name, expected, label in watched:
        found = _dict(owner).get(name) if _isinstance(owner, _type) else _vars(owner).get(name)
        if found is not expected:
            _audit(taint_event, "taint", f"{label} was replaced during the test run")


def make_checker(events: tuple, truths: bool, watched: tuple):
    """The checker hook for ``events`` (COMPARE, TRUTH, END, CONTROL, TAINT), and the functions it runs (so the
    runner can protect them)."""
    compare_event, truth_event, end_event, control_event, taint_event = events

    def checker(event, args, _compare_event=compare_event, _truth_event=truth_event, _end_event=end_event,
                _control_event=control_event, _taint_event=taint_event, _watched=watched, _truths=truths,
                _compare=compare, _check_truth=check_truth, _intact=intact, _len=len, _type=type, _list=list,
                _BaseException=BaseException, _error=AssertionError, _scrub=scrub):
        if event != _compare_event and event != _truth_event and event != _end_event and event != _control_event:
            return
        try:
            if event == _compare_event and _len(args) == 5 and _type(args[4]) is _list:
                args[4][:] = _compare(args[0], args[1], args[2], args[3])
            elif event == _truth_event and _len(args) == 3 and _type(args[2]) is _list:
                args[2][:] = _check_truth(args[0], args[1], _truths)
            elif event == _end_event or (event == _control_event and args and _type(args[0]) is str
                                         and args[0] in ("done", "finish")):
                _intact(_watched, _taint_event)
        except _BaseException as e:  # a bug of ours: fail the comparison, never let this frame out
            _scrub(e)
            if _len(args) in (3, 5) and _type(args[-1]) is _list:
                args[-1][:] = [False, _error("the grader's checker failed on this comparison")]

    return checker, (checker, compare, check_truth, intact, run, apply, probe_items, has_contains, claims, twins,
                     truth_lies, rand, scrub)


# unittest's assertions compare inside unittest's code, where the assert instrumentation does not reach: wrapped
# (with the aliases older Pythons still have) before any code under test is imported.
UNITTEST_COMPARISONS = ("assertEqual", "assertNotEqual", "assertAlmostEqual", "assertNotAlmostEqual", "assertIn",
                        "assertNotIn", "assertCountEqual", "assertListEqual", "assertTupleEqual", "assertSetEqual",
                        "assertDictEqual", "assertSequenceEqual", "assertMultiLineEqual", "assertEquals",
                        "assertNotEquals", "assertAlmostEquals", "assertNotAlmostEquals", "failUnlessEqual",
                        "failIfEqual", "failUnlessAlmostEqual", "failIfAlmostEqual")
UNITTEST_TRUTHS = ("assertTrue", "assertFalse", "assert_", "failUnless", "failIf")
# ==, !=, in, not in are decided by the checker (where the values cannot see whether it is the real comparison);
# unittest's method then runs for its message. The almost-equal and container variants are probed only (op 4).
UNITTEST_OPS = {"assertEqual": 0, "assertEquals": 0, "failUnlessEqual": 0, "assertNotEqual": 1, "assertNotEquals": 1,
                "failIfEqual": 1, "assertIn": 2, "assertNotIn": 3}
COMPARISON_WRAPPER = """
def NAME(self, first, second, *args, **kwargs):
    box = [False, None]
    P_audit(P_event, P_op, first, second, P_lax(), box)
    if box[1] is not None and P_op < 4:
        raise self.failureException(str(box[1]))
    outcome = P_original(self, first, second, *args, **kwargs)
    if P_op < 4 and not box[0]:
        raise self.failureException("NAME: the values compare differently when they cannot see who compares them")
    if box[1] is not None:
        raise self.failureException(str(box[1]))
    return outcome
"""
TRUTH_WRAPPER = """
def NAME(self, expr, *args, **kwargs):
    box = [False, None]
    P_audit(P_event, expr, P_lax(), box)
    if box[1] is not None:
        raise self.failureException(str(box[1]))
    return P_original(self, box[0], *args, **kwargs)  # the truth the hook took, not the object's say-so now
"""


def caller_lax(_getframe=sys._getframe) -> int:
    """3 (both operands exempt) when the test calling the wrapped assertion names ``mock.ANY``, else 0."""
    return 3 if "ANY" in _getframe(2).f_code.co_names else 0


def compiled_wrapper(ins, template: str, name: str, objects: dict):
    """``template`` as a function named ``name`` whose ``P_*`` names are code constants (a closure cell could be
    rewritten from outside; a constant cannot)."""
    tree = ast.parse(template.replace("NAME", name))
    for node in ast.walk(tree):
        for field, value in ast.iter_fields(node):
            if isinstance(value, ast.Name) and value.id.startswith("P_"):
                setattr(node, field, ast.Constant(ins.PLACEHOLDER + value.id))
            elif isinstance(value, list):
                value[:] = [ast.Constant(ins.PLACEHOLDER + v.id) if isinstance(v, ast.Name) and v.id.startswith("P_")
                            else v for v in value]
    ast.fix_missing_locations(tree)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = compile(tree, f"<envhub unittest {name}>", "exec", dont_inherit=True)
    code = next(c for c in ins.codes_in(ins.bind(module, objects)) if c.co_name == name)
    return types.FunctionType(code, {"__builtins__": {"str": str}}, name)


def wrap_unittest(ins) -> dict:
    """Wrap ``unittest.TestCase``'s comparison and truth assertions so the checker hook decides them; return
    ``{name: wrapper}``."""
    import unittest

    case, wrappers = unittest.TestCase, {}
    for names, template, event in ((UNITTEST_COMPARISONS, COMPARISON_WRAPPER, ins.COMPARE),
                                   (UNITTEST_TRUTHS, TRUTH_WRAPPER, ins.TRUTH)):
        for name in names:
            original = vars(case).get(name)
            if callable(original):
                wrapper = compiled_wrapper(ins, template, name, {
                    "P_audit": sys.audit, "P_event": event, "P_lax": caller_lax, "P_original": original,
                    "P_op": UNITTEST_OPS.get(name, 4)})
                wrapper.__doc__ = original.__doc__
                setattr(case, name, wrapper)
                wrappers[name] = wrapper
    return wrappers


def watched_objects(wrappers: dict, frozen_builtins: tuple) -> tuple:
    """What must be unchanged at every test end, as ``(owner, name, object, label)``: the unittest wrappers, pytest's
    namespace and the classes of its assertion helpers (``raises``, ``approx``, outcomes), and the builtins the
    instrumentation freezes."""
    import builtins
    import unittest

    import pytest

    out = [(unittest.TestCase, n, w, f"unittest.TestCase.{n}") for n, w in wrappers.items()]
    modules = [pytest]
    for name in ("_pytest.outcomes", "_pytest.python_api", "_pytest.raises", "_pytest.approx"):  # by pytest version
        if name in sys.modules or importlib.util.find_spec(name) is not None:
            modules.append(importlib.import_module(name))
    for module in modules:
        for name, value in vars(module).items():
            if callable(value) and not name.startswith("__"):
                out.append((module, name, value, f"{module.__name__}.{name}"))
            if isinstance(value, type) and value.__module__ == module.__name__:
                for attr, member in vars(value).items():
                    if callable(member) or isinstance(member, (classmethod, staticmethod, property)):
                        out.append((value, attr, member, f"{value.__module__}.{value.__qualname__}.{attr}"))
    out += [(builtins, n, getattr(builtins, n), f"builtins.{n}") for n in frozen_builtins]
    return tuple(out)
