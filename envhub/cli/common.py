"""Helpers shared by the CLI commands."""
from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console

console = Console()
err_console = Console(stderr=True)


def resolve_spec(target: str):
    """An env id (installed plugin) or a path to a plugin source directory -> its EnvSpec."""
    from envhub.plugins import PluginError, UnknownEnv, default_hub, load_path

    try:
        if Path(target).is_dir():
            specs = load_path(target)
            if len(specs) > 1:
                console.print(f"[yellow]{target} registers {len(specs)} envs; using {specs[0].id}[/]")
            return specs[0]
        return default_hub().get(target)
    except (UnknownEnv, PluginError) as e:
        raise click.ClickException(str(e)) from None


def load_tasks(spec, split: str | None = None) -> list:
    """The env's task rows, or a one-line error naming the file and line of a bad row (a malformed JSON line, a
    missing or duplicate ``task_id``): an author's mistake is reported where it is, never as a traceback."""
    from envhub.task import TaskFileError

    try:
        rows = [dict(r) for r in spec.load_tasks(split)]
    except (TaskFileError, FileNotFoundError) as e:
        raise click.ClickException(f"{spec.id}: {e}") from None
    seen: set = set()
    for i, row in enumerate(rows):  # tasks a plugin builds in code, not from a file, get the same check
        tid = row.get("task_id")
        if tid in seen:
            raise click.ClickException(f"{spec.id}: duplicate task_id {tid!r} (row {i} of split "
                                       f"{split or spec.default_split!r}): task ids must be unique")
        seen.add(tid)
    return rows
