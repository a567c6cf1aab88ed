"""A rollout run on disk: ``envhub rollout --out DIR`` writes it, ``check-trajectory`` and ``envhub show`` read it.

Layout of a run directory::

    DIR/run.json            what made it: command, model, tokenizer, sampling, envs (id, version, distribution,
                            registry sha256), started/finished, interrupted, and the summary once there is one
    DIR/trajectories.jsonl  one JSON line per *finished* trajectory, appended and flushed as each one finishes
    DIR/throughput.jsonl    the throughput figures over time, one JSON line per snapshot (``envhub rollout`` every
                            few seconds, ``envhub top --record DIR`` every poll): ``envhub show DIR --plot``

Appending one line per trajectory is what makes a run survive a crash or Ctrl-C: everything that finished is on
disk, and ``--resume`` skips those (task_id, sample) pairs. A partially written last line (a kill mid-write) is
ignored on reading, never fatal.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import click

from envhub.rollout.runfile import read_records

META = "run.json"
TRAJECTORIES = "trajectories.jsonl"
SERIES = "throughput.jsonl"  # the run's throughput figures over time (envhub.rollout.livepoll.SERIES)
# what must match for --resume to add to a run (the rest, e.g. concurrency or timeout, may change between tries)
RESUME_KEYS = ("env_id", "model", "tokenizer", "sampling", "max_turns", "max_length", "split", "samples",
               "harness")


def is_run(path: str | Path) -> bool:
    return (Path(path) / META).is_file()


def read_meta(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads((Path(path) / META).read_text())
    except (OSError, ValueError) as e:
        raise click.ClickException(f"{path} is not a readable envhub run ({META}: {e})") from None


def read_lines(path: str | Path) -> list[dict[str, Any]]:
    """The trajectory dicts of a run (a truncated last line, left by a kill mid-write, is skipped)."""
    return read_records(path, TRAJECTORIES)


def key_of(traj_dict: dict[str, Any]) -> tuple[str, int]:
    return str(traj_dict.get("task_id")), int((traj_dict.get("details") or {}).get("sample", 0))


class RunWriter:
    """Opens (or resumes) a run directory and appends trajectories to it as they finish.

    Constructing it only *checks* ``--out`` (refused, resumed or replaced; a resume must be the same run) and writes
    nothing, so the command checks it before the model's weights load; :meth:`open` then writes ``run.json`` and
    opens the trajectories for appending. A bad ``--out`` is reported at once and leaves nothing behind."""

    def __init__(self, path: str | Path, meta: dict[str, Any], *, resume: bool = False, overwrite: bool = False):
        self.path = Path(path)
        self.done: set[tuple[str, int]] = set()
        self.overwrite = False
        if resume and overwrite:
            raise click.UsageError("--resume and --overwrite exclude each other")
        if self.path.exists() and not self.path.is_dir():
            raise click.UsageError(f"--out {self.path} is a file, not a run directory")
        occupied = self.path.is_dir() and any(self.path.iterdir())
        if occupied and not (resume or overwrite):
            raise click.UsageError(f"--out {self.path} already holds a run: pass --resume to finish it (done "
                                   "rollouts are skipped) or --overwrite to replace it")
        if occupied and not is_run(self.path):
            raise click.UsageError(f"--out {self.path} is a non-empty directory that is not an envhub run: "
                                   "refusing to write into (or replace) it")
        if occupied and overwrite:
            self.overwrite = True
        elif occupied and resume:
            old = read_meta(self.path)
            differ = [k for k in RESUME_KEYS if old.get(k) != meta.get(k)]
            if differ:
                diff = "; ".join(f"{k}: run has {old.get(k)!r}, now {meta.get(k)!r}" for k in differ)
                raise click.UsageError(f"--resume {self.path}: not the same run ({diff})")
            self.done = {key_of(d) for d in read_lines(self.path)}
            meta = {**old, **meta, "started": old.get("started", meta.get("started")),
                    "resumed": [*old.get("resumed", []), meta.get("started")]}
        self.meta = meta
        self._file: Any = None

    def open(self, **updates: Any) -> "RunWriter":
        """Write ``run.json`` (with ``updates``: what is known once the model loaded) and open the trajectories for
        appending. A partial last line (a kill mid-write) is cut off first: appended to, it would swallow the next
        trajectory."""
        if self.overwrite:
            for name in (META, TRAJECTORIES, SERIES):
                (self.path / name).unlink(missing_ok=True)
        self.path.mkdir(parents=True, exist_ok=True)
        self.write_meta(**updates)
        _cut_partial_line(self.path / TRAJECTORIES)
        self._file = open(self.path / TRAJECTORIES, "a")
        return self

    def append(self, *trajs) -> None:
        """Finished trajectories (one rollout's: a harness episode gives one per chain), written in one write and
        flushed at once (a crash after this call keeps them)."""
        self._file.write("".join(t.to_json() + "\n" for t in trajs))
        self._file.flush()

    def write_meta(self, **updates: Any) -> None:
        self.meta.update(updates)
        tmp = self.path / (META + ".tmp")
        tmp.write_text(json.dumps(self.meta, indent=2, default=str) + "\n")
        os.replace(tmp, self.path / META)  # never a half-written run.json

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _cut_partial_line(file: Path) -> None:
    """Truncate ``file`` after its last newline (each trajectory is one line written with its newline), reading
    only its tail."""
    try:
        f = open(file, "rb+")
    except FileNotFoundError:
        return
    with f:
        pos = f.seek(0, os.SEEK_END)
        if pos == 0:
            return
        f.seek(pos - 1)
        if f.read(1) == b"\n":
            return
        while pos > 0:
            step = min(1 << 16, pos)
            pos -= step
            f.seek(pos)
            nl = f.read(step).rfind(b"\n")
            if nl >= 0:
                f.truncate(pos + nl + 1)
                return
        f.truncate(0)


def env_meta(spec) -> dict[str, Any]:
    """What identifies the env a run used: id, version, distribution, and the hub's sha256 for that version."""
    out: dict[str, Any] = {"id": spec.id, "version": spec.version, "distribution": spec.distribution}
    try:
        import importlib.metadata as md

        out["distribution_version"] = md.version(spec.distribution) if spec.distribution else None
    except Exception:  # an in-process or source-tree plugin has no installed distribution
        out["distribution_version"] = None
    try:
        from envhub.registry.layers import load_index

        entry = load_index().entries.get(spec.id)
        out["registry_sha256"] = entry.sha256 if entry and entry.version == spec.version else None
    except Exception:  # no registry reachable: the run is still valid, just not tied to a hub entry
        out["registry_sha256"] = None
    return out


def started_meta(**fields: Any) -> dict[str, Any]:
    return {"envhub_run": 1, "command": sys.argv[:], "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            **fields}


# ---- envhub show ------------------------------------------------------------------------------------------------
@click.command("show")
@click.argument("run", type=click.Path(exists=True))
@click.option("--index", "-i", type=int, default=None, help="Which trajectory (default: a table of all).")
@click.option("--json", "as_json", is_flag=True, help="Print the trajectory (or the run's metadata) as JSON.")
@click.option("--plot", is_flag=True, help="Chart the run's rates and idle ratios over time (throughput.jsonl).")
@click.option("--plot-file", type=click.Path(dir_okay=False), default=None,
              help="Write that chart as an SVG image to this file (its name ends in .svg).")
def show_cmd(run: str, index: int | None, as_json: bool, plot: bool, plot_file: str | None) -> None:
    """Print a saved run: its metadata and a table of trajectories, or one conversation with --index; --plot
    charts its throughput over time."""
    if plot_file and Path(plot_file).suffix.lower() != ".svg":
        # the image is SVG (hand-written, no plotting library): an SVG under out.png opens as a broken PNG
        raise click.BadParameter(f"{plot_file}: the chart is written as SVG; give a file name ending in .svg",
                                 param_hint="--plot-file")
    if plot or plot_file:
        return _plot(run, plot, plot_file)
    from rich.console import Console
    from rich.table import Table

    console = Console()
    meta = read_meta(run) if Path(run).is_dir() else {}
    rows = read_lines(run)
    if index is None:
        if as_json:
            click.echo(json.dumps({"meta": meta, "trajectories": len(rows)}, indent=2, default=str))
            return
        if meta:
            console.print(f"[bold]{meta.get('env_id')}[/] with {meta.get('model')} (tokenizer {meta.get('tokenizer')}),"
                          f" started {meta.get('started')}{' [yellow](interrupted)[/]' if meta.get('interrupted') else ''}")
        table = Table(title=f"{len(rows)} trajectories", title_justify="left")
        for col in ("#", "task", "sample", "finish", "reward", "turns"):
            table.add_column(col)
        for i, d in enumerate(rows):
            table.add_row(str(i), str(d.get("task_id")), str(key_of(d)[1]), str(d.get("finish_reason")),
                          f"{float(d.get('reward') or 0):.3f}", str(d.get("num_turns")))
        console.print(table)
        return
    if not -len(rows) <= index < len(rows):
        raise click.ClickException(f"--index {index} is out of range: {run} holds {len(rows)} trajectories")
    d = rows[index]
    if as_json:
        click.echo(json.dumps(d, indent=2))
        return
    console.print(f"[bold]trajectory {index}[/]: {d.get('env_id')} / task {d.get('task_id')} "
                  f"(sample {key_of(d)[1]})")
    for m in d.get("messages") or []:
        role = m.get("role", "?")
        console.rule(f"[bold]{role}[/]" + (f" ({m['name']})" if m.get("name") else ""), align="left")
        if m.get("content"):
            console.print(str(m["content"]), markup=False, highlight=False)
        for call in m.get("tool_calls") or []:
            fn = call.get("function", call)
            console.print(f"-> tool call {fn.get('name')}({fn.get('arguments')})", markup=False, highlight=False)
    console.rule(align="left")
    verdict = "passed" if d.get("passed") else "not passed"
    console.print(f"reward {float(d.get('reward') or 0):.3f} ({verdict}), finish {d.get('finish_reason')}, "
                  f"turns {d.get('num_turns')}", markup=False)
    reason = (d.get("details") or {}).get("reason") or (d.get("details") or {}).get("verdict")
    if reason:
        console.print(f"reason: {reason}", markup=False)
    if d.get("error"):
        console.print(f"error: {d['error']}", markup=False)


def _plot(run: str, show: bool, path: str | None) -> None:
    """``--plot`` / ``--plot-file``: the run's ``throughput.jsonl`` as a terminal chart and/or an SVG."""
    import shutil

    from envhub.cli.plot import svg, text_chart
    from envhub.rollout.livepoll import read_series

    lines = read_series(run)
    if not lines:
        raise click.ClickException(f"{run} holds no throughput series ({SERIES}): record one with `envhub top URL "
                                   "--record RUN` (or envhub.rollout.livepoll.Recorder) while the run goes")
    if show:
        width = max(40, min(160, shutil.get_terminal_size((100, 40)).columns - 12))
        click.echo("\n".join(text_chart(lines, width=width)))
    if path:
        meta = read_meta(run) if is_run(run) else {}
        title = f"envhub throughput: {meta.get('env_id') or Path(run).name}"
        tmp = Path(path).with_name(Path(path).name + ".tmp")
        tmp.write_text(svg(lines, title=title))
        os.replace(tmp, path)  # never a half-written image
        click.echo(f"wrote {path} ({len(lines)} snapshots)")


def remove_own_sandboxes() -> int:
    """Last-resort cleanup before an immediate exit: kill this process's children (bwrap and what runs in it) and
    remove the sandbox state directories this process owns. Returns how many directories it removed."""
    import signal

    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            if int(stat[stat.rindex(b")") + 2:].split()[1]) == me:
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError):
            continue
    from envhub.sandbox.common import sandbox_root

    removed = 0
    root = sandbox_root()
    for name in os.listdir(root):
        d = os.path.join(root, name)
        try:
            with open(os.path.join(d, "owner")) as f:
                if int(f.read().split()[0]) != me:
                    continue
        except (OSError, ValueError, IndexError):
            continue
        from envhub.sandbox import quota

        quota.unmount_under(d)
        shutil.rmtree(d, ignore_errors=True)
        removed += 1
    return removed
