"""envhub's rollout-correction helpers against veRL's and OpenRLHF's installed code.

veRL (``verl.trainer.ppo.rollout_corr_helper``):
``compute_rollout_correction_and_rejection_mask`` is what veRL's trainer calls for ``algorithm.rollout_correction``
(``rollout_is``, ``rollout_is_threshold``, ``rollout_is_batch_normalize``, ``rollout_rs``, ``rollout_rs_threshold``);
envhub's :func:`~envhub.training.is_weights` / :func:`~envhub.training.icepop_weights` /
:func:`~envhub.training.divergence_rejection_mask` must give the same weights and mask on the same tensors, to
1e-6, and each check must fail on a mutant of envhub's source.

OpenRLHF (``openrlhf.models.loss.PolicyLoss`` with ``is_correction_level`` / ``_mode`` / ``_threshold``, gating
``ratio``): its loss and gradient equal :func:`~envhub.training.policy_gradient_loss` weighted by
:func:`~envhub.training.tis_weights` (token ``clip``), :func:`~envhub.training.icepop_weights` (token ``mask``) or
:func:`~envhub.training.seq_mask_tis_weights` (``seq``). Run in ``.venv-trainers`` (``make test-trainers``).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.trainers, pytest.mark.timeout(300)]
pytest.importorskip("verl", reason="needs the trainers venv (make test-trainers)")
torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parents[1] / "training"))

from offpolicy_support import batch, close, crafted, mutant  # noqa: E402
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask  # noqa: E402

from envhub.training import loss as pg_loss  # noqa: E402
from envhub.training import offpolicy  # noqa: E402


def openrlhf_policy_loss():
    """OpenRLHF's installed ``openrlhf/models/loss.py``, executed as is. ``import openrlhf.models`` needs flash-attn
    and its ``utils`` needs DeepSpeed (GPU packages), so the file is loaded by path into a bare package whose
    ``utils`` holds only ``masked_mean``, whose text is taken from the installed ``openrlhf/models/utils.py``."""
    import ast
    import importlib.util
    import types

    import openrlhf

    models = Path(openrlhf.__file__).parent / "models"
    utils_src = (models / "utils.py").read_text()
    fn = next(n for n in ast.parse(utils_src).body if isinstance(n, ast.FunctionDef) and n.name == "masked_mean")
    package = types.ModuleType("openrlhf_models_bare")
    package.__path__ = []
    utils = types.ModuleType("openrlhf_models_bare.utils")
    exec("import torch\nfrom typing import Optional\n" + ast.get_source_segment(utils_src, fn), utils.__dict__)  # noqa: S102
    sys.modules.update({"openrlhf_models_bare": package, "openrlhf_models_bare.utils": utils})
    spec = importlib.util.spec_from_file_location("openrlhf_models_bare.loss", models / "loss.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PolicyLoss


PolicyLoss = openrlhf_policy_loss()


def batches():
    """Random batches far off-policy and close to it (so sequence-level decisions go both ways), and the crafted
    corner cases."""
    return ([(f"seed {s}", batch(s)) for s in range(4)] + [(f"near, seed {s}", batch(s, spread=0.1))
                                                           for s in range(4)] + [("crafted", crafted())])


def verl(b, **options):
    weights, mask, _ = compute_rollout_correction_and_rejection_mask(
        old_log_prob=b["prox"], rollout_log_prob=b["behave"], response_mask=b["mask"].float(), **options)
    return (None if weights is None else weights.batch["rollout_is_weights"]), mask


IS_CASES = [  # (verl options, envhub is_weights kwargs)
    ({"rollout_is": "token", "rollout_is_threshold": 2.0}, {"level": "token", "upper": 2.0}),
    ({"rollout_is": "token", "rollout_is_threshold": "1.5"}, {"level": "token", "upper": 1.5}),
    ({"rollout_is": "sequence", "rollout_is_threshold": 2.0}, {"level": "sequence", "upper": 2.0}),
    ({"rollout_is": "token", "rollout_is_threshold": "0.5_5.0"},
     {"level": "token", "mode": "icepop", "lower": 0.5, "upper": 5.0}),
    ({"rollout_is": "sequence", "rollout_is_threshold": "0.1_10.0"},
     {"level": "sequence", "mode": "icepop", "lower": 0.1, "upper": 10.0}),
    ({"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_is_batch_normalize": True},
     {"level": "token", "upper": 2.0, "batch_normalize": True}),
    ({"rollout_is": "sequence", "rollout_is_threshold": 5.0, "rollout_is_batch_normalize": True},
     {"level": "sequence", "upper": 5.0, "batch_normalize": True}),
    ({"rollout_is": "sequence", "rollout_is_threshold": "0.1_10.0", "rollout_is_batch_normalize": True},
     {"level": "sequence", "mode": "icepop", "lower": 0.1, "upper": 10.0, "batch_normalize": True}),
]

RS_CASES = [  # (rollout_rs, rollout_rs_threshold, envhub upper, envhub lower): every option veRL has
    ("token_k1", "0.5_3.0", 3.0, 0.5), ("token_k1", 2.0, 2.0, None), ("token_k2", 0.05, 0.05, None),
    ("token_k3", 0.05, 0.05, None), ("seq_sum_k1", "0.2_4.0", 4.0, 0.2), ("seq_sum_k2", 2.0, 2.0, None),
    ("seq_sum_k3", 2.0, 2.0, None), ("seq_mean_k1", "0.7_1.2", 1.2, 0.7), ("seq_mean_k2", 0.1, 0.1, None),
    ("seq_mean_k3", 0.1, 0.1, None), ("seq_max_k2", 0.5, 0.5, None), ("seq_max_k3", 0.5, 0.5, None),
]


def check_is(off) -> None:
    for (name, b), (options, kwargs) in [(x, c) for x in batches() for c in IS_CASES]:
        ref, _ = verl(b, **options)
        ours, mask = off.is_weights(b["prox"], b["behave"], b["mask"], **kwargs)
        close(ours, ref, f"rollout_is {options}, {name}")
        assert torch.equal(mask, b["mask"].float()), "IS alone must not change the mask"
        if kwargs.get("mode") == "icepop" and not kwargs.get("batch_normalize"):
            close(off.icepop_weights(b["prox"], b["behave"], b["mask"], lower=kwargs["lower"],
                                     upper=kwargs["upper"], level=kwargs["level"]), ref, f"icepop_weights, {name}")
        if kwargs == {"level": "token", "upper": 2.0}:
            close(off.tis_weights(b["prox"], b["behave"], b["mask"], upper=2.0), ref, f"tis_weights, {name}")


def check_rs(off) -> None:
    for (name, b), (option, threshold, upper, lower) in [(x, c) for x in batches() for c in RS_CASES]:
        _, ref = verl(b, rollout_is=None, rollout_rs=option, rollout_rs_threshold=threshold)
        ours = off.divergence_rejection_mask(b["prox"], b["behave"], b["mask"].float(), option=option, upper=upper,
                                             lower=lower)
        assert torch.equal(ours, ref), f"rollout_rs={option} threshold={threshold}, {name}: masks differ"


def check_rs_chain(off) -> None:
    """veRL's comma list (every option must pass) is the product of one mask per option."""
    for name, b in batches():
        _, ref = verl(b, rollout_is=None, rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="0.5_3.0,0.1")
        m = b["mask"].float()
        ours = (off.divergence_rejection_mask(b["prox"], b["behave"], m, option="token_k1", upper=3.0, lower=0.5)
                * off.divergence_rejection_mask(b["prox"], b["behave"], m, option="seq_mean_k3", upper=0.1))
        assert torch.equal(ours, ref), f"chained rollout_rs, {name}"


OPENRLHF_CASES = [  # (is_correction_level, is_correction_mode, (low, high), envhub weights)
    ("token", "clip", (0.5, 2.0), lambda off, b: off.tis_weights(b["prox"], b["behave"], b["mask"], upper=2.0,
                                                                  lower=0.5)),
    ("token", "clip", (0.0, 2.0), lambda off, b: off.tis_weights(b["prox"], b["behave"], b["mask"], upper=2.0)),
    ("token", "mask", (0.5, 5.0), lambda off, b: off.icepop_weights(b["prox"], b["behave"], b["mask"], lower=0.5,
                                                                     upper=5.0)),
    ("seq", "mask", (0.5, 2.0), lambda off, b: off.seq_mask_tis_weights(b["prox"], b["behave"], b["mask"],
                                                                         lower=0.5, upper=2.0)),
    ("seq", "mask", (0.8, 1.25), lambda off, b: off.seq_mask_tis_weights(b["prox"], b["behave"], b["mask"],
                                                                          lower=0.8, upper=1.25)),
]


def check_openrlhf(off, loss_module=pg_loss) -> None:
    for (name, b), (level, mode, band, weights) in [(x, c) for x in batches() for c in OPENRLHF_CASES]:
        if not b["mask"].any():
            continue
        ref_logp = b["logp"].detach().clone().requires_grad_()
        ref, *_ = PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28, is_correction_level=level, is_correction_mode=mode,
                             is_correction_threshold=band)(ref_logp, b["prox"], b["adv"], action_mask=b["mask"].float(),
                                                            rollout_log_probs=b["behave"])
        ref.backward()
        logp = b["logp"].detach().clone().requires_grad_()
        ours = loss_module.policy_gradient_loss(logp, b["prox"], b["adv"], b["mask"].float(), clip_eps=0.2,
                                                clip_eps_high=0.28, weights=weights(off, b))
        ours.backward()
        close(ours, ref, f"OpenRLHF is_correction {level}/{mode}/{band}, {name}")
        close(logp.grad, ref_logp.grad, f"its gradient, {level}/{mode}/{band}, {name}")


def test_weighted_pg_loss_equals_openrlhf_policy_loss_with_is_correction():
    check_openrlhf(offpolicy)


def test_is_weights_equal_verl_rollout_is():
    check_is(offpolicy)


def test_divergence_rejection_mask_equals_verl_rollout_rs():
    check_rs(offpolicy)


def test_chained_rejection_equals_verl():
    check_rs_chain(offpolicy)


def test_rejection_cases_reject_something_and_keep_something():
    """The cases are not vacuous: every option rejects some model token and keeps some in the random batches."""
    random = [b for name, b in batches() if name != "crafted"]
    for option, _, upper, lower in RS_CASES:
        kept = sum(int(offpolicy.divergence_rejection_mask(b["prox"], b["behave"], b["mask"].float(), option=option,
                                                           upper=upper, lower=lower).sum()) for b in random)
        assert 0 < kept < sum(int(b["mask"].sum()) for b in random), f"{option}: nothing or everything rejected"


O = offpolicy
MUTANTS = [
    (check_is, 'weights = raw.clamp(max=upper)', 'weights = raw', "TIS not truncated"),
    (check_is, "inside = (raw >= lower) & (raw <= upper)", "inside = raw <= upper", "IcePop lower bound ignored"),
    (check_is, "total = (log_ratio * mask).sum(dim=-1, keepdim=True)", "total = log_ratio.sum(dim=-1, keepdim=True)",
     "sequence product over unmasked tokens"),
    (check_is, "mean = per_seq[valid].sum() / valid.sum().clamp(min=1)", "mean = per_seq.mean()",
     "sequence normalisation counts empty sequences"),
    (check_rs, '"k1": -log_ratio', '"k1": log_ratio', "k1 sign"),
    (check_rs, 'stat.masked_fill(~on, float("-inf"))', "stat", "max over positions off the mask"),
    (check_rs, "stat = stat / mask.sum(dim=-1, keepdim=True).clamp(min=1)", "stat = stat", "seq_mean is a sum"),
    (check_rs, "stat = torch.where(on, stat, 0.0).sum(dim=-1, keepdim=True)", "stat = stat.sum(dim=-1, keepdim=True)",
     "sequence sum over positions off the mask"),
    (check_rs, '"k3": torch.exp(log_ratio) - 1.0 - log_ratio', '"k3": torch.exp(-log_ratio) - 1.0 + log_ratio',
     "k3 direction"),
    (check_openrlhf, 'level="geometric", lower=lower, upper=upper)', 'level="sequence", lower=lower, upper=upper)',
     "seq-mask-tis gated on the sequence product"),
    (check_openrlhf, 'mode="truncate", upper=math.inf)', 'mode="truncate", upper=upper)',
     "seq-mask-tis truncates the token weights"),
]


@pytest.mark.parametrize("check, old, new, what", MUTANTS, ids=[m[-1] for m in MUTANTS])
def test_each_check_fails_on_a_broken_helper(check, old, new, what):
    with pytest.raises(AssertionError):
        check(mutant(offpolicy, old, new))


def test_the_openrlhf_check_fails_when_the_loss_ignores_the_weights():
    with pytest.raises(AssertionError):
        check_openrlhf(offpolicy, mutant(pg_loss, "per_token = per_token * weights.detach()", "per_token = per_token"))
