"""``envhub rollout ENV --harness NAME`` and ``envhub validate ENV --harness NAME``: an unmodified agent CLI on an
envhub task set, its model calls served (and recorded) by the gateway (:mod:`envhub.harness`)."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import click
from rich.table import Table

from envhub.cli.common import console, load_tasks


def _runner(spec: Any, preset: Any, model: str, tokenizer: str | None, commands: Any, max_tokens: int) -> Any:
    from envhub.gateway import Gateway
    from envhub.harness.episode import HarnessRunner

    if model == "golden":
        from envhub.backends.scripted import ScriptedBackend
        from envhub.cli.common import default_tokenizer
        from envhub.harness.presets import scripted
        from envhub.testing.models import load_tokenizer, resolve_model

        backend, tok = ScriptedBackend(scripted(preset, commands)), load_tokenizer(resolve_model(tokenizer or
                                                                                                  default_tokenizer()))
    else:
        from envhub.cli.common import load_backend

        backend, tok, _ = load_backend(model, spec, tokenizer)
    return HarnessRunner(Gateway(backend, tok, default_max_tokens=max_tokens))


def run_episodes(spec: Any, harness: str, *, model: str = "golden", tokenizer: str | None = None, n: int = 2,
                 split: str | None = None, timeout: float = 600.0, max_calls: int = 60, concurrency: int = 1,
                 max_tokens: int = 1024, noop: bool = False) -> list[tuple[dict, list]]:
    """``[(task, trajectories)]`` for the first ``n`` tasks (``noop``: the scripted no-op instead of the golden)."""
    from envhub.harness.presets import HarnessNotInstalled, get_preset, golden_commands, noop_commands

    try:
        preset = get_preset(harness)
        preset.check_installed()
    except (ValueError, HarnessNotInstalled) as e:
        raise click.ClickException(str(e)) from None
    tasks = load_tasks(spec, split)[:n]
    runner = _runner(spec, preset, model, tokenizer, noop_commands if noop else golden_commands, max_tokens)
    try:
        with ThreadPoolExecutor(max(1, concurrency)) as pool:
            results = list(pool.map(lambda t: runner.run(spec, preset, t, timeout_s=timeout, max_calls=max_calls),
                                    tasks))
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


def rollout(spec: Any, harness: str, model: str, tokenizer: str | None, n: int, split: str | None,
            timeout: float | None, concurrency: int, max_tokens: int, out: str | None) -> None:
    t0 = time.perf_counter()
    results = run_episodes(spec, harness, model=model, tokenizer=tokenizer, n=n, split=split,
                           timeout=timeout or 600.0, concurrency=concurrency, max_tokens=max_tokens)
    console.print(episodes_table(f"rollout: {spec.id} x {harness} x {model}", results))
    trajs = [t for _, ts in results for t in ts]
    solved = sum(ts[0].passed for _, ts in results)
    console.print(f"{solved}/{len(results)} tasks solved; {len(trajs)} trajectories "
                  f"({sum(t.details.get('chain_role') == 'main' for t in trajs)} main chains) in "
                  f"{time.perf_counter() - t0:.1f} s")
    if out:
        from envhub.cli.common import save_trajectories

        console.print(f"saved to {save_trajectories(trajs, out)}")
    failed = [t for t in trajs if t.finish_reason == "error"]
    if failed:
        raise SystemExit(1)


def validate(spec: Any, harness: str, n: int | None, split: str | None, tokenizer: str | None = None) -> None:
    """The golden through the real harness must pass every task; the no-op must fail every one."""
    golden = run_episodes(spec, harness, tokenizer=tokenizer, n=n or 2, split=split)
    noop = run_episodes(spec, harness, tokenizer=tokenizer, n=n or 2, split=split, noop=True)
    console.print(episodes_table(f"golden through {harness}", golden))
    console.print(episodes_table(f"no-op through {harness}", noop))
    bad = [f"golden failed on {t['task_id']}" for t, ts in golden if not ts[0].passed]
    bad += [f"no-op passed on {t['task_id']}" for t, ts in noop if ts[0].passed]
    if bad:
        console.print(f"[red]{spec.id} through {harness}: " + "; ".join(bad))
        raise SystemExit(1)
    console.print(f"[green]{spec.id} through {harness}: golden passes and no-op fails on all {len(golden)} tasks")
