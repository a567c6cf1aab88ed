"""envhub's off-policy helpers against AReaL's and slime's own code, on the same random tensors, to 1e-6.

AReaL and slime cannot be installed here; their functions are pure torch, so their text is vendored verbatim at a
pinned commit (``reference/vendor.py`` regenerates it) and executed: ``compute_prox_logp_approximations``,
``apply_rejection_sampling`` and ``ppo_actor_loss_fn`` (AReaL), ``vanilla_tis_function``, ``icepop_function`` and
MIS's ``compute_mis_weights`` (slime). verl's installed code is compared in ``tests/adapters/test_offpolicy_trainers.py``.

Every check also runs against mutants of envhub's source (a bound swapped, a mask forgotten, the wrong proximal
version...) and must fail there: the cases are strong enough to catch the bug each comparison is meant to catch.
"""
from __future__ import annotations

import sys
import warnings
from itertools import product
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).parent))

from offpolicy_support import batch, close, crafted, load, mutant  # noqa: E402

from envhub.training import decoupled, offpolicy  # noqa: E402

pytestmark = pytest.mark.timeout(120)
AREAL, SLIME_TIS, SLIME_MIS = load("areal_offpolicy"), load("slime_tis"), load("slime_mis")
SEEDS = range(4)


def batches(**kwargs):
    """The random batches, then the hand-built one (``offpolicy_support.crafted``)."""
    return [(f"seed {seed}", batch(seed, **kwargs)) for seed in SEEDS] + [("crafted", crafted())]

# ---------------------------------------------------------------------------------------------------- AReaL


def check_loglinear(dec) -> None:
    for seed in SEEDS:
        b = batch(seed)
        logp = b["logp"].detach()
        ref = AREAL.compute_prox_logp_approximations(b["behave"], logp, b["versions"], b["version"],
                                                     method="loglinear")["loglinear"]
        ours = dec.loglinear_proximal_logprobs(b["behave"], logp, b["versions"], b["version"])
        close(ours, ref, f"loglinear prox, seed {seed}")


REJECTIONS = [  # (level, action, metric, agg, upper, lower): every branch of AReaL's apply_rejection_sampling
    ("token", "mask", "ratio", "mean", 2.0, None), ("token", "mask", "ratio", "mean", 2.0, 0.5),
    ("token", "clamp", "ratio", "mean", 2.0, None), ("token", "clamp", "ratio", "mean", 1.5, 0.7),
    ("token", "mask", "kl_k1", "mean", 0.3, -0.3), ("token", "mask", "kl_k2", "mean", 0.1, None),
    ("token", "mask", "kl_k3", "mean", 0.1, None),
    *[("sequence", "mask", m, agg, up, lo) for (m, up, lo), agg in product(
        [("ratio", 1.3, 0.8), ("kl_k1", 0.5, -0.5), ("kl_k2", 0.4, None), ("kl_k3", 0.3, None)], ["sum", "mean", "max"])],
    *[("sequence", "clamp", "ratio", agg, 1.3, lo) for agg, lo in product(["sum", "mean", "max"], [None, 0.8])],
]


def areal_config(level, action, metric, agg, upper, lower):
    return AREAL.RejectionSamplingConfig(level=level, action=action, metric=metric, agg=agg, upper=upper, lower=lower)


def check_behave_rejection(dec) -> None:
    for (seed, b), spec in product(batches(), REJECTIONS):
        ref = AREAL.apply_rejection_sampling(b["prox"], b["behave"], b["mask"], None, areal_config(*spec))
        mask, weight = dec.behave_rejection(b["prox"], b["behave"], b["mask"], dec.Rejection(*spec))
        assert torch.equal(mask, ref.loss_mask.bool()), f"rejection mask differs, {spec}, {seed}"
        close(weight, ref.behave_imp_weight, f"behaviour weight, {spec}, {seed}")


LOSS_OPTIONS = [  # (eps_clip, eps_clip_higher, c_clip, rejection spec or None)
    (0.2, None, None, None), (0.2, 0.28, None, None), (0.2, 0.28, 3.0, None),
    (0.2, 0.28, 3.0, ("token", "mask", "ratio", "mean", 2.0, None)),
    (0.1, 0.3, None, ("token", "clamp", "ratio", "mean", 1.5, 0.7)),
    (0.2, None, 2.0, ("sequence", "mask", "ratio", "mean", 1.3, 0.8)),
    (0.2, 0.28, None, ("sequence", "mask", "kl_k3", "max", 0.3, None)),
]


def check_decoupled_loss(dec, per_sequence_adv: bool = False) -> None:
    for (seed, b), (eps, eps_high, c_clip, spec) in product(batches(), LOSS_OPTIONS):
        b = {**b, "logp": b["logp"].detach().clone().requires_grad_()}
        adv = b["adv"][:, 0] if per_sequence_adv else b["adv"]
        logp_ref = b["logp"].detach().clone().requires_grad_()
        ref, _ = AREAL.ppo_actor_loss_fn(
            logprobs=logp_ref, proximal_logprobs=b["prox"], old_logprobs=b["behave"],
            advantages=adv.unsqueeze(-1).expand_as(b["behave"]) if per_sequence_adv else adv, eps_clip=eps,
            loss_mask=b["mask"], eps_clip_higher=eps_high, c_clip=c_clip,
            rejection_sampling=None if spec is None else areal_config(*spec))
        ref.backward()
        ours = dec.decoupled_ppo_loss(b["logp"], b["prox"], b["behave"], adv, b["mask"], eps_clip=eps,
                                      eps_clip_higher=eps_high, c_clip=c_clip,
                                      rejection=None if spec is None else dec.Rejection(*spec))
        ours.backward()
        what = f"eps={eps}/{eps_high}, c_clip={c_clip}, rejection={spec}, {seed}"
        close(ours, ref, f"decoupled loss, {what}")
        close(b["logp"].grad, logp_ref.grad, f"decoupled loss gradient, {what}")


def test_loglinear_proximal_logprobs_equals_areal():
    check_loglinear(decoupled)


def test_behave_rejection_equals_areal_apply_rejection_sampling():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no AReaL config warning: every spec is one AReaL accepts silently
        check_behave_rejection(decoupled)


@pytest.mark.parametrize("per_sequence_adv", [False, True])
def test_decoupled_ppo_loss_equals_areal_ppo_actor_loss_fn(per_sequence_adv):
    check_decoupled_loss(decoupled, per_sequence_adv)


def test_loglinear_then_decoupled_loss_equals_areal_end_to_end():
    """AReaL's ``prox_logp_method: loglinear`` path: the approximation fed to the loss, gradient included."""
    for seed in SEEDS:
        b = batch(seed)
        logp_ref = b["logp"].detach().clone().requires_grad_()
        prox_ref = AREAL.compute_prox_logp_approximations(b["behave"], logp_ref.detach(), b["versions"],
                                                          b["version"], method="loglinear")["loglinear"]
        ref, _ = AREAL.ppo_actor_loss_fn(logp_ref, prox_ref, b["behave"], b["adv"], 0.2, b["mask"], 0.28,
                                         rejection_sampling=AREAL.RejectionSamplingConfig())
        ref.backward()
        prox = decoupled.loglinear_proximal_logprobs(b["behave"], b["logp"], b["versions"], b["version"])
        ours = decoupled.decoupled_ppo_loss(b["logp"], prox, b["behave"], b["adv"], b["mask"], eps_clip_higher=0.28)
        ours.backward()
        close(ours, ref, f"loglinear + decoupled loss, seed {seed}")
        close(b["logp"].grad, logp_ref.grad, f"its gradient, seed {seed}")


# ---------------------------------------------------------------------------------------------------- slime


def rows(t, mask):
    return [t[i] for i in range(t.shape[0])], [mask[i].float() for i in range(mask.shape[0])]


def check_slime_tis(off) -> None:
    for seed, (upper, lower) in product(SEEDS, [(2.0, 0.0), (2.0, 0.5), (1.5, 0.9)]):
        b = batch(seed)
        train, masks = rows(b["prox"], b["mask"])
        args = SimpleNamespace(tis_clip=upper, tis_clip_low=lower)
        for ref_fn, ours in ((SLIME_TIS.vanilla_tis_function, off.tis_weights),
                             (SLIME_TIS.icepop_function, off.icepop_weights)):
            ref, _, _ = ref_fn(args, pg_loss=torch.ones(b["mask"].numel()), train_log_probs=train,
                               rollout_log_probs=rows(b["behave"], b["mask"])[0], loss_masks=masks)
            if ours is off.icepop_weights and lower == 0.0:
                continue  # IcePop needs a lower bound above 0 (slime's defaults are tis_clip_low=0: no IcePop)
            w = ours(b["prox"], b["behave"], b["mask"], upper=upper, lower=lower)
            # slime's weights are not masked (its reducer masks the loss); compare them where the loss counts
            close(w, ref.view_as(w) * b["mask"], f"{ref_fn.__name__} upper={upper} lower={lower}, seed {seed}")


MIS_CONFIGS = [  # (tis_level, tis_mode, tis_lower, tis_upper, use_rs, rs_level, rs_lower, rs_upper, veto, normalize)
    ("token", "truncate", None, 2.0, False, None, None, None, None, False),
    ("token", "clip", 0.5, 2.0, False, None, None, None, None, False),
    ("token", "mask", 0.5, 2.0, False, None, None, None, None, False),
    ("sequence", "truncate", None, 2.0, False, None, None, None, None, False),
    ("sequence", "mask", 0.1, 10.0, False, None, None, None, None, False),
    ("geometric", "clip", 0.8, 1.25, False, None, None, None, None, False),
    ("geometric", "mask", 0.8, 1.25, False, None, None, None, None, False),
    ("token", "truncate", 0.5, 2.0, True, "token", None, None, 1e-4, True),  # mis.yaml's example
    ("token", "mask", 0.5, 2.0, True, "geometric", 0.8, 1.25, 1e-4, False),
    ("sequence", "clip", 0.1, 10.0, True, "token", 0.3, 3.0, None, True),
    ("token", "truncate", None, 2.0, True, "sequence", 0.05, 20.0, 1e-4, True),
]


def check_slime_mis(off) -> None:
    for seed, cfg in product(SEEDS, MIS_CONFIGS):
        tis_level, tis_mode, tis_lower, tis_upper, use_rs, rs_level, rs_lower, rs_upper, veto, normalize = cfg
        # slime's sequence-level batch normalisation divides by every sequence, empty ones too (verl and envhub
        # skip them): compared on batches where every sequence has a model token (docs/decisions.md, #25)
        b = batch(seed, empty_row=not (normalize and tis_level != "token"))
        args = SimpleNamespace(use_tis=True, tis_level=tis_level, tis_mode=tis_mode, tis_lower_bound=tis_lower,
                               tis_upper_bound=tis_upper, use_rs=use_rs, rs_level=rs_level, rs_lower_bound=rs_lower,
                               rs_upper_bound=rs_upper, rs_veto_threshold=veto, tis_batch_normalize=normalize)
        train, masks = rows(b["prox"], b["mask"])
        ref_w, ref_m, _ = SLIME_MIS.compute_mis_weights(args, train_log_probs=train,
                                                        rollout_log_probs=rows(b["behave"], b["mask"])[0],
                                                        loss_masks=masks)
        w, m = off.is_weights(b["prox"], b["behave"], b["mask"], level=tis_level, mode=tis_mode, upper=tis_upper,
                              lower=tis_lower, batch_normalize=normalize)
        if use_rs:
            lower = rs_lower if rs_lower is not None else (tis_lower if tis_lower is not None else 1 / tis_upper)
            m = m * off.ratio_rejection_mask(b["prox"], b["behave"], b["mask"], level=rs_level, lower=lower,
                                             upper=rs_upper if rs_upper is not None else tis_upper, veto=veto)
        close(w, torch.stack(ref_w), f"MIS weights {cfg}, seed {seed}")
        assert torch.equal(m, torch.stack(ref_m)), f"MIS mask differs {cfg}, seed {seed}"


def test_tis_and_icepop_equal_slime():
    check_slime_tis(offpolicy)


def test_mis_equals_slime_compute_mis_weights():
    check_slime_mis(offpolicy)


# ---------------------------------------------------------------------------------------------------- break it

D, O = decoupled, offpolicy
MUTANTS = [  # (check, module, source text, replacement, what the mutation breaks)
    (check_loglinear, D, "gap, span = (current_version - 1) - v_behave", "gap, span = current_version - v_behave",
     "proximal version v instead of v - 1"),
    (check_loglinear, D, "(span > 0) & (versions >= 0)", "(span > 0)", "prompt/env tokens (-1) interpolated"),
    (check_behave_rejection, D, "neg = behave - prox", "neg = prox - behave", "k3 estimator's direction"),
    (check_behave_rejection, D, "weight = torch.exp(masked.sum(dim=-1, keepdim=True) / count)",
     "weight = torch.exp(masked.sum(dim=-1, keepdim=True))", "sequence weight not a geometric mean"),
    (check_behave_rejection, D, "return (m >= rejection.lower) & (m <= rejection.upper)",
     "return m <= rejection.upper", "lower bound ignored"),
    (check_behave_rejection, D, "weight = torch.where(~keep, clamped(weight), weight)", "weight = clamped(weight)",
     "sequence clamp applied to in-bounds sequences"),
    (check_behave_rejection, D, 'values.masked_fill(~mask, float("-inf"))', "values", "max over padding"),
    (check_decoupled_loss, D, "clipped = torch.clamp(ratio, 1.0 - eps_clip, 1.0 + high)",
     "clipped = torch.clamp(ratio, 1.0 - high, 1.0 + eps_clip)", "clip bounds swapped"),
    (check_decoupled_loss, D, "return torch.where(mask, pg, 0).sum() / count", "return pg.sum() / count",
     "mask forgotten in the sum"),
    (check_decoupled_loss, D, "return torch.where(mask, pg, 0).sum() / count",
     "return torch.where(mask, pg, 0).sum() / max(int(mask.sum()), 1)", "denominator after rejection"),
    (check_decoupled_loss, D, "torch.sign(advantages) * c_clip * advantages", "c_clip * advantages",
     "dual clip without |A|"),
    (check_decoupled_loss, D, "pg = pg * weight", "pg = pg", "behaviour weight not applied"),
    (check_decoupled_loss, D, "torch.exp(logprobs - proximal_logprobs.detach())",
     "torch.exp(logprobs - behave_logprobs)", "ratio against the behaviour policy (naive PPO)"),
    (check_slime_tis, O, "weights = raw.clamp(max=upper)", "weights = raw", "TIS not truncated"),
    (check_slime_tis, O, "weights = raw.clamp(lower, upper) * mask", "weights = raw.clamp(max=upper) * mask",
     "TIS lower bound ignored"),
    (check_slime_tis, O, "weights = torch.where(inside, raw, torch.zeros_like(raw))",
     "weights = raw.clamp(lower, upper)", "IcePop clamps instead of zeroing"),
    (check_slime_mis, O, "total = (log_ratio * mask).sum(dim=-1, keepdim=True)",
     "total = log_ratio.sum(dim=-1, keepdim=True)", "sequence product over unmasked tokens"),
    (check_slime_mis, O, "total = total / mask.sum(dim=-1, keepdim=True).clamp(min=1)", "total = total",
     "geometric level without the mean"),
    (check_slime_mis, O, "weights, mask = raw, mask * inside.to(mask.dtype)", "weights, mask = raw, mask",
     "MIS mask mode rejects nothing"),
    (check_slime_mis, O, "weights = weights / mean", "weights = weights", "batch normalisation skipped"),
    (check_slime_mis, O, "keep = keep * (~catastrophic).float()", "keep = keep", "veto ignored"),
    (check_slime_mis, O, "keep = mask * ((ratio >= lower) & (ratio <= upper)).float()", "keep = mask",
     "rejection bounds ignored"),
]


@pytest.mark.parametrize("check, module, old, new, what", MUTANTS, ids=[m[-1] for m in MUTANTS])
def test_each_check_fails_on_a_broken_helper(check, module, old, new, what):
    broken = mutant(module, old, new)
    with pytest.raises(AssertionError):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check(broken)


def test_the_mutation_harness_itself_keeps_a_correct_module_passing():
    """A no-op mutation (same text) passes every check: the failures above come from the mutations, not from
    re-executing the source."""
    for check, module, old in ((check_loglinear, D, "gap, span"), (check_decoupled_loss, D, "pg = pg * weight"),
                               (check_slime_mis, O, "weights = weights / mean")):
        check(mutant(module, old, old))
