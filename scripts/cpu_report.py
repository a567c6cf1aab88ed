"""Rank the tests and modules that cost the CPU, from the log tests/conftest.py writes when ENVHUB_TEST_CPU_LOG is
set (one line per test: node id, own CPU s, reaped children's CPU s, wall s, and the worker's cgroup CPU s or "-").
On 2 cores the main tier is CPU-bound, so CPU seconds, not wall seconds, say what shortens it (#27). Where the
cgroup column is there it is the figure ranked (it includes sandboxed processes, which the reaped children miss);
the "not seen" column is what the cgroup saw beyond this process and its reaped children: mostly sandboxes.

    python scripts/cpu_report.py .test-logs/main.cpu [N]
"""
from __future__ import annotations

import sys
from collections import defaultdict
from typing import NamedTuple


class Row(NamedTuple):
    node: str
    own: float
    kids: float
    wall: float
    group: float | None

    @property
    def total(self) -> float:
        return self.group if self.group is not None else self.own + self.kids

    @property
    def unseen(self) -> float:
        return max(0.0, self.total - self.own - self.kids)


def read(path: str) -> list[Row]:
    rows = []
    for line in open(path):
        node, own, kids, wall, *rest = line.rstrip("\n").split("\t")
        group = float(rest[0]) if rest and rest[0] != "-" else None
        rows.append(Row(node, float(own), float(kids), float(wall), group))
    return rows


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 25
    rows = read(path)
    per_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for r in rows:
        m = per_module[r.node.split("::")[0]]
        m[0] += r.total
        m[1] += r.own
        m[2] += r.kids
        m[3] += 1
    grouped = any(r.group is not None for r in rows)
    print(f"CPU in all: {sum(r.total for r in rows):.0f} s over {len(rows)} tests "
          f"({sum(r.own for r in rows):.0f} s in the pytest workers, {sum(r.kids for r in rows):.0f} s in the "
          f"children they reaped" + (f", {sum(r.unseen for r in rows):.0f} s in processes only the workers' "
                                      "cgroups saw: sandboxes)" if grouped else "; sandboxes not counted)"))
    print(f"the {n} CPU-heaviest modules (CPU s = workers + reaped children + the rest, tests):")
    for module, (total, own, kids, count) in sorted(per_module.items(), key=lambda kv: -kv[1][0])[:n]:
        print(f"{total:8.1f} s = {own:7.1f} + {kids:7.1f} + {total - own - kids:7.1f}  {int(count):4d}  {module}")
    print(f"the {n} CPU-heaviest tests (CPU s = worker + reaped children + the rest, wall s):")
    for r in sorted(rows, key=lambda r: -r.total)[:n]:
        print(f"{r.total:8.1f} s = {r.own:7.1f} + {r.kids:7.1f} + {r.unseen:7.1f}  wall {r.wall:7.1f}  {r.node}")


if __name__ == "__main__":
    main()
