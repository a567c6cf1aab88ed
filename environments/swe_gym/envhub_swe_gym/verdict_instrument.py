"""Instrumenting the test files for the verdict runner (:mod:`envhub_swe_gym.verdict_runner`), before any code
under test exists in the process. Standard library and pytest only: it is copied into the sandbox beside the runner.

In the compiled test code:

* every test body starts with ``sys.audit(BEGIN)`` and ends (and each ``return`` is preceded) with
  ``sys.audit(END)``, the builtin held as a *code constant* (no global, no attribute lookup: nothing to patch);
* every ``==``, ``!=``, ``in``, ``not in``, ``<``, ``<=``, ``>``, ``>=`` inside an ``assert``, and every operand whose truth an ``assert`` decides,
  goes through :func:`cmp` / :func:`truth` (code constants too), which hand the values to the runner's checker hook;
* the verdict-relevant builtins (``isinstance``, ``len``, ``sorted``...) and the ``pytest.raises``/``approx``/...
  a test names are code constants, so patching ``builtins`` or ``pytest`` does not change what a test calls;
* the module's first statement raises ``MODULE``, so the runner knows the file ran as compiled here.
"""
from __future__ import annotations

import ast
import builtins
import sys
import types
import warnings

EVENTS = ("envhub.verdict.end", "envhub.verdict.module", "envhub.verdict.control", "envhub.verdict.compare",
          "envhub.verdict.truth", "envhub.verdict.taint", "envhub.verdict.begin", "envhub.verdict.load",
          "envhub.verdict.query")
END, MODULE, CONTROL, COMPARE, TRUTH, TAINT, BEGIN, LOAD, QUERY = EVENTS
WILDCARDS = {"ANY"}  # ``mock.ANY`` is an honest wildcard a test may compare against
FROZEN_BUILTINS = ("isinstance", "issubclass", "len", "bool", "int", "float", "complex", "str", "bytes", "bytearray",
                   "list", "tuple", "dict", "set", "frozenset", "type", "sorted", "reversed", "min", "max", "sum",
                   "all", "any", "abs", "round", "repr", "hash", "id", "callable", "hasattr", "getattr", "iter",
                   "next", "range", "enumerate", "zip", "map", "filter", "divmod", "pow", "ord", "chr", "format",
                   "object", "Exception", "BaseException", "AssertionError", "ValueError", "TypeError", "KeyError",
                   "IndexError", "AttributeError", "RuntimeError", "ZeroDivisionError", "LookupError")
PLACEHOLDER = "\x00envhub:"  # string constants the compiled code holds until :func:`bind` swaps in the objects


# ---- the grader's functions the instrumented tests call (code constants; no globals, defaults are protected) ----
def cmp(op, left, right, lax, _audit=sys.audit, _event=COMPARE):
    """``left <op> right`` (0 ``==``, 1 ``!=``, 2 ``in``, 3 ``not in``, 5 ``<``, 6 ``<=``, 7 ``>``, 8 ``>=``),
    decided by the checker hook; bit ``i`` of
    ``lax`` says operand ``i`` was written with ``mock.ANY`` in it."""
    box = [False, None]
    _audit(_event, op, left, right, lax, box)
    if box[1] is not None:
        raise box[1]
    return box[0]


def truth(value, lax=0, _audit=sys.audit, _event=TRUTH):
    """The truth of an operand an ``assert`` tests, taken by the checker hook (which refuses a value lying about
    itself)."""
    box = [False, None]
    _audit(_event, value, lax, box)
    if box[1] is not None:
        raise box[1]
    return box[0]


# ---- instrumentation (static: runs before any code under test) -----------------------------------------------
_OPS = {ast.Eq: 0, ast.NotEq: 1, ast.In: 2, ast.NotIn: 3, ast.Lt: 5, ast.LtE: 6, ast.Gt: 7, ast.GtE: 8}


def _const(name: str, at: ast.AST) -> ast.Constant:
    return ast.copy_location(ast.Constant(PLACEHOLDER + name), at)


def _call(name: str, args: list, at: ast.AST) -> ast.Call:
    return ast.copy_location(ast.Call(_const(name, at), args, []), at)


def _is_wildcard(node: ast.AST) -> bool:
    """Whether the expression names ``mock.ANY`` (itself, or inside a literal or a call such as ``[1, ANY]``)."""
    return any((isinstance(n, ast.Name) and n.id in WILDCARDS) or (isinstance(n, ast.Attribute) and n.attr in WILDCARDS)
               for n in ast.walk(node))


def bound_names(mod: ast.Module) -> set[str]:
    """Every name the module binds anywhere (assignments, defs, imports, arguments, handlers, patterns)."""
    out = set()
    for n in ast.walk(mod):
        if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.alias):
            out.add((n.asname or n.name).split(".")[0])
        elif isinstance(n, (ast.Global, ast.Nonlocal)):
            out.update(n.names)
        elif isinstance(n, ast.ExceptHandler) and n.name:
            out.add(n.name)
        elif isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
            out.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            out.add(n.rest)
    return out


def pytest_aliases(mod: ast.Module) -> tuple[set[str], dict[str, str]]:
    """Names bound *only* by ``import pytest`` / ``from pytest import x`` at the top level of the module: a name
    bound anywhere else too (an assignment, a def, an argument, a nested ``from x import raises``) is not frozen."""
    modules, names, rest = [], [], []
    for stmt in mod.body:
        if isinstance(stmt, ast.Import):
            modules += [a.asname or a.name for a in stmt.names if a.name == "pytest"]
            rest.append(ast.Import([a for a in stmt.names if a.name != "pytest"]))
        elif isinstance(stmt, ast.ImportFrom) and stmt.module == "pytest" and not stmt.level:
            names += [(a.asname or a.name, a.name) for a in stmt.names if a.name != "*"]
        else:
            rest.append(stmt)
    aliases = [alias for alias, _ in names] + modules
    # bound elsewhere, or twice by pytest's imports themselves (which one holds depends on the order of execution)
    rebound = bound_names(ast.Module(rest, [])) | {a for a in aliases if aliases.count(a) > 1}
    return set(modules) - rebound, {alias: name for alias, name in names if alias not in rebound}


class _Instrument(ast.NodeTransformer):
    """Asserts' comparisons and truths through ``cmp``/``truth``; frozen builtins and pytest names as constants."""

    def __init__(self, frozen: set[str], pytest_modules: set[str], pytest_names: dict[str, str], truths: bool,
                 pytest_api: set[str] | frozenset[str]):
        self.frozen, self.pytest_modules, self.pytest_names, self.truths = frozen, pytest_modules, pytest_names, truths
        self.pytest_api = pytest_api
        self.in_assert = False
        self.used: set[str] = set()

    def visit_Assert(self, node):
        self.in_assert = True
        node.test = self.visit(node.test)
        self.in_assert = False
        if node.msg is not None:
            node.msg = self.visit(node.msg)
        if self.truths:
            node.test = self._truths(node.test)
        return node

    def _truths(self, node):
        if isinstance(node, ast.BoolOp):
            node.values = [self._truths(v) for v in node.values]
            return node
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            node.operand = self._truths(node.operand)
            return node
        if isinstance(node, ast.Compare) or (isinstance(node, ast.Constant) and not (
                isinstance(node.value, str) and node.value.startswith(PLACEHOLDER))) or self._is_cmp(node):
            return node
        return _call("truth", [node, ast.Constant(int(_is_wildcard(node)))], node)

    @staticmethod
    def _is_cmp(node) -> bool:
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Constant) and node.func.value == \
            PLACEHOLDER + "cmp"

    def visit_Lambda(self, node):  # a lambda's body runs later, outside this assert
        inside, self.in_assert = self.in_assert, False
        self.generic_visit(node)
        self.in_assert = inside
        return node

    def visit_Compare(self, node):
        self.generic_visit(node)
        if not self.in_assert or len(node.ops) != 1 or type(node.ops[0]) not in _OPS:
            return node
        left, right = node.left, node.comparators[0]
        lax = int(_is_wildcard(left)) | (int(_is_wildcard(right)) << 1)
        return _call("cmp", [ast.Constant(_OPS[type(node.ops[0])]), left, right, ast.Constant(lax)], node)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            if node.id in self.frozen:
                self.used.add("b:" + node.id)
                return _const("b:" + node.id, node)
            if node.id in self.pytest_names:
                self.used.add("p:" + self.pytest_names[node.id])
                return _const("p:" + self.pytest_names[node.id], node)
        return node

    def visit_Attribute(self, node):
        if isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name) and \
                node.value.id in self.pytest_modules and node.attr in self.pytest_api:
            self.used.add("p:" + node.attr)
            return _const("p:" + node.attr, node)
        self.generic_visit(node)
        return node


class _Returns(ast.NodeTransformer):
    """``return x`` -> ``sys.audit(END); return x`` within one function (nested scopes left alone)."""

    def visit_FunctionDef(self, node):
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node):
        return node

    def visit_Lambda(self, node):
        return node

    def visit_Return(self, node):
        return [_end(node), node]


def _end(at: ast.AST, event: str = END) -> ast.Expr:
    return ast.copy_location(ast.Expr(_call("audit", [ast.Constant(event)], at)), at)


def _mark_test(fn) -> None:
    body = []
    for stmt in fn.body:
        out = _Returns().visit(stmt)
        body.extend(out if isinstance(out, list) else [out])
    last = body[-1] if body else fn
    marker = _end(last)
    marker.lineno = marker.end_lineno = getattr(last, "end_lineno", fn.lineno) or fn.lineno
    docstring = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and \
        isinstance(body[0].value.value, str) else 0
    begin = _end(body[docstring] if len(body) > docstring else last, BEGIN)
    fn.body = body[:docstring] + [begin] + body[docstring:] + [marker]


def classes_of(mod: ast.Module) -> dict[str, tuple[set[str], list[str]]]:
    """``{class qualname: (names its own body defines, its bases written as plain names)}`` for the module's classes
    (nested ones too): what the recorder resolves an inherited test with."""
    out: dict[str, tuple[set[str], list[str]]] = {}

    def walk(body, prefix):
        for node in body:
            if isinstance(node, ast.ClassDef):
                q = prefix + node.name
                own = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                out[q] = (own, [b.id for b in node.bases if isinstance(b, ast.Name)])
                walk(node.body, q + ".")
    walk(mod.body, "")
    return out


def instrument(mod: ast.Module, truths: bool = True, pytest_api: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """Instrument a parsed test module in place; return the placeholders it uses (besides audit/cmp/truth).
    ``pytest_api``: the names of pytest's namespace that exist now (only those are frozen)."""
    pytest_modules, pytest_names = pytest_aliases(mod)
    frozen = set(FROZEN_BUILTINS) - bound_names(mod)
    visitor = _Instrument(frozen, pytest_modules, {k: v for k, v in pytest_names.items() if v in pytest_api},
                          truths, pytest_api)
    visitor.visit(mod)

    def tests(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                _mark_test(node)
            elif isinstance(node, ast.ClassDef):
                tests(node.body)
    tests(mod.body)
    at = 0
    if mod.body and isinstance(mod.body[0], ast.Expr) and isinstance(getattr(mod.body[0], "value", None),
                                                                      ast.Constant):
        at = 1  # keep the docstring first
    while at < len(mod.body) and isinstance(mod.body[at], ast.ImportFrom) and mod.body[at].module == "__future__":
        at += 1
    first = mod.body[at] if at < len(mod.body) else ast.Pass(lineno=1, col_offset=0)
    mod.body.insert(at, ast.copy_location(ast.Expr(_call("audit", [ast.Constant(MODULE)], first)), first))
    ast.fix_missing_locations(mod)
    return visitor.used


def bind(code: types.CodeType, objects: dict[str, object]) -> types.CodeType:
    """``code`` (and every code object inside it) with each placeholder constant replaced by its object."""
    def swap(c):
        if isinstance(c, types.CodeType):
            return bind(c, objects)
        if isinstance(c, str) and c.startswith(PLACEHOLDER):
            return objects[c[len(PLACEHOLDER):]]
        if type(c) in (tuple, frozenset):
            return type(c)(swap(x) for x in c)
        return c
    return code.replace(co_consts=tuple(swap(c) for c in code.co_consts))


def codes_in(code: types.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from codes_in(c)


def is_test_path(path: str) -> bool:
    """Test files: anything under a ``tests``/``test``/``testing`` directory, ``test_*.py``, ``*_test.py``,
    ``conftest.py``. (SWE-bench's rule, plus conftest files wherever they are.) The grader resets them to
    ``base_commit``: the agent's diff cannot change them."""
    parts = path.split("/")
    name = parts[-1]
    return (any(p in ("tests", "test", "testing") for p in parts[:-1]) or name == "conftest.py"
            or (name.startswith("test_") and name.endswith(".py")) or name.endswith("_test.py"))


def read_source(path: str, source: str | None) -> bytes | None:
    """``source`` (what the grader handed over) as bytes, else the file at ``path``; None when neither is there."""
    if source is not None:
        return source.encode("utf-8", errors="surrogateescape")
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def precompile(path: str, truths: bool, source: str | None = None) -> tuple[types.CodeType, dict] | None:
    """The instrumented, pytest-rewritten code of the test file at ``path`` (its text: ``source``, else the file),
    and its classes; None when it does not parse (pytest then reports the collection error itself)."""
    import pytest
    from _pytest.assertion.rewrite import rewrite_asserts

    data = read_source(path, source)
    try:
        tree = ast.parse(data, filename=path)
    except (TypeError, SyntaxError, ValueError):
        return None
    classes = classes_of(tree)
    used = instrument(tree, truths, {n for n in dir(pytest) if not n.startswith("_")})
    rewrite_asserts(tree, data, path, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "'str' object is not callable": the placeholders, swapped below
        code = compile(tree, path, "exec", dont_inherit=True)
    objects = {"audit": sys.audit, "cmp": cmp, "truth": truth}
    for key in used:
        kind, name = key.split(":", 1)
        objects[key] = vars(builtins)[name] if kind == "b" else getattr(pytest, name)
    return bind(code, objects), classes

