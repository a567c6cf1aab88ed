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


def equal(a, b, _bool=bool, _BaseException=BaseException, _scrub=scrub):
    """Whether ``a`` claims equality with ``b`` (``==`` true, or ``!=`` false); a comparison that raises does not."""
    try:
        return _bool(a == b) or not _bool(a != b)
    except _BaseException as e:  # elementwise results (numpy), comparisons that refuse
        _scrub(e)
        return False


def order(a, b, op, _BaseException=BaseException, _bool=bool, _scrub=scrub):
    """``a <op> b`` for the ordering ops (5 ``<``, 6 ``<=``, 7 ``>``, 8 ``>=``) as a bool; False when it raises."""
    try:
        return _bool(a < b if op == 5 else a <= b if op == 6 else a > b if op == 7 else a >= b)
    except _BaseException as e:  # unorderable types: what an honest value says to an object it does not know
        _scrub(e)
        return False


def lies_inside(value, _equal=equal, _Fresh=Fresh, _type=type, _any=ANY, _containers=CONTAINERS, _dict=dict):
    """An item of a list/tuple/set/dict (3 levels, 2,000 items at most) that claims to equal a fresh object."""
    stack, budget = [(value, 0)], 2000
    while stack and budget > 0:
        item, level = stack.pop()
        budget -= 1
        if item is _any:
            continue
        if level and _equal(item, _Fresh()):
            return True
        t = _type(item)
        if level < 3 and t in _containers:
            stack.extend((x, level + 1) for x in (item if t is not _dict else [*item.keys(), *item.values()]))
    return False


def compare(op, left, right, lax, _equal=equal, _order=order, _twins=twins, _lies_inside=lies_inside, _Fresh=Fresh,
            _rand=rand, _type=type, _len=len, _range=range, _containers=CONTAINERS, _error=AssertionError,
            _BaseException=BaseException, _scrub=scrub, _converse=(7, 7, 5, 5)):
    """``[result, error]``: the real ``left <op> right`` (0 ``==``, 1 ``!=``, 2 ``in``, 3 ``not in``, 5 ``<``,
    6 ``<=``, 7 ``>``, 8 ``>=``; 4 only probes), computed in random order among the probes of both operands (a fresh
    object, same-type twins of the other operand; for an ordering, the fresh object and the converse ordering);
    ``error`` when an operand claims what it cannot, or the comparison raised."""
    jobs = [(0, 0, None, None)]
    for side, value, other in ((0, left, right), (1, right, left)):
        if not (lax >> side) & 1:
            jobs.append((1 if op < 5 else 2, side, value, _Fresh()))
            if op < 2 or op == 4:
                jobs += [(1, side, value, t) for t in _twins(other)]
    if op >= 5:
        jobs.append((3, 0, None, None))
    for i in _range(_len(jobs) - 1, 0, -1):
        j = _rand(i + 1)
        jobs[i], jobs[j] = jobs[j], jobs[i]
    result, converse = None, False
    for kind, side, value, probe in jobs:
        if kind == 1:
            if _equal(value, probe):
                return [False, _error(f"the {('left', 'right')[side]} operand of this comparison "
                                      f"({_type(value).__qualname__}) claims to equal a value it was never given: its "
                                      "__eq__/__ne__ lie")]
            continue
        if kind == 2:
            if _order(value, probe, op):
                return [False, _error(f"the {('left', 'right')[side]} operand of this comparison "
                                      f"({_type(value).__qualname__}) claims an order with an object it has never "
                                      "seen: its ordering methods lie")]
            continue
        if kind == 3:
            converse = _order(left, right, _converse[op - 5])
            continue
        try:
            result = left == right if op == 0 else left != right if op == 1 else left in right if op == 2 else \
                left not in right if op == 3 else None if op == 4 else left < right if op == 5 else \
                left <= right if op == 6 else left > right if op == 7 else left >= right
        except _BaseException as e:
            return [False, _scrub(e)]
    if op >= 5 and converse and result:
        return [False, _error(f"the operands of this comparison ({_type(left).__qualname__}, "
                              f"{_type(right).__qualname__}) say both a {('<', '<=', '>', '>=')[op - 5]} b and its "
                              "converse: their ordering methods lie")]
    for side, value in ((0, left), (1, right)):
        if not (lax >> side) & 1 and _type(value) in _containers and _lies_inside(value):
            return [False, _error(f"an item of the {('left', 'right')[side]} operand claims to equal an object it "
                                  "has never seen: its __eq__/__ne__ lie")]
    if op in (2, 3):
        try:
            contains = _Fresh() in right
        except _BaseException as e:
            _scrub(e)
            contains = False
        if contains:
            return [False, _error(f"the container ({_type(right).__qualname__}) claims to hold an object it was "
                                  "never given: its __contains__ lies")]
    return [result, None]


def truth_lies(value, _type=type, _bool=bool, _flags=FLAGS_OF, _mro=MRO_OF, _dict=DICT_OF, _isinstance=isinstance,
               _mock=NON_CALLABLE_MOCK, _slot=WRAPPER_DESCRIPTOR, _object=object, _BaseException=BaseException,
               _heap=HEAP_TYPE, _scrub=scrub):
    """A Python-level ``__bool__``/``__len__`` that also calls a fresh, uninitialised instance of the class true
    (honest truth reads state a fresh instance lacks: it raises, or finds it empty)."""
    t = _type(value)
    if not _flags(t) & _heap or _isinstance(value, _mock):
        return False
    source = None
    for name in ("__bool__", "__len__"):
        for klass in _mro(t):
            if name in _dict(klass):
                source = _dict(klass)[name]
                break
        if source is not None:
            break
    if source is None or _type(source) is _slot:
        return False
    base = _object
    for b in _mro(t):
        if not _flags(b) & _heap:
            base = b
            break
    try:
        return _bool(base.__new__(t))
    except _BaseException as e:
        _scrub(e)
        return False


def check_truth(value, lax, truths, _equal=equal, _Fresh=Fresh, _lies_inside=lies_inside, _truth_lies=truth_lies,
                _rand=rand, _bool=bool, _type=type, _containers=CONTAINERS, _error=AssertionError,
                _BaseException=BaseException, _scrub=scrub):
    """``[bool(value), error]``, the truth taken here in random order with the probes: a fresh object must not equal
    the value, and a fresh, uninitialised instance of its class must not be true as well."""
    jobs = [0] + ([] if lax else [1, 2] if truths else [1])
    if _rand(2):
        jobs.reverse()
    result = False
    for job in jobs:
        if job == 0:
            try:
                result = _bool(value)
            except _BaseException as e:
                return [False, _scrub(e)]
        elif job == 1 and (_equal(value, _Fresh()) or (_type(value) in _containers and _lies_inside(value))):
            return [False, _error(f"the operand of this assert ({_type(value).__qualname__}) claims to equal an "
                                  "object it has never seen: its __eq__/__ne__ lie")]
        elif job == 2 and _truth_lies(value):
            return [False, _error(f"the operand of this assert ({_type(value).__qualname__}) is true whatever its "
                                  "state: its __bool__/__len__ lie")]
    return [result, None]


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

    return checker, (checker, compare, check_truth, intact, equal, order, twins, lies_inside, truth_lies, rand,
                     scrub)


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
