"""``envhub validate ID|PATH``: run admission and print a table and a JSON report."""
from __future__ import annotations

from pathlib import Path

import click
from rich.table import Table

from envhub.cli.common import console, load_tasks, resolve_spec


def _mark(ok: bool) -> str:
    return "[green]ok[/]" if ok else "[red]FAIL[/]"


def report_table(report) -> Table:
    table = Table(title=f"admission: {report.env_id} {report.version}", show_lines=False)
    for col in ("task", "golden", "noop", "replay", "malformed", "hacks", "probes", "regrade", "status"):
        table.add_column(col)
    for t in report.tasks:
        by = {c.name: c for c in t.checks}
        groups = {g: [c for c in t.checks if c.name.startswith(g + ":") and c.status != "skip"]
                  for g in ("malformed", "hack", "probe")}
        cell = lambda cs: "-" if not cs else (f"[green]{len(cs)}/{len(cs)}[/]" if all(c.ok for c in cs)
                                              else f"[red]{sum(c.ok for c in cs)}/{len(cs)}[/]")
        status = "[green]admitted[/]" if t.admitted else "[red]quarantined[/]"
        table.add_row(t.task_id, _mark(by["golden"].ok), _mark(by["noop"].ok), _mark(by["deterministic"].ok),
                      cell(groups["malformed"]), cell(groups["hack"]), cell(groups["probe"]), _mark(by["regrade"].ok),
                      status)
    return table


@click.command("validate")
@click.argument("target")
@click.option("--tasks", "n", type=int, default=None, help="Check only the first N tasks.")
@click.option("--split", default=None, help="Task split (default: the env's default split).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False), default=None, help="Write the JSON report here.")
@click.option("--concurrency", "-c", type=int, default=4, show_default=True, help="Episodes run at once.")
@click.option("--strict", is_flag=True, help="Also fail when any task is quarantined, and treat warnings (no hack "
              "probes declared) as unfit.")
@click.option("--regrades", type=int, default=None, help="Re-grading calls per env run, at least (default 2000; "
              "more catches rarer leaks: see envhub.grading).")
@click.option("--grade-timeout", type=float, default=None, help="Seconds one verify() call may take (default 300).")
@click.option("--harness", default=None, help="Play the golden, the no-op and the env's hack probes through this "
              "agent CLI instead (see docs/gateway.md).")
@click.option("--probe", "probes", multiple=True, help="With --harness: play only this hack probe (repeatable; "
              "default: every probe the env declares).")
def validate_cmd(target: str, n: int | None, split: str | None, json_out: str | None, concurrency: int,
                 strict: bool, regrades: int | None, grade_timeout: float | None, harness: str | None,
                 probes: tuple[str, ...]) -> None:
    """Admission for an env (installed id or plugin source PATH): golden passes, no-op fails, replays agree,
    malformed actions are handled, hack probes and the built-in probes fail, re-grades agree. Exits 1 when the
    verifier is unfit."""
    from rich.progress import Progress

    from envhub.admission import admit
    from envhub.grading import Budget

    spec = resolve_spec(target)
    if harness:
        from envhub.cli import harness as harness_cli

        return harness_cli.validate(spec, harness, n, split, probes=list(probes) or None,
                                    concurrency=min(concurrency, 2), json_out=json_out)
    if probes:
        raise click.UsageError("--probe picks the hack probes played through a harness: it needs --harness")
    rows = load_tasks(spec, split)  # a bad task file is one clear line here, not a traceback inside admission
    total = len(rows) if n is None else min(n, len(rows))
    with Progress(console=console, transient=True) as progress:
        bar = progress.add_task(f"admitting {spec.id}", total=total)
        budget = Budget()
        budget.min_total = budget.min_total if regrades is None else regrades
        budget.grade_timeout_s = budget.grade_timeout_s if grade_timeout is None else grade_timeout
        report = admit(spec, n=n, split=split, concurrency=concurrency, strict=strict, budget=budget,
                       progress=lambda _: progress.advance(bar))
    console.print(report_table(report))
    for task_id, reasons in report.quarantined.items():
        console.print(f"[red]quarantined[/] {task_id}: " + "; ".join(r.splitlines()[0][:300] for r in reasons))
    if json_out:
        Path(json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(json_out).write_text(report.to_json())
        console.print(f"report written to {json_out}")
    for warning in report.warnings:
        console.print(f"[yellow]warning[/] {warning}")
    rg = report.regrade_summary()
    console.print(f"re-grading: {rg['calls']} calls, {rg['must_fail_calls']} on must-fail artifacts (a 0.5% per-call "
                  f"leak is caught with probability {rg['leak_detection']['0.5%']:.1%})")
    verdict = "[green]FIT[/]" if report.fit else "[red]UNFIT[/]: " + "; ".join(report.unfit_reasons)
    console.print(f"{spec.id}: {report.passed}/{len(report.tasks)} tasks admitted in {report.duration_s:.1f}s; "
                  f"verifier {verdict}")
    if not report.fit or (strict and report.quarantined):
        raise SystemExit(1)
