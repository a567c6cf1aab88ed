"""The module graph of ``envhub/``: no import cycles at module level, and no heavy or plugin module imported by the
core packages at import time.

Module-level imports only: an import inside a function is the deliberate way this codebase defers heavy modules
(torch, transformers, uvicorn) to the code path that needs them, and runs after every module is defined. A cycle
at module level is a layering bug: one of the two modules sees the other half-defined.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "envhub"


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
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
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            for n in node.body if isinstance(node, ast.Try) else [node]:
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


def test_core_packages_import_no_trainer_env_or_gpu_module():
    """The gateway and harness packages (like ``envhub`` itself) load no torch, trainer, vLLM, env plugin or HTTP
    server at import time (the HTTP layer, ``envhub.gateway.app``, loads uvicorn when it is used)."""
    code = ("import sys, envhub, envhub.gateway, envhub.gateway.core, envhub.harness, envhub.harness.presets\n"
            "bad = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'vllm', 'openrlhf', "
            "'verl', 'ray', 'envhub_swe_gym', 'envhub_countdown', 'envhub_code_contests', 'uvicorn'})\n"
            "print(bad); assert not bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
