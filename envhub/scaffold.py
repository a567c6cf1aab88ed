"""``envhub init NAME``: scaffold an environment plugin package that works untouched.

The result (for ``envhub init my-env``)::

    my-env/
      pyproject.toml            # the entry point [project.entry-points.envhub] my-env = "envhub_my_env"
      README.md                 # what to edit, how to validate, install and publish
      envhub_my_env/
        __init__.py             # the env, its verifier, golden / no-op / hack-probe policies, the register hook
        generate.py             # python -m envhub_my_env.generate: rewrite data/ from a seed
        data/test.jsonl         # the shipped tasks

It passes ``envhub validate my-env`` and installs with ``pip install -e my-env`` as generated. The env module is
copied from :mod:`envhub.scaffold_template` (``text_env`` for ``--kind text``, ``tool_env`` for ``--kind tool``),
which is real, tested Python written for the placeholder id ``__ENV_ID__``.
"""
from __future__ import annotations

import importlib
import re
from importlib import resources
from pathlib import Path

from envhub.task import save_jsonl

KINDS = {"text": "text_env", "tool": "tool_env"}
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{dist}"
version = "0.1.0"
description = "{summary}"
requires-python = ">=3.10"
dependencies = ["envhub"]

[project.entry-points.envhub]
{env_id} = "{module}"

[tool.setuptools.package-data]
{module} = ["data/*.jsonl"]
"""

README = """\
# {dist}

An envhub environment plugin: `{env_id}`, {summary_lower}

```bash
envhub validate .                      # admission: golden passes, no-op and hack probes fail, replays agree
pip install -e .                       # then: envhub info {env_id}; gymnasium.make("envhub/{env_id}-v0")
python -m {module}.generate            # rewrite data/test.jsonl from a seed
envhub registry add . --registry ../registry.toml   # publish: wheel + entry (hashes, admission summary)
```

Everything lives in `{module}/__init__.py`: the env, the verifier, the golden / no-op / hack-probe policies and the
`envhub_register` hook. Change them together; `envhub validate .` tells you when the verifier is trustworthy.
"""

GITIGNORE = "__pycache__/\n*.egg-info/\nbuild/\ndist/\n"


class ScaffoldError(ValueError):
    """The name is unusable or the target directory is taken."""


def names(name: str) -> dict[str, str]:
    """The names derived from NAME: ``env_id`` (NAME), ``dist`` (``envhub-<name>``), ``module`` (``envhub_<name>``)."""
    if not _NAME.match(name):
        raise ScaffoldError(f"invalid name {name!r}: start with a letter, then letters, digits, '-' or '_' (max 64)")
    stem = name.lower()
    return {"env_id": name, "dist": "envhub-" + stem.replace("_", "-"), "module": "envhub_" + stem.replace("-", "_")}


def template_text(file: str) -> str:
    return resources.files("envhub.scaffold_template").joinpath(file).read_text()


def scaffold(name: str, parent: str | Path = ".", kind: str = "text", *, seed: int = 0, n_tasks: int = 8) -> Path:
    """Create ``parent/name`` as a plugin package (see the module docstring) and return its path.

    Refuses (:class:`ScaffoldError`) an invalid name, an unknown kind, or a target that exists and is not empty:
    scaffolding never overwrites anyone's work.
    """
    if kind not in KINDS:
        raise ScaffoldError(f"unknown kind {kind!r}: choose one of {', '.join(KINDS)}")
    n = names(name)
    root = Path(parent) / name
    if root.exists() and (not root.is_dir() or any(root.iterdir())):
        raise ScaffoldError(f"{root} already exists and is not empty; choose another name or --dir")
    template = importlib.import_module(f"envhub.scaffold_template.{KINDS[kind]}")
    summary = _summary(template)
    module_src = template_text(f"{KINDS[kind]}.py").replace("__ENV_ID__", n["env_id"])
    generate_src = template_text("generate.py").replace("__MODULE__", n["module"])
    pkg = root / n["module"]
    pkg.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(PYPROJECT.format(summary=summary, **n))
    (root / "README.md").write_text(README.format(summary_lower=summary[0].lower() + summary[1:], **n))
    (root / ".gitignore").write_text(GITIGNORE)
    (pkg / "__init__.py").write_text(module_src)
    (pkg / "generate.py").write_text(generate_src)
    # The same make_tasks the new module holds (the template is that code), so data/ matches generate.py's output.
    save_jsonl(template.make_tasks(seed, n_tasks), pkg / "data" / "test.jsonl")
    return root


def _summary(template) -> str:
    """The template's one-line summary, as its ``envhub_register`` hook declares it (kept in one place)."""
    from envhub.plugins import SpecRegistry

    reg = SpecRegistry("scaffold")
    template.envhub_register(registry=reg)
    return next(iter(reg.specs.values())).summary
