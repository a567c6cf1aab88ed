"""The module graph of ``envhub/``: no import cycles at module level, and no heavy or plugin module imported by the
core packages at import time.

A cycle at module level is a bug: one of the two modules sees the other half-defined. Imports inside functions
(the deliberate way this codebase defers heavy modules such as torch or uvicorn to the code path that needs them)
cannot break that way, but a cycle through them is still a layering bug: a low layer calling up into a higher one
(the sandbox into the plugin hub, a trajectory into the fidelity checker). Both graphs must be acyclic; imports under
``if TYPE_CHECKING:`` are annotations only and do not count.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "envhub"


def _imports(tree: ast.Module, deferred: bool) -> list[ast.stmt]:
    """Import statements at module level (and in ``try``), or anywhere when ``deferred``; never TYPE_CHECKING ones."""
    found: list[ast.stmt] = []

    def visit(nodes: list[ast.stmt], top: bool) -> None:
        for n in nodes:
            if isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test):
                visit(n.orelse, top)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                found.append(n)
            elif isinstance(n, ast.Try) and top:
                visit(n.body, top)
            elif deferred:
                for child in ast.iter_child_nodes(n):
                    if isinstance(child, ast.stmt):
                        visit([child], False)
                    else:
                        visit([s for s in ast.walk(child) if isinstance(s, (ast.Import, ast.ImportFrom))], False)

    visit(tree.body, True)
    return found


def module_graph(root: Path = ROOT, deferred: bool = False) -> dict[str, set[str]]:
    mods = {}
    for p in root.rglob("*.py"):
        if "scaffold_template" in p.parts:
            continue
        parts = p.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = p
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        targets: set[str] = set()
        for n in _imports(ast.parse(path.read_text()), deferred):
            if isinstance(n, ast.Import):
                targets |= {a.name for a in n.names}
            elif isinstance(n, ast.ImportFrom):
                base = n.module or ""
                if n.level:
                    base = ".".join(pkg.split(".")[: len(pkg.split(".")) - n.level + 1] + ([base] if base else []))
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in n.names}
        graph[name] = {t if t in mods else t.rsplit(".", 1)[0] for t in targets if t.split(".")[0] == "envhub"}
        graph[name] = {t for t in graph[name] if t in mods and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_at_module_level():
    graph = module_graph()
    assert len(graph) > 100  # the walk really found the package
    assert cycles(graph) == []


def test_no_import_cycles_even_through_deferred_imports():
    graph = module_graph(deferred=True)
    assert len(graph) > 100
    assert cycles(graph) == []


# The layers of ``envhub/`` (../shared/DESIGN.md, "Layers point one way"), lowest first: a package may import its own
# layer and those below, at module level or deferred, never one above. ``http`` sits beneath both servers.
LAYERS = [
    {"types", "arguments", "spaces", "fdlimit", "failurelog", "testing", "astguard"},
    {"verifier", "policy", "http", "rewards"},
    {"env", "task"},
    {"spec", "probes", "grading", "judgeprobes"},
    {"hookspecs", "hookrelay", "plugins", "(root)", "admission", "admission_report"},
    {"sandbox", "tools", "registry", "scaffold"},
    {"codec", "backends", "judging"},
    {"rollout"},
    {"gateway"},
    {"harness"},
    {"service", "training"},
    {"cli"},
]
# The one arrow that runs up, and why (docs/decisions.md, "#27: layers"): ``ToolEnv.reset`` starts the env's own
# sandbox, lazily, so a plain text env never loads the sandbox layer.
UPWARD_ALLOWED = {("env", "sandbox")}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def upward_imports(graph: dict[str, set[str]]) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """``{(lower package, higher package): [(module, module imported)...]}`` for every import that runs up."""
    rank = {p: i for i, layer in enumerate(LAYERS) for p in layer}
    out: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for module, targets in graph.items():
        for target in targets:
            a, b = package_of(module), package_of(target)
            if a != b and rank[a] < rank[b]:
                out.setdefault((a, b), []).append((module, target))
    return out


def test_layers_point_one_way():
    graph = module_graph(deferred=True)
    known = {p for layer in LAYERS for p in layer}
    assert {package_of(m) for m in graph} <= known, "a new package: give it a layer in LAYERS"
    up = upward_imports(graph)
    assert set(up) <= UPWARD_ALLOWED, {k: v for k, v in up.items() if k not in UPWARD_ALLOWED}


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The packages' graph (an edge where any module of one imports any module of the other), without the allowed
    upward arrows."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        a = package_of(module)
        out.setdefault(a, set()).update(b for b in map(package_of, targets) if b != a and (a, b) not in UPWARD_ALLOWED)
    return out


def test_no_loops_between_packages():
    """Peers of one layer do not import each other both ways (the service and the trainer side used to)."""
    assert cycles(package_graph(module_graph(deferred=True))) == []


def test_the_layer_check_finds_an_import_that_runs_up(tmp_path):
    """The test above can fail: a sandbox module importing the rollout layer, even inside a function, is reported."""
    pkg = tmp_path / "envhub"
    for sub in ("sandbox", "rollout"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "rollout" / "executor.py").write_text("from envhub.sandbox import start\n")
    (pkg / "sandbox" / "pool.py").write_text("def f():\n    from envhub.rollout import executor\n")
    graph = module_graph(pkg, deferred=True)
    assert upward_imports(graph) == {("sandbox", "rollout"): [("envhub.sandbox.pool", "envhub.rollout.executor")]}
    assert cycles(package_graph(graph)) == [["rollout", "sandbox"]]


def test_the_cycle_finder_finds_a_cycle(tmp_path):
    """The test above can fail: two modules importing each other are reported."""
    pkg = tmp_path / "envhub"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text("from envhub.sub.b import B\nA = 1\n")
    (pkg / "sub" / "b.py").write_text("from . import a\nB = 2\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    from envhub.sub import a\n")  # function-level: not an edge
    assert cycles(module_graph(pkg)) == [["envhub.sub.a", "envhub.sub.b"]]
    # a low module calling up at function level closes a cycle in the deferred graph only
    (pkg / "sub" / "b.py").write_text("B = 2\n")
    (pkg / "sub" / "d.py").write_text("from envhub.sub.c import f\n")
    (pkg / "sub" / "c.py").write_text("def f():\n    if True:\n        from envhub.sub import d\n")
    (pkg / "sub" / "e.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from envhub.sub.f import F\n")
    (pkg / "sub" / "f.py").write_text("from envhub.sub.e import E\n")  # e -> f only for annotations: no edge
    assert cycles(module_graph(pkg)) == []
    assert cycles(module_graph(pkg, deferred=True)) == [["envhub.sub.c", "envhub.sub.d"]]


def test_core_packages_import_no_trainer_env_or_gpu_module():
    """The gateway and harness packages (like ``envhub`` itself) load no torch, trainer, vLLM, env plugin or HTTP
    server at import time (the HTTP layer, ``envhub.gateway.app``, loads uvicorn when it is used)."""
    code = ("import sys, envhub, envhub.gateway, envhub.gateway.core, envhub.harness, envhub.harness.presets\n"
            "bad = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'vllm', 'openrlhf', "
            "'verl', 'ray', 'envhub_swe_gym', 'envhub_countdown', 'envhub_code_contests', 'uvicorn'})\n"
            "print(bad); assert not bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
