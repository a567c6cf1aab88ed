"""What ships in the package reads true to a user who installed it: no pointer into this repository's
``../shared/`` research folder (a pip user has no such folder; docs/ and upstream sources are where to point)."""
from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "envhub"


def shared_pointers(root: Path = PACKAGE) -> list[str]:
    return [f"{p.relative_to(root.parent)}:{i}" for p in sorted(root.rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if "../shared/" in line]


def test_no_shipped_module_points_at_the_shared_research_folder():
    assert shared_pointers() == []


def test_the_scan_finds_such_a_pointer(tmp_path):
    """Break-it: the same scan over a package holding one such docstring finds it."""
    pkg = tmp_path / "envhub"
    pkg.mkdir()
    (pkg / "m.py").write_text('"""See ``../shared/research/async_rl.md``."""\n')
    assert shared_pointers(pkg) == ["envhub/m.py:1"]
