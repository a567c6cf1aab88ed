"""Rank the tests and modules that cost the CPU, from the log tests/conftest.py writes when ENVHUB_TEST_CPU_LOG is
set (one line per test: node id, own CPU s, reaped children's CPU s, wall s). On 2 cores the main tier is CPU-bound,
so CPU seconds, not wall seconds, say what shortens it (#27).

    python scripts/cpu_report.py .test-logs/main.cpu [N]
"""
from __future__ import annotations

import sys
from collections import defaultdict


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25
    rows = []
    for line in open(path):
        node, own, kids, wall = line.rstrip("\n").split("\t")
        rows.append((node, float(own), float(kids), float(wall)))
    per_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for node, own, kids, _ in rows:
        m = per_module[node.split("::")[0]]
        m[0] += own
        m[1] += kids
        m[2] += 1
    total_own, total_kids = sum(r[1] for r in rows), sum(r[2] for r in rows)
    print(f"CPU in all: {total_own + total_kids:.0f} s over {len(rows)} tests "
          f"({total_own:.0f} s in the pytest workers, {total_kids:.0f} s in their children)")
    print(f"the {n} CPU-heaviest modules (CPU s = workers + children, tests):")
    for module, (own, kids, count) in sorted(per_module.items(), key=lambda kv: -(kv[1][0] + kv[1][1]))[:n]:
        print(f"{own + kids:8.1f} s = {own:7.1f} + {kids:7.1f}  {int(count):4d}  {module}")
    print(f"the {n} CPU-heaviest tests (CPU s = worker + children, wall s):")
    for node, own, kids, wall in sorted(rows, key=lambda r: -(r[1] + r[2]))[:n]:
        print(f"{own + kids:8.1f} s = {own:7.1f} + {kids:7.1f}  wall {wall:7.1f}  {node}")


if __name__ == "__main__":
    main()
