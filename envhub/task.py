"""Task rows and task sets.

A task is one row (a dict with a string ``task_id``); a task set is a ``datasets.Dataset``. Plugins generate their
tasks from a seed and ship the split as JSON lines under ``data/``; :func:`load_jsonl` reads it back through
``datasets`` so a hub dataset and a shipped file take the same path. ``datasets`` is imported lazily (it is slow).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from envhub.env import Task


def to_dataset(rows: Iterable[Task]):
    """A ``datasets.Dataset`` from task rows; every row must have a unique string ``task_id``."""
    import datasets

    rows = [dict(r) for r in rows]
    seen: set[str] = set()
    for r in rows:
        tid = r.get("task_id")
        if not isinstance(tid, str) or not tid:
            raise ValueError(f"every task needs a non-empty string task_id; got {tid!r} in {str(r)[:200]}")
        if tid in seen:
            raise ValueError(f"duplicate task_id {tid!r}")
        seen.add(tid)
    return datasets.Dataset.from_list(rows)


def save_jsonl(rows: Iterable[Task], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in rows:
            f.write(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n")
    return path


class TaskFileError(ValueError):
    """A task file has a row that cannot be a task; the message names the file and the line."""


def read_rows(path: str | Path) -> list[Task]:
    """The rows of a JSON-lines task file, checked as an author needs: a malformed line, a row that is not an
    object, a missing or non-string ``task_id`` and a duplicate ``task_id`` are each a :class:`TaskFileError`
    naming ``file:line`` (a duplicate names both lines)."""
    path = Path(path)
    rows: list[Task] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise TaskFileError(f"{path}:{lineno}: not valid JSON ({e.msg} at column {e.colno}): "
                                f"{line[:120]!r}") from None
        if not isinstance(row, dict):
            raise TaskFileError(f"{path}:{lineno}: a task row must be a JSON object, got {type(row).__name__}")
        tid = row.get("task_id")
        if not isinstance(tid, str) or not tid:
            raise TaskFileError(f"{path}:{lineno}: every task needs a non-empty string task_id; got {tid!r}")
        if tid in first_line:
            raise TaskFileError(f"{path}:{lineno}: duplicate task_id {tid!r} (first at line {first_line[tid]})")
        first_line[tid] = lineno
        rows.append(row)
    return rows


def load_jsonl(path: str | Path):
    """Load a shipped split as a ``datasets.Dataset`` (rows in file order; see :func:`read_rows` for the checks)."""
    import datasets

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task file {path} is missing: regenerate it with the plugin's generator")
    return datasets.Dataset.from_list(read_rows(path))


def select(tasks: Any, n: int | None = None, ids: list[str] | None = None) -> list[Task]:
    """The first ``n`` rows, or the rows with the given ``ids`` (in that order), as plain dicts."""
    rows = [dict(r) for r in tasks]
    if ids:
        by_id = {r["task_id"]: r for r in rows}
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            raise KeyError(f"unknown task id(s): {', '.join(unknown[:5])}")
        rows = [by_id[i] for i in ids]
    return rows if n is None else rows[:n]
