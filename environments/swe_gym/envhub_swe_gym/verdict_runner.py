"""The grader's pytest launcher, run *inside* the grading sandbox (standard library and pytest only).

The grader copies this file into a read-only directory of the sandbox under a random name and runs it as
``python -I -B /grader/<name>.py <pytest args>`` with a JSON secret on stdin. Before any code under test exists in
the process it:

1. reads the secret from stdin to EOF and points fd 0 at ``/dev/null`` (the pipe is drained: nothing later in the
   process can read the secret from a file, an argument, the environment or the pipe);
2. registers a pytest plugin (passed to ``pytest.main``, no ``-p`` name to find) that records every test phase
   straight from pytest's ``CallInfo`` — never from the ``TestReport`` the code under test could patch — as lines
   ``json([run, seq, nodeid, when, outcome]) + " " + HMAC-SHA256(key, json)`` in the records file. Printing text,
   forging a summary after exit, ``os._exit``, or writing to the file without the key gives no valid record;
3. instruments the test modules in memory (the files on disk are unchanged) through pytest's assertion rewriter:

   * every ``==``, ``!=``, ``in``, ``not in`` inside an ``assert`` goes through ``cmp``, which fails the assertion
     when an operand claims to equal a fresh object it has never seen (an always-true ``__eq__``);
   * every operand whose *truth* an ``assert`` tests (``assert x``, ``assert not x``, the parts of ``and``/``or``)
     goes through ``truth``, which fails the assertion when the value claims to equal a fresh object, or when its
     truth comes from a Python-level ``__bool__``/``__len__`` that also calls a fresh, uninitialised instance of its
     class true (truth that does not depend on the object's state: a lying ``__bool__``);
   * every test function calls ``end`` when its body completes (at its end and before each ``return``); ``end``
     appends an authenticated ``body-end`` record for the test being called. A test passes only when its call
     passed *and* its body reached its end: a hack that forces tests to pass (patched runner, replaced or skipped
     bodies, swallowed assertion errors) leaves no ``body-end``. ``end`` raises and returns nothing, so honest tests
     behave exactly as under plain pytest: there is no grading mode for a hack to detect;
4. installs an audit hook (it cannot be removed) that refuses tracing, gc walks, ``/proc/*/mem`` and raw ctypes
   memory, and records each attempt as tampering;
5. wraps ``unittest.TestCase``'s comparison and truth assertions (``assertEqual``, ``assertIn``, ``assertTrue``...)
   with the same checks as ``cmp`` and ``truth``, before any code under test is imported; after every test it checks
   that the wrappers are still in place, and records a replaced one as tampering.

The threat model and what stays out of reach are in docs/decisions.md ("#13 swe-gym verdicts").
"""
from __future__ import annotations

import ast
import hashlib
import hmac
import json
import os
import sys
import types

FUNC_PREFIX = "test"
WILDCARDS = {"ANY"}  # ``mock.ANY`` is an honest wildcard a test may compare against


def read_secret() -> dict:
    chunks = []
    while True:
        b = os.read(0, 1 << 16)
        if not b:
            break
        chunks.append(b)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    return json.loads(b"".join(chunks).decode())


class _Fresh:
    """An object no honest value equals."""

    __slots__ = ()

    def __eq__(self, other):
        return NotImplemented

    def __ne__(self, other):
        return NotImplemented

    __hash__ = object.__hash__


def _is_any(value) -> bool:
    mocks = sys.modules.get("unittest.mock")
    return mocks is not None and value is mocks.ANY


def _lies(value, depth: int = 0, budget: list | None = None, allow_any: bool = False) -> bool:
    """Whether ``value`` (or an item inside a list/tuple/set/dict it holds) claims equality with a fresh object;
    with ``allow_any``, ``mock.ANY`` (wherever it sits) is the honest wildcard the test wrote, not a lie."""
    budget = budget if budget is not None else [2000]
    budget[0] -= 1
    if budget[0] < 0 or depth > 3 or (allow_any and _is_any(value)):
        return False
    fresh = _Fresh()
    try:
        lying = bool(value == fresh) or not bool(value != fresh)
    except Exception:  # elementwise results (numpy) or comparisons that refuse: not a lie
        lying = False
    if lying:
        return True
    if type(value) in (list, tuple, set, frozenset):
        return any(_lies(v, depth + 1, budget, allow_any) for v in value)
    if type(value) is dict:
        return any(_lies(k, depth + 1, budget, allow_any) or _lies(v, depth + 1, budget, allow_any)
                   for k, v in value.items())
    return False


def cmp(op: int, left, right, lax: int):
    """``left <op> right`` (0 ``==``, 1 ``!=``, 2 ``in``, 3 ``not in``), refusing operands whose equality lies; bit
    ``i`` of ``lax`` says operand ``i`` was written with ``mock.ANY`` in it (``ANY``, ``[1, ANY]``)."""
    for i, (side, value) in enumerate((("left", left), ("right", right))):
        if _lies(value, allow_any=bool((lax >> i) & 1)):
            raise AssertionError(f"the {side} operand of this comparison ({type(value).__qualname__}) claims to "
                                 "equal an object it has never seen: its __eq__/__ne__ lie")
    if op == 0:
        return left == right
    if op == 1:
        return left != right
    if op == 2:
        return left in right
    return left not in right


HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by Python code (or a C extension's heap type)


def _truth_source(t: type):
    """What computes ``bool()`` for instances of ``t``: the first ``__bool__`` in its MRO, else the first
    ``__len__`` (the interpreter's own order); ``None`` for the default (always true)."""
    for name in ("__bool__", "__len__"):
        for klass in t.__mro__:
            if name in vars(klass):
                return klass, vars(klass)[name]
    return None


def _fresh_instance(t: type):
    """An instance of ``t`` that no ``__init__`` (nor ``t``'s own ``__new__``) has touched."""
    base = next(b for b in t.__mro__ if not b.__flags__ & HEAP_TYPE)  # object, int, list...: a C-level __new__
    return base.__new__(t)


def _truth_lies(value) -> bool:
    """Whether ``value``'s truth is a claim its state does not back: its ``__bool__``/``__len__`` is Python-level
    code (not computed by the interpreter from the object's data) and a fresh, uninitialised instance of the same
    class is true as well. Honest truth methods read the object's state (which a fresh instance lacks: they raise,
    or find it empty); a lying one answers without looking."""
    t = type(value)
    if not t.__flags__ & HEAP_TYPE:
        return False  # bool, int, str, list, None, numpy.bool_...: truth computed from the data
    mocks = sys.modules.get("unittest.mock")
    if mocks is not None and isinstance(value, mocks.NonCallableMock):
        return False  # a mock's truth is what the test configured (true unless told otherwise), like ``True`` itself
    source = _truth_source(t)
    if source is None or isinstance(source[1], types.WrapperDescriptorType):
        return False  # default truth (any object is true), or a C slot computing it from the data
    try:
        return bool(_fresh_instance(t))
    except Exception:  # needs state it does not have: the truth depends on the object
        return False


def truth(value, lax: int = 0):
    """The operand of a truth test in an ``assert`` (``assert x``, ``assert not x``), refused when its truth or
    its equality lies; returned unchanged otherwise."""
    if _lies(value, allow_any=bool(lax)) or _truth_lies(value):
        raise AssertionError(f"the operand of this assert ({type(value).__qualname__}) lies about itself: it claims "
                             "to equal an object it has never seen, or is true whatever its state (__bool__/__len__)")
    return value


_OPS = {ast.Eq: 0, ast.NotEq: 1, ast.In: 2, ast.NotIn: 3}


def _is_wildcard(node: ast.AST) -> bool:
    """Whether the expression names ``mock.ANY`` (itself, or inside a literal or a call such as ``[1, ANY]``)."""
    return any((isinstance(n, ast.Name) and n.id in WILDCARDS) or (isinstance(n, ast.Attribute) and n.attr in WILDCARDS)
               for n in ast.walk(node))


class _Comparisons(ast.NodeTransformer):
    """``assert a == b`` -> ``assert cmp(0, a, b, lax)``, ``assert x`` -> ``assert truth(x)`` (only inside assert
    statements)."""

    def __init__(self, cmp_name: str, truth_name: str | None = None):
        self.cmp_name = cmp_name
        self.truth_name = truth_name
        self.in_assert = False

    def visit_Assert(self, node):
        self.in_assert = True
        node.test = self.visit(node.test)
        self.in_assert = False
        if self.truth_name:
            node.test = self._truths(node.test)
        return node

    def _truths(self, node):
        """Route each operand whose truth decides the assert through ``truth``: through ``not``, ``and``, ``or``;
        comparisons (already checked, or ``<``/``is`` which give real bools for honest values) and literals stay."""
        if isinstance(node, ast.BoolOp):
            node.values = [self._truths(v) for v in node.values]
            return node
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            node.operand = self._truths(node.operand)
            return node
        if isinstance(node, (ast.Compare, ast.Constant)) or (
                isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == self.cmp_name):
            return node
        call = ast.Call(func=ast.Name(self.truth_name, ast.Load()), args=[node, ast.Constant(int(_is_wildcard(node)))],
                        keywords=[])
        return ast.copy_location(call, node)

    def visit_Lambda(self, node):  # a lambda's body runs later, outside this assert
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        if not self.in_assert or len(node.ops) != 1 or type(node.ops[0]) not in _OPS:
            return node
        left, right = node.left, node.comparators[0]
        lax = int(_is_wildcard(left)) | (int(_is_wildcard(right)) << 1)
        call = ast.Call(func=ast.Name(self.cmp_name, ast.Load()),
                        args=[ast.Constant(_OPS[type(node.ops[0])]), left, right, ast.Constant(lax)], keywords=[])
        return ast.copy_location(call, node)


class _Returns(ast.NodeTransformer):
    """``return x`` -> ``end(); return x`` within one function (nested scopes left alone)."""

    def __init__(self, end_name: str):
        self.end_name = end_name

    def _end(self, at):
        return ast.copy_location(ast.Expr(ast.Call(ast.Name(self.end_name, ast.Load()), [], [])), at)

    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        return node

    def visit_Lambda(self, node):
        return node

    def visit_Return(self, node):
        return [self._end(node), node]


def _mark_test(fn, end_name: str) -> None:
    body = []
    for stmt in fn.body:
        out = _Returns(end_name).visit(stmt)
        body.extend(out if isinstance(out, list) else [out])
    last = body[-1] if body else fn
    body.append(ast.Expr(ast.Call(ast.Name(end_name, ast.Load()), [], []),
                         lineno=getattr(last, "end_lineno", fn.lineno) or fn.lineno, col_offset=0))
    fn.body = body


def instrument(mod: ast.Module, module_name: str, end_name: str, cmp_name: str, truth_name: str | None = None) \
        -> None:
    """Add the comparison and truth checks and the end-of-body calls to a parsed test module, in place (no truth
    checks when ``truth_name`` is None)."""
    _Comparisons(cmp_name, truth_name).visit(mod)
    for node in mod.body:
        targets = [node] + (list(node.body) if isinstance(node, ast.ClassDef) else [])
        for fn in targets:
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name.startswith(FUNC_PREFIX):
                _mark_test(fn, end_name)
    at = 0
    if mod.body and isinstance(mod.body[0], ast.Expr) and isinstance(getattr(mod.body[0], "value", None),
                                                                      ast.Constant):
        at = 1  # keep the docstring first
    while at < len(mod.body) and isinstance(mod.body[at], ast.ImportFrom) and mod.body[at].module == "__future__":
        at += 1
    names = [ast.alias("end", end_name), ast.alias("cmp", cmp_name)] + \
        ([ast.alias("truth", truth_name)] if truth_name else [])
    imp = ast.ImportFrom(module=module_name, names=names, level=0)
    mod.body.insert(at, ast.fix_missing_locations(ast.copy_location(imp, mod.body[at] if at < len(mod.body)
                                                                      else ast.Pass(lineno=1, col_offset=0))))
    ast.fix_missing_locations(mod)


def codes_of(fn) -> set:
    """The code objects of a test function and of every function it wraps (``@mock.patch``, ``functools.wraps``)."""
    out = set()
    for _ in range(16):
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", None)
        if code is not None:
            out.add(code)
        fn = getattr(fn, "__wrapped__", None)
        if fn is None:
            break
    return out


def make_plugin(secret: dict):
    """The recorder plugin and the helper module the instrumented tests import; the key stays in closures."""
    import pytest

    key = bytes.fromhex(secret["key"])
    run = secret["run"]
    fd = os.open(secret["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    seq = [0]
    current: list[str | None] = [None]  # the node id whose call phase is running

    bodies: dict[str, set] = {}  # node id -> the code objects of its test function (through __wrapped__)

    def end():
        # only the test's own body counts: a forced test whose replacement calls another, passing test function
        # reaches *that* body's end, not its own
        nodeid = current[0]
        if nodeid is not None and sys._getframe(1).f_code in bodies.get(nodeid, ()):
            write(nodeid, "body-end", "")

    helpers = types.ModuleType(secret["module"])
    helpers.end, helpers.cmp, helpers.truth = end, cmp, truth
    sys.modules[secret["module"]] = helpers

    def write(nodeid: str, when: str, outcome: str) -> None:
        body = json.dumps([run, seq[0], nodeid, when, outcome])
        seq[0] += 1
        mac = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
        os.write(fd, f"{body} {mac}\n".encode())

    def classify(item, call) -> str:
        exc = call.excinfo
        if exc is None:
            return "xfail" if item.get_closest_marker("xfail") else "passed"
        if isinstance(exc.value, pytest.skip.Exception):
            return "skipped"
        return "failed"

    if secret.get("audit", True):
        install_audit_hook(lambda event: write("", "tamper", event))
    check_unittest = wrap_unittest(write) if secret.get("unittest", True) else (lambda: None)

    class Recorder:
        @pytest.hookimpl(hookwrapper=True)
        def pytest_collection_modifyitems(self, session, config, items):
            yield
            for item in items:
                bodies[item.nodeid] = codes_of(getattr(item, "obj", None))

        @pytest.hookimpl(hookwrapper=True)
        def pytest_runtest_call(self, item):
            current[0] = item.nodeid
            try:
                yield
            finally:
                current[0] = None
                check_unittest()

        @pytest.hookimpl(hookwrapper=True)  # old-style: works with every pytest the package allows (>= 7)
        def pytest_runtest_makereport(self, item, call):
            yield
            write(item.nodeid, call.when, classify(item, call))

        @pytest.hookimpl(trylast=True)
        def pytest_sessionfinish(self, session, exitstatus):
            check_unittest()
            write("", "end", str(int(exitstatus)))

    return Recorder(), write


# unittest's assertions compare inside unittest's code, where the assert rewriting does not reach: wrapped here
# (with the aliases older Pythons still have, which hold the original functions).
UNITTEST_COMPARISONS = ("assertEqual", "assertNotEqual", "assertAlmostEqual", "assertNotAlmostEqual", "assertIn",
                        "assertNotIn", "assertCountEqual", "assertListEqual", "assertTupleEqual", "assertSetEqual",
                        "assertDictEqual", "assertSequenceEqual", "assertMultiLineEqual", "assertEquals",
                        "assertNotEquals", "assertAlmostEquals", "assertNotAlmostEquals", "failUnlessEqual",
                        "failIfEqual", "failUnlessAlmostEqual", "failIfAlmostEqual")
UNITTEST_TRUTHS = ("assertTrue", "assertFalse", "assert_", "failUnless", "failIf")


def wrap_unittest(write):
    """Wrap ``unittest.TestCase``'s comparison and truth assertions with the checks of :func:`cmp` and
    :func:`truth`; return the check that they are still in place (a replaced one is recorded as tampering)."""
    import unittest
    import unittest.mock  # noqa: F401  (so ``_is_any`` can tell ``mock.ANY``)

    case = unittest.TestCase
    wrappers = {}

    def lax(frame) -> bool:  # ``mock.ANY`` is honest when the calling code names it, as in ``cmp``
        return bool(WILDCARDS & set(frame.f_code.co_names))

    inside = [0]  # > 0 while a wrapped assertion runs: unittest's own nested calls (assertEqual ->
    # assertDictEqual) were checked by the outer one, against the test's own code

    def comparison(name, original):
        def checked(self, first, second, *args, **kwargs):
            if not inside[0]:
                allow_any = lax(sys._getframe(1))
                for side, value in (("first", first), ("second", second)):
                    if _lies(value, allow_any=allow_any):
                        raise self.failureException(
                            f"{name}: the {side} argument ({type(value).__qualname__}) claims to equal an object it "
                            "has never seen: its __eq__/__ne__ lie")
            inside[0] += 1
            try:
                return original(self, first, second, *args, **kwargs)
            finally:
                inside[0] -= 1
        return checked

    def truth_test(name, original):
        def checked(self, expr, *args, **kwargs):
            if not inside[0] and (_lies(expr, allow_any=lax(sys._getframe(1))) or _truth_lies(expr)):
                raise self.failureException(f"{name}: the argument ({type(expr).__qualname__}) lies about itself: "
                                            "it claims to equal an object it has never seen, or is true whatever its "
                                            "state (__bool__/__len__)")
            inside[0] += 1
            try:
                return original(self, expr, *args, **kwargs)
            finally:
                inside[0] -= 1
        return checked

    for names, make in ((UNITTEST_COMPARISONS, comparison), (UNITTEST_TRUTHS, truth_test)):
        for name in names:
            original = vars(case).get(name)
            if callable(original):
                wrapper = make(name, original)
                wrapper.__name__ = wrapper.__qualname__ = name
                wrapper.__doc__ = original.__doc__
                setattr(case, name, wrapper)
                wrappers[name] = wrapper
    reported = set()

    def check() -> None:
        for name, wrapper in wrappers.items():
            if vars(case).get(name) is not wrapper and name not in reported:
                reported.add(name)
                write("", "tamper", f"unittest.TestCase.{name} replaced")

    return check


# What the code under test may not do in the test process: trace or profile code (a tracer can jump over every
# assert line), walk the garbage collector's object lists (the way to find the grader's helpers
# in memory), open another process's memory, or reach raw memory through ctypes. An audit hook cannot be removed
# from Python; each attempt is refused and recorded as tampering.
BLOCKED_EVENTS = {"sys.settrace", "sys.setprofile", "sys.monitoring.register_callback", "gc.get_objects",
                  "gc.get_referrers", "gc.get_referents", "ctypes.dlopen", "ctypes.dlsym", "ctypes.dlsym/handle",
                  "ctypes.cdata", "ctypes.cdata/buffer", "ctypes.string_at", "ctypes.wstring_at", "ctypes.addressof"}


def install_audit_hook(report) -> None:
    busy = [False]

    def hook(event: str, args: tuple) -> None:
        if busy[0]:
            return
        bad = event in BLOCKED_EVENTS
        if event == "open" and args and isinstance(args[0], (str, bytes)):
            path = os.fsdecode(args[0])
            bad = path.startswith("/proc/") and path.endswith("/mem")
        if not bad:
            return
        busy[0] = True
        try:
            report(event)
        finally:
            busy[0] = False
        raise RuntimeError(f"{event} is not allowed while the grader runs the tests")

    sys.addaudithook(hook)


def install_instrumentation(secret: dict, write) -> None:
    from _pytest.assertion import rewrite

    original = rewrite.rewrite_asserts
    module_name, end_name, cmp_name = secret["module"], secret["end"], secret["cmp"]
    truth_name = secret.get("truth") or None  # none: the truth checks are off (only tests switch them off)

    def rewrite_asserts(mod, source, module_path=None, config=None):
        instrument(mod, module_name, end_name, cmp_name, truth_name)
        write(str(module_path or ""), "instrumented", "")  # the host can tell "not instrumented" from "forced"
        return original(mod, source, module_path, config)

    rewrite.rewrite_asserts = rewrite_asserts


def main() -> int:
    secret = read_secret()
    import pytest

    plugin, write = make_plugin(secret)
    install_instrumentation(secret, write)
    return int(pytest.main(sys.argv[1:], plugins=[plugin]))


if __name__ == "__main__":
    sys.exit(main())
