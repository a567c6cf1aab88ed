"""Reading the JSON-lines files of a run directory (``trajectories.jsonl``, ``throughput.jsonl``) while the run
may still be appending to them."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_records(path: str | Path, name: str) -> list[Any]:
    """The JSON values, one per line, of ``path/name`` (or of ``path`` itself when it is a file). A line that does
    not parse -- the partial last line a kill mid-write leaves -- is skipped; a missing file reads as empty."""
    file = Path(path) / name if Path(path).is_dir() else Path(path)
    if not file.exists():
        return []
    out = []
    for line in file.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out
