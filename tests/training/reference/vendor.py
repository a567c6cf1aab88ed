"""Regenerate the vendored reference code the off-policy tests execute (``areal_offpolicy.py``, ``slime_tis.py``,
``slime_mis.py`` beside this file) from git checkouts of AReaL and slime.

AReaL and slime cannot be pip-installed here (offline, GPU stacks), but the functions that define their off-policy
corrections are pure torch. This script copies their text *verbatim* (whole top-level definitions, found with
``ast``, decorators included) at a pinned commit, so ``tests/training/test_offpolicy_reference.py`` compares
envhub's helpers with the trainers' own code, not with a reading of it. Nothing is edited; only the imports the
copied definitions need are written above them.

    python tests/training/reference/vendor.py /path/to/AReaL.git /path/to/slime.git

(bare repositories work: the files are read with ``git show <commit>:<path>``).
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

AREAL_COMMIT = "4aef98d8d818af55b43621aaadba047ae10f4e77"
SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
HERE = Path(__file__).parent

AREAL_PIECES = [  # (path, top-level names, in the order they are written)
    ("areal/utils/constants.py", ["ProxLogpMethod", "ProxApproxMethod", "PROX_APPROX_METHOD_LOGLINEAR",
                                  "PROX_APPROX_METHOD_LINEAR", "PROX_APPROX_METHOD_ROLLOUT",
                                  "PROX_APPROX_METHODS_ALL"]),
    ("areal/utils/data.py", ["KLEstimator"]),
    ("areal/api/cli_args.py", ["RejectionSamplingConfig"]),
    ("areal/utils/functional/functional.py", ["_compute_sequence_level_ratio_and_advantages",
                                              "RejectionSamplingResult", "_check_bounds",
                                              "apply_rejection_sampling", "ppo_actor_loss_fn"]),
    ("areal/trainer/ppo/actor.py", ["compute_prox_logp_approximations"]),
]
SLIME_PIECES = [("slime/backends/megatron_utils/loss.py", ["vanilla_tis_function", "icepop_function"])]


def show(repo: str, commit: str, path: str) -> str:
    return subprocess.run(["git", "-C", repo, "show", f"{commit}:{path}"], check=True, capture_output=True,
                          text=True).stdout


def definitions(source: str, names: list[str]) -> list[str]:
    """The verbatim text of each named top-level def / class / assignment, decorators included."""
    tree = ast.parse(source)
    lines = source.splitlines()
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        else:
            continue
        if name in names:
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            found[name] = "\n".join(lines[start - 1:node.end_lineno])
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f"not found upstream: {missing}")
    return [found[n] for n in names]


def header(repo: str, commit: str, paths: list[str]) -> str:
    files = "\n".join(f"#   {p}" for p in paths)
    return (f"# ruff: noqa\n# Vendored VERBATIM by tests/training/reference/vendor.py (do not edit; rerun it).\n"
            f"# Source: https://github.com/{repo} at commit {commit}\n{files}\n"
            "# Apache License 2.0 (the upstream project's licence). Only the import lines above the copied\n"
            "# definitions are ours.\n")


def main(areal_repo: str, slime_repo: str) -> None:
    parts = [header("inclusionAI/AReaL", AREAL_COMMIT, [p for p, _ in AREAL_PIECES]),
             "import warnings\nfrom dataclasses import dataclass, field\nfrom enum import Enum\n\nimport torch\n"]
    for path, names in AREAL_PIECES:
        parts += [f"# ---- {path}"] + definitions(show(areal_repo, AREAL_COMMIT, path), names)
    (HERE / "areal_offpolicy.py").write_text("\n\n\n".join(parts) + "\n")

    parts = [header("THUDM/slime", SLIME_COMMIT, [p for p, _ in SLIME_PIECES]),
             "from typing import Any\n\nimport torch\n"]
    for path, names in SLIME_PIECES:
        parts += [f"# ---- {path}"] + definitions(show(slime_repo, SLIME_COMMIT, path), names)
    (HERE / "slime_tis.py").write_text("\n\n\n".join(parts) + "\n")

    mis = "examples/train_infer_mismatch_helper/mis.py"  # pure torch and importable standalone: the whole file
    (HERE / "slime_mis.py").write_text(header("THUDM/slime", SLIME_COMMIT, [mis]) + show(slime_repo, SLIME_COMMIT, mis))


if __name__ == "__main__":
    main(*sys.argv[1:3])
