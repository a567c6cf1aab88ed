"""Print the longest test modules of a pytest JUnit XML report: under ``--dist loadscope`` a module runs on one
xdist worker, so the longest module is a floor under the tier's wall time (scripts/test-all.sh prints this after
the main tier; #27's "which tests cost the time").

    python scripts/lanes.py .test-logs/main.xml [N]
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import defaultdict


def main() -> None:
    path, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12
    per_module: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for case in ET.parse(path).iter("testcase"):
        module = case.get("classname", "?").split("::")[0]
        module = module.rsplit(".", 1)[0] if module.split(".")[-1][:1].isupper() else module  # a test class
        per_module[module] += float(case.get("time") or 0.0)
        count[module] += 1
    total = sum(per_module.values())
    print(f"test seconds in all: {total:.0f} over {len(per_module)} modules; the longest modules (one worker each):")
    for module, secs in sorted(per_module.items(), key=lambda kv: -kv[1])[:n]:
        print(f"{secs:8.1f} s  {count[module]:4d} tests  {module}")


if __name__ == "__main__":
    main()
