"""``envhub rollout ENV --harness NAME`` and ``envhub validate ENV --harness NAME``: an unmodified agent CLI on an
envhub task set, its model calls served (and recorded) by the gateway (:mod:`envhub.harness`)."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import click
from rich.table import Table

from envhub.cli.common import console, load_tasks


SCRIPTED_MAX_TOKENS = 16384


def _runner(spec: Any, preset: Any, model: str, tokenizer: Any, commands: Any, max_tokens: int) -> Any:
    """A HarnessRunner over ``model`` (``golden``: the scripted player of ``commands(task)``); ``tokenizer`` is a
    name, a path, a loaded tokenizer or None (the default)."""
    from envhub.gateway import Gateway
    from envhub.harness.episode import HarnessRunner

    if model == "golden":
        from envhub.backends.scripted import ScriptedBackend
        from envhub.harness.presets import scripted

        backend, tok = ScriptedBackend(scripted(preset, commands)), _tokenizer(tokenizer)
    else:
        from envhub.cli.common import load_backend

        backend, tok, _ = load_backend(model, spec, tokenizer)
    return HarnessRunner(Gateway(backend, tok, default_max_tokens=max_tokens))


def _tokenizer(tokenizer: Any) -> Any:
    if tokenizer is not None and not isinstance(tokenizer, str):
        return tokenizer
    from envhub.cli.common import default_tokenizer, load_tokenizer_named

    return load_tokenizer_named(tokenizer or default_tokenizer(), "--tokenizer" if tokenizer else "the default tokenizer")


def _preset(harness: str) -> Any:
    from envhub.harness.presets import HarnessNotInstalled, get_preset

    try:
        preset = get_preset(harness)
        preset.check_installed()
    except (ValueError, HarnessNotInstalled) as e:
        raise click.ClickException(str(e)) from None
    return preset


def run_episodes(spec: Any, harness: str, *, model: str = "golden", tokenizer: Any = None, n: int = 2,
                 split: str | None = None, timeout: float = 600.0, max_calls: int = 60, concurrency: int = 1,
                 max_tokens: int = 1024, noop: bool = False, commands: Any = None,
                 tasks: list[dict] | None = None, on_done: Any = None) -> list[tuple[dict, list]]:
    """``[(task, trajectories)]`` for ``tasks`` (default: the first ``n`` of the split). With ``model="golden"`` the
    scripted player plays ``commands(task)`` (default: the golden; ``noop``: the scripted no-op). ``on_done(task,
    trajectories)`` is called as each episode finishes (from a worker thread)."""
    from envhub.harness.presets import golden_commands, noop_commands

    preset = _preset(harness)
    tasks = load_tasks(spec, split)[:n] if tasks is None else tasks
    commands = commands or (noop_commands if noop else golden_commands)
    runner = _runner(spec, preset, model, tokenizer, commands, max_tokens)

    def one(task: dict) -> list:
        trajs = runner.run(spec, preset, task, timeout_s=timeout, max_calls=max_calls)
        if on_done is not None:
            on_done(task, trajs)
        return trajs

    try:
        with ThreadPoolExecutor(max(1, concurrency)) as pool:
            results = list(pool.map(one, tasks))
    finally:
        runner.close()
    return list(zip(tasks, results))


def episodes_table(title: str, results: list[tuple[dict, list]]) -> Table:
    table = Table(title=title)
    for col in ("task", "reward", "chains", "calls", "harness exit", "wall s", "outcome"):
        table.add_column(col)
    for task, trajs in results:
        t = trajs[0]
        ex = t.details.get("harness_exit", {})
        table.add_row(str(task.get("task_id")), f"{t.reward:g}", str(len(trajs)), str(sum(x.num_turns for x in trajs)),
                      str(ex.get("exit_code")), f"{ex.get('duration_s', 0):.1f}",
                      t.finish_reason + (f": {t.error.splitlines()[0][:80]}" if t.error else ""))
    return table


def rollout(spec: Any, harness: str, model: str, tokenizer: str | None, n: int, rows: list[dict],
            timeout: float | None, concurrency: int, max_tokens: int, writer: Any = None) -> int:
    """``envhub rollout ENV --harness NAME``: the first ``n`` of ``rows`` through the harness; the exit status.

    With ``writer`` (:class:`envhub.cli.runs.RunWriter`, ``--out``) the run directory every rollout writes: each
    task's trajectories (one per chain: the main one and any sub-agent's) are appended in one write as its episode
    finishes, ``--resume`` skips the tasks already there, and ``run.json`` gets the summary at the end (and
    ``interrupted`` when it did not get there)."""
    from envhub.cli.runs import key_of, read_lines

    t0 = time.perf_counter()
    tasks = [t for t in rows[:n] if writer is None or (str(t["task_id"]), 0) not in writer.done]
    lock = threading.Lock()

    def save(task: dict, trajs: list) -> None:
        with lock:
            writer.append(*trajs)

    if writer is not None:
        writer.open()
    finished = False
    try:
        results = run_episodes(spec, harness, model=model, tokenizer=tokenizer, timeout=timeout or 600.0,
                               concurrency=concurrency, max_tokens=max_tokens, tasks=tasks,
                               on_done=save if writer is not None else None)
        finished = True
    finally:
        if writer is not None:
            kept = read_lines(writer.path)
            mains = [d for d in kept if (d.get("details") or {}).get("chain_role", "main") == "main"]
            writer.write_meta(summary={"tasks": len({key_of(d) for d in kept}), "solved": sum(bool(d.get("passed"))
                              for d in mains), "trajectories": len(kept)}, finished=_now(), interrupted=not finished)
            writer.close()
    console.print(episodes_table(f"rollout: {spec.id} x {harness} x {model}", results))
    trajs = [t for _, ts in results for t in ts]
    solved = sum(ts[0].passed for _, ts in results)
    console.print(f"{solved}/{len(results)} tasks solved; {len(trajs)} trajectories "
                  f"({sum(t.details.get('chain_role') == 'main' for t in trajs)} main chains) in "
                  f"{time.perf_counter() - t0:.1f} s")
    if writer is not None:
        skipped = f" ({len(writer.done)} tasks already there)" if writer.done else ""
        console.print(f"saved {len(trajs)} trajectories to {writer.path}{skipped}", soft_wrap=True)
    return 1 if any(t.finish_reason == "error" for t in trajs) else 0


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def validate_report(spec: Any, harness: str, *, n: int | None = None, split: str | None = None,
                    tokenizer: Any = None, probes: list[str] | None = None, concurrency: int = 1,
                    timeout: float = 600.0) -> dict[str, Any]:
    """Golden, no-op and the env's hack probes through the real harness on the first ``n`` tasks (default 2).

    ``{"rows": [...], "skipped": [...], "problems": [...], "fit": bool}``: one row per episode (``play`` is
    ``golden``, ``noop`` or ``hack:NAME``; ``must`` is ``pass`` or ``fail``); a hack probe that cannot be played as
    the harness's shell commands (:mod:`envhub.harness.probes`) is a ``skipped`` entry with the reason. ``probes``
    limits the hack probes played (default: all the env declares); an unknown name is an error."""
    from envhub.harness.presets import golden_commands, noop_commands
    from envhub.harness.probes import hack_plays

    unknown = sorted(set(probes or []) - set(spec.hack_probes))
    if unknown:
        raise click.ClickException(f"{spec.id} declares no hack probe {', '.join(unknown)}; it declares: "
                                   f"{', '.join(sorted(spec.hack_probes)) or 'none'}")
    preset, tok = _preset(harness), _tokenizer(tokenizer)
    tasks = load_tasks(spec, split)[:n or 2]
    plays = {str(t["task_id"]): hack_plays(spec, t) for t in tasks}
    wanted = sorted(spec.hack_probes) if probes is None else sorted(set(probes))
    runs: list[tuple[str, str, Any, list[dict]]] = [("golden", "pass", golden_commands, tasks),
                                                     ("noop", "fail", noop_commands, tasks)]
    skipped = []
    for name in wanted:
        playable = []
        for t in tasks:
            play = plays[str(t["task_id"])][name]
            if isinstance(play, str):
                skipped.append({"play": f"hack:{name}", "task_id": t["task_id"], "reason": play})
            else:
                playable.append(t)
        runs.append((f"hack:{name}", "fail", lambda t, name=name: plays[str(t["task_id"])][name], playable))
    rows, problems = [], []
    for play, must, commands, run_tasks in runs:
        if not run_tasks:
            continue
        # the scripted player's reply is as long as the file a probe writes: no completion budget cuts it short
        for task, trajs in run_episodes(spec, preset.name, tokenizer=tok, timeout=timeout, concurrency=concurrency,
                                        commands=commands, tasks=run_tasks, max_tokens=SCRIPTED_MAX_TOKENS):
            t = trajs[0]
            # a probe that failed because it never got played says nothing about the grader: the harness must have
            # run every command (one model call each, then its ending) and exited cleanly
            want_calls, exit_code = len(commands(task)) + 1, t.details.get("harness_exit", {}).get("exit_code")
            played = t.finish_reason == "done" and exit_code == 0 and t.num_turns == want_calls
            ok = played and (t.passed if must == "pass" else not t.passed)
            rows.append({"play": play, "must": must, "task_id": task["task_id"], "reward": t.reward,
                         "passed": t.passed, "played": played, "ok": ok, "finish_reason": t.finish_reason,
                         "error": t.error, "calls": t.num_turns, "chains": len(trajs), "trajectories": trajs})
            if not played:
                problems.append(f"{play} was not played through on {task['task_id']} ({t.finish_reason}, harness "
                                f"exit {exit_code}, {t.num_turns} of {want_calls} model calls): no verdict")
            elif not ok:
                problems.append(f"{play} {'failed' if must == 'pass' else 'passed'} on {task['task_id']} "
                                f"(reward {t.reward:g})")
    return {"env": spec.id, "harness": preset.name, "rows": rows, "skipped": skipped, "problems": problems,
            "fit": not problems}


def validate(spec: Any, harness: str, n: int | None, split: str | None, tokenizer: str | None = None,
             probes: list[str] | None = None, concurrency: int = 1, json_out: str | None = None) -> None:
    """The golden through the real harness must pass every task; the no-op and every playable hack probe must fail
    every one; hack probes that cannot be played are listed as skipped, with the reason."""
    report = validate_report(spec, harness, n=n, split=split, tokenizer=tokenizer, probes=probes,
                             concurrency=concurrency)
    table = Table(title=f"{spec.id} through {harness}: golden must pass, no-op and hack probes must fail")
    for col in ("play", "task", "must", "reward", "verdict", "outcome"):
        table.add_column(col)
    for r in report["rows"]:
        table.add_row(r["play"], str(r["task_id"]), r["must"], f"{r['reward']:g}",
                      "[green]ok" if r["ok"] else "[red]UNFIT" if r["played"] else "[red]not played",
                      r["finish_reason"] + (f": {r['error'].splitlines()[0][:60]}" if r["error"] else ""))
    for s in report["skipped"]:
        table.add_row(s["play"], str(s["task_id"]), "fail", "-", "[yellow]skipped", s["reason"][:100])
    console.print(table)
    if json_out:
        import json
        from pathlib import Path

        rows = [{k: v for k, v in r.items() if k != "trajectories"} for r in report["rows"]]
        Path(json_out).write_text(json.dumps({**report, "rows": rows}, indent=2, default=str))
    if report["problems"]:
        console.print(f"[red]{spec.id} through {harness}: unfit: " + "; ".join(report["problems"]))
        raise SystemExit(1)
    hacks = sum(r["play"].startswith("hack:") for r in report["rows"])
    console.print(f"[green]{spec.id} through {harness}: golden passes and no-op fails on all "
                  f"{sum(r['play'] == 'golden' for r in report['rows'])} tasks; {hacks} hack-probe episode(s) fail, "
                  f"{len(report['skipped'])} skipped")
