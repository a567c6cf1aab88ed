"""Shared by the off-policy reference tests (main venv: AReaL and slime vendored; trainers venv: verl installed).

- :func:`batch`: random padded tensors that reach every branch the helpers have: ratios spread over both clip
  bounds and every threshold, a few catastrophic tokens (|log ρ| ≈ 12, beyond slime's 1e-4 veto), prompt / env
  positions (mask 0) whose logprobs differ between policies (so a helper that forgets the mask is caught), and
  optionally a row with no model token.
- :func:`mutant`: a copy of an envhub module with one piece of its source text replaced, to show that a check
  fails when the helper is broken on purpose (swapped bounds, a forgotten mask...): real mutation, not a
  different call.
- :func:`load`: import a vendored reference file by path.
"""
from __future__ import annotations

import importlib.util
import inspect
import sys
import types
from pathlib import Path

import torch

REFERENCE = Path(__file__).parent / "reference"


def load(name: str) -> types.ModuleType:
    """The vendored upstream module ``tests/training/reference/<name>.py`` (see ``reference/vendor.py``)."""
    spec = importlib.util.spec_from_file_location(f"offpolicy_reference_{name}", REFERENCE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def batch(seed: int, B: int = 8, T: int = 24, empty_row: bool = True, spread: float = 0.8) -> dict:
    """``logp`` (current, requires grad), ``prox``, ``behave`` (= rollout) logprobs, ``mask`` (bool),
    ``adv`` (per token), ``versions`` (-1 off the mask, 0..``version`` on it), ``version``."""
    g = torch.Generator().manual_seed(seed)
    behave = -torch.rand(B, T, generator=g) * 4 - 0.05
    prox = behave + torch.randn(B, T, generator=g) * spread
    logp = prox + torch.randn(B, T, generator=g) * spread * 0.5
    mask = torch.rand(B, T, generator=g) < 0.7
    mask[:, :3] = False  # a prompt
    mask[0, 5] = True
    if empty_row:
        mask[-1] = False
    # catastrophic tokens: the inference engine was far more confident than the trainer (and one the other way)
    for b, t, delta in ((1, 6, -12.0), (2, 8, 12.0)):
        mask[b, t] = True
        logp[b, t] = prox[b, t] = behave[b, t] + delta
    version = 7
    versions = torch.randint(0, version + 1, (B, T), generator=g)
    versions = torch.where(mask, versions, torch.full_like(versions, -1))
    adv = torch.randn(B, T, generator=g)
    return {"logp": logp.requires_grad_(), "prox": prox, "behave": behave, "mask": mask, "adv": adv,
            "versions": versions, "version": version}


def crafted() -> dict:
    """A small hand-built batch for the sequence-level corner cases random data almost never reaches: a sequence
    whose *max* token ratio is in bounds while its geometric mean is not (row 0), and a sequence whose only
    out-of-bounds ratio sits on a position off the mask (row 1)."""
    log_ratio = torch.tensor([[-0.5, -0.5, -0.5, -0.5, -0.5, 0.0],
                              [3.0, 0.0, 0.05, -0.05, 0.0, 0.0],
                              [0.05, -0.02, 0.1, 0.0, -0.1, 0.02]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    behave = torch.full((3, 6), -1.0)
    prox = behave + log_ratio
    logp = prox + torch.tensor([0.1, -0.1, 0.3, -0.3, 0.0, 0.05]).expand(3, 6)
    versions = torch.where(mask, torch.tensor([[3], [5], [6]]).expand(3, 6), -1)
    adv = torch.tensor([[1.0], [-1.0], [0.5]]).expand(3, 6).clone()
    return {"logp": logp.clone().requires_grad_(), "prox": prox, "behave": behave, "mask": mask, "adv": adv,
            "versions": versions, "version": 7}


def mutant(module: types.ModuleType, old: str, new: str) -> types.ModuleType:
    """``module`` re-executed with ``old`` (which must occur exactly once in its source) replaced by ``new``."""
    source = inspect.getsource(module)
    assert source.count(old) == 1, f"mutation target must occur exactly once in {module.__name__}: {old!r}"
    clone = types.ModuleType(f"{module.__name__}_mutant")
    clone.__dict__["__name__"] = module.__name__  # dataclasses resolve their module by name
    exec(compile(source.replace(old, new), f"<mutant of {module.__name__}>", "exec"), clone.__dict__)  # noqa: S102
    return clone


def close(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    """Equal to 1e-6 (absolute, or relative for large weights): the brief's bar."""
    torch.testing.assert_close(ours.detach().double(), ref.detach().double(), atol=1e-6, rtol=1e-6, msg=what)
