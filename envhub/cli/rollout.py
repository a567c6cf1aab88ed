"""``envhub rollout ID --model ...`` and ``envhub check-trajectory PATH``."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from envhub.cli.common import console, load_backend, load_tasks, resolve_spec, tokenizer_name
from envhub.cli.runner import Run


def summary_table(title: str, stats: dict[str, Any]) -> Table:
    table = Table(title=title)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in stats.items():
        if isinstance(value, float):
            value = f"{value:.4f}" if key.endswith("_s") else f"{value:.3f}"
        elif isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        table.add_row(key, str(value))
    return table


MODEL_NAMES = ("golden", "smollm2", "tiny", "tiny-llama3")
FAILED = ("error", "timeout")  # outcomes that count against --max-errors (a cut by length/turns is a result)


def check_model(model: str) -> None:
    """A one-line usage error for a ``--model`` that names nothing envhub can load (before anything loads)."""
    if model in MODEL_NAMES or model.startswith(("http://", "https://", "chat+http://", "chat+https://",
                                                 "sglang+http://", "sglang+https://", "vllm:")):
        return
    path = Path(model).expanduser()
    if path.is_dir():
        return
    raise click.BadParameter(f"{model!r} is not a model envhub can run: use golden, smollm2, tiny, a local model "
                             "directory, http://HOST:PORT of an OpenAI-compatible server, or chat+http://HOST:PORT of a chat endpoint",
                             param_hint="--model")


def preflight(backend: Any, model: str) -> None:
    """Ask an HTTP backend which model it serves before any episode starts: an unreachable or wrong server is one
    clear line, not N failed rollouts."""
    if not model.startswith(("http://", "https://", "chat+http://", "chat+https://")) or "," in model:
        return

    async def ask() -> str:
        try:
            return await asyncio.wait_for(backend.served_model(), 15)
        finally:
            await backend.close()

    try:
        served = asyncio.run(ask())
    except Exception as e:
        reason = "no answer within 15s" if isinstance(e, asyncio.TimeoutError) else f"{type(e).__name__}: {e}"
        raise click.ClickException(f"backend {model} is not usable: {reason}".splitlines()[0][:400]) from None
    backend.model = backend.model or served


@click.command("rollout")
@click.argument("env_id")
@click.option("--model", "-m", default="golden", show_default=True,
              help="golden | smollm2 | tiny | PATH (transformers, CPU) | http://HOST:PORT (vLLM/SGLang server) | "
                   "chat+http(s)://HOST[:PORT] (any OpenAI-compatible chat API; text only: evaluation, not training).")
@click.option("--api-model", default=None, help="Model name to ask a chat+http endpoint for (default: its first).")
@click.option("--tokenizer", default=None, help="Tokenizer (model name or path); default: the model's own.")
@click.option("-n", "--tasks", "n", type=click.IntRange(min=1), default=4, show_default=True, help="Number of tasks.")
@click.option("--samples", "-k", type=click.IntRange(min=1), default=1, show_default=True,
              help="Samples per task (pass@k).")
@click.option("--concurrency", "-c", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--max-turns", type=click.IntRange(min=1), default=None, help="Turn budget (default: the env's).")
@click.option("--max-length", type=click.IntRange(min=1), default=4096, show_default=True,
              help="Prompt + response token budget.")
@click.option("--max-tokens", type=click.IntRange(min=1), default=512, show_default=True,
              help="Tokens per generation.")
@click.option("--temperature", type=click.FloatRange(min=0.0), default=1.0, show_default=True)
@click.option("--top-p", type=click.FloatRange(min=0.0, max=1.0, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=int, default=-1, show_default=True, help="-1: no top-k cut.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--split", default=None)
@click.option("--env-args", default=None, help="JSON object of keyword arguments for the env factory.")
@click.option("--out", type=click.Path(), default=None,
              help="Run directory: trajectories are appended as they finish, with the run's metadata.")
@click.option("--resume", is_flag=True, help="Finish the run in --out: skip the rollouts it already holds.")
@click.option("--overwrite", is_flag=True, help="Replace the run in --out.")
@click.option("--timeout", type=click.FloatRange(min=0.0, min_open=True), default=None,
              help="Seconds per rollout (a slower one is reported as timeout).")
@click.option("--max-errors", type=click.IntRange(min=0), default=0, show_default=True,
              help="Exit 1 when more rollouts than this end in error or timeout.")
@click.option("--harness", default=None,
              help="Run an unmodified agent CLI (codex, claude-code, mini-swe-agent, qwen-code, opencode, gemini-cli) "
                   "on the tasks, its model calls "
                   "through the gateway (make harness-tools installs them). See docs/gateway.md.")
def rollout_cmd(env_id, model, api_model, tokenizer, n, samples, concurrency, max_turns, max_length, max_tokens, temperature,
                top_p, top_k, stop, seed, split, env_args, out, resume, overwrite, timeout, max_errors, harness):
    """Roll out ENV_ID with a model; print a summary and optionally save the run.

    Exit status: 0, or 1 when more than --max-errors rollouts errored or timed out, or 130 when interrupted (every
    finished rollout is saved first; a second Ctrl-C exits at once).
    """
    from envhub.cli import interrupt

    with interrupt.counting():  # from here on a Ctrl-C is never lost, whatever start-up code swallows it
        _rollout(env_id, model, api_model, tokenizer, n, samples, concurrency, max_turns, max_length, max_tokens,
                 temperature, top_p, top_k, stop, seed, split, env_args, out, resume, overwrite, timeout, max_errors,
                 harness)


def _rollout(env_id, model, api_model, tokenizer, n, samples, concurrency, max_turns, max_length, max_tokens,
             temperature, top_p, top_k, stop, seed, split, env_args, out, resume, overwrite, timeout, max_errors,
             harness) -> None:
    from envhub.cli.runs import RunWriter, env_meta, started_meta

    check_model(model)
    if (resume or overwrite) and not out:
        raise click.UsageError("--resume/--overwrite need --out")
    if harness and samples > 1:
        raise click.UsageError("--harness plays one episode per task: --samples does not apply")
    kwargs = _env_args(env_args)
    spec = resolve_spec(env_id)
    # everything that can be checked without the model is checked before it loads: the split and the tasks, then
    # --out (refused, resumed or replaced), and only then the weights
    rows = load_tasks(spec, split)
    sampling = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                    stop=list(stop))
    writer = None
    if out:
        meta = started_meta(env_id=spec.id, model=model, harness=harness, tokenizer=tokenizer_name(model, tokenizer),
                            sampling=sampling if not harness else {"max_tokens": max_tokens},
                            max_turns=max_turns, max_length=max_length, split=split, samples=samples, tasks=n,
                            env_args=kwargs, timeout=timeout, envs=[env_meta(spec)])
        writer = RunWriter(out, meta, resume=resume, overwrite=overwrite)  # checks only: writes nothing yet
    if harness:
        from envhub.cli import harness as harness_cli

        code = harness_cli.rollout(spec, harness, model, tokenizer, n, rows, timeout, min(concurrency, 2), max_tokens,
                                   writer)
        _exit(code)
    backend, tok, _ = load_backend(model, spec, tokenizer, api_model)
    preflight(backend, model)
    if writer:
        writer.open(api_model=getattr(backend, "model", None), trainable=getattr(backend, "trainable", True))
    run = Run(spec, backend, tok, n=n, samples=samples, concurrency=concurrency, timeout=timeout, split=split,
              config=_config(max_turns, max_length, sampling, kwargs), writer=writer, label=f"{env_id} x {model}",
              rows=rows)
    code = run.execute(handle_sigint=True)
    trajs, stats = run.results(), run.summary()
    console.print(summary_table(f"rollout: {env_id} with {model}", stats))
    failed = [t for t in trajs if t.finish_reason in FAILED]
    for t in failed[:3]:
        console.print(f"[red]{t.finish_reason}[/] {t.task_id}: {(t.error or '').splitlines()[0][:300]}")
    if writer:
        writer.write_meta(summary=stats, finished=_now(), interrupted=code == 130)
        writer.close()
        skipped = f" ({len(writer.done)} already there)" if writer.done else ""
        console.print(f"saved {len(run.finished)} trajectories to {writer.path}{skipped}", soft_wrap=True)
    if code == 0 and len(failed) > max_errors:
        console.print(f"[red]{len(failed)} of {len(trajs)} rollouts failed[/] (error or timeout; --max-errors "
                      f"{max_errors})")
        code = 1
    _exit(code)


def _now() -> str:
    import time

    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _env_args(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--env-args") from None
    if not isinstance(value, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--env-args")
    return value


def _config(max_turns, max_length, sampling: dict[str, Any], env_kwargs: dict[str, Any]):
    from envhub.backends.base import SamplingParams
    from envhub.rollout.request import RolloutConfig

    return RolloutConfig(max_turns=max_turns, max_length=max_length, sampling=SamplingParams(**sampling),
                         env_kwargs=env_kwargs)


def _exit(code: int) -> None:
    """Exit with ``code``. A worker thread still stuck in a hung env or a generation (a timeout or Ctrl-C left it
    behind; Python cannot kill a thread) would block interpreter exit forever, and tearing torch down under a
    running thread aborts the process: leave at once instead, everything being written and flushed already."""
    import os
    import sys
    import threading

    if any(t.is_alive() and t is not threading.main_thread() and not t.daemon for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    raise SystemExit(code)


def run_rollouts(env_id: str, *, model: str = "golden", tokenizer: str | None = None, n: int = 4, samples: int = 1,
                 concurrency: int = 8, max_turns: int | None = None, max_length: int = 4096, max_tokens: int = 512,
                 temperature: float = 1.0, seed: int = 0, split: str | None = None, timeout: float | None = None,
                 show_progress: bool = True):
    """Roll out ``n`` tasks of ``env_id`` ``samples`` times each; returns (trajectories, summary)."""
    spec = resolve_spec(env_id)
    backend, tok, _ = load_backend(model, spec, tokenizer)
    sampling = dict(max_tokens=max_tokens, temperature=temperature, seed=seed)
    run = Run(spec, backend, tok, n=n, samples=samples, concurrency=concurrency, timeout=timeout, split=split,
              config=_config(max_turns, max_length, sampling, {}), label=f"{env_id} x {model}",
              show_progress=show_progress)
    run.execute()
    return run.results(), run.summary()


@click.command("check-trajectory")
@click.argument("path", type=click.Path(exists=True))
@click.option("--tokenizer", default=None,
              help="The tokenizer the trajectories were made with (name or path); a run directory names its own.")
@click.option("--limit", type=int, default=None, help="Check only the first N trajectories.")
def check_trajectory_cmd(path: str, tokenizer: str | None, limit: int | None) -> None:
    """Check the token fidelity of saved trajectories (a run directory, a datasets dir, parquet or JSON lines):
    masks, logprobs and ids align, the prompt is the template's rendering, and every env span decodes to the
    template's rendering of the env's messages."""
    from envhub.cli.common import load_tokenizer_named
    from envhub.cli.runs import META, TRAJECTORIES, is_run, read_meta
    from envhub.rollout.fidelity import TrajectoryFileError, check_file

    target, recorded = Path(path), None
    if is_run(target):
        recorded = read_meta(target).get("tokenizer")
        target = target / TRAJECTORIES
    if tokenizer is None and recorded is None:
        raise click.UsageError(f"{path} records no tokenizer: pass --tokenizer (the one the trajectories were made "
                               "with)")
    if tokenizer and recorded and tokenizer != recorded:
        console.print(f"[yellow]warning:[/] the run was made with tokenizer {recorded!r}, checking with "
                      f"{tokenizer!r}: expect mismatches if they differ")
    name = tokenizer or recorded
    tok = load_tokenizer_named(name, "--tokenizer" if tokenizer else f"the run's tokenizer ({META} of {path})")
    try:
        bad = check_file(target, tok, limit=limit)
    except TrajectoryFileError as e:  # a malformed row: its file and line, never a traceback
        raise click.ClickException(str(e)) from None
    for index, problems in list(bad.items())[:20]:
        console.print(f"[red]trajectory {index}[/]: " + "; ".join(problems[:3]))
    console.print(f"all trajectories faithful (tokenizer {name})" if not bad else
                  f"{len(bad)} unfaithful trajectories (checked with tokenizer {name}; a wrong tokenizer makes every "
                  "trajectory look unfaithful)")
    if bad:
        raise SystemExit(1)
