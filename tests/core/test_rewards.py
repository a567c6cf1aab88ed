"""Reward composition (#30): caps per component and in total, the outcome dominant by construction, per-step shares
that sum to the capped process reward, raw and capped recorded, DAPO's overlong penalty inside the caps."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envhub.rewards as rewards
from envhub.rewards import Component, Overlong, RewardConfig, compose, step_components

pytestmark = pytest.mark.timeout(120)
NAMES = ["step", "tool", "checkpoint", "format"]
value = st.floats(-1e6, 1e6, allow_nan=False)
steps_st = st.lists(st.dictionaries(st.sampled_from(NAMES), value, max_size=4), max_size=12)
config_st = st.builds(
    RewardConfig,
    outcome_weight=st.floats(0.1, 10),
    process_cap=st.floats(0, 0.6),
    penalty_cap=st.floats(0, 0.39),
    components=st.dictionaries(st.sampled_from(NAMES), st.builds(Component, st.floats(0, 5),
                                                                 st.none() | st.floats(0, 3)), max_size=4),
)


@settings(max_examples=400, deadline=None)
@given(config_st, steps_st, steps_st)
def test_no_process_rewards_lift_a_failed_episode_over_the_golden(cfg, golden_steps, farmer_steps):
    golden = compose(1.0, golden_steps, cfg)  # passed: outcome reward 1, whatever its own process rewards
    farmer = compose(0.0, farmer_steps, cfg)  # failed the outcome, farming anything
    assert farmer.total < golden.total
    w = cfg.outcome_weight
    assert -cfg.penalty_cap * w - 1e-9 <= farmer.process <= cfg.process_cap * w + 1e-9


@settings(max_examples=300, deadline=None)
@given(config_st, steps_st, st.floats(0, 1))
def test_step_shares_sum_to_the_capped_process_reward(cfg, steps, outcome):
    c = compose(outcome, steps, cfg)
    assert len(c.step_rewards) == len(steps)
    assert math.isclose(sum(c.step_rewards), c.process, rel_tol=1e-6, abs_tol=1e-6 * max(1.0, abs(c.process_raw)))
    assert math.isclose(c.total, cfg.outcome_weight * outcome + c.process, rel_tol=1e-9, abs_tol=1e-9)
    for name, comp in c.components.items():
        cap = cfg.component(name).cap
        assert cap is None or abs(comp["capped"]) <= cap + 1e-9
        assert comp["raw"] == pytest.approx(sum(s.get(name, 0.0) for s in steps))


def test_caps_and_weights_recorded_raw_and_capped():
    cfg = RewardConfig(components={"tool": Component(weight=1.0, cap=0.2), "checkpoint": Component(weight=0.5)})
    c = compose(1.0, [{"tool": 0.3}, {"tool": 0.3}, {"checkpoint": 1.0}], cfg)
    assert c.components["tool"] == {"raw": 0.6, "weight": 1.0, "weighted": 0.6, "capped": 0.2}
    assert c.components["checkpoint"]["weighted"] == 0.5
    assert c.process == pytest.approx(0.5) and c.process_raw == pytest.approx(1.1) and c.total == pytest.approx(1.5)
    assert c.to_dict()["components"]["tool"]["capped"] == 0.2


def test_the_default_config_caps_a_farmed_reward_at_half_the_outcome():
    farmed = compose(0.0, [{"step": 1.0}] * 100)
    assert farmed.process_raw == 100 and farmed.total == 0.5 and compose(1.0, [{"step": -5.0}]).total == 0.75


def test_a_config_that_lets_process_outweigh_the_outcome_is_refused():
    with pytest.raises(ValueError, match="outweigh the outcome"):
        RewardConfig(process_cap=0.8, penalty_cap=0.2)
    with pytest.raises(ValueError):
        Component(weight=-1)


def test_without_the_total_cap_a_farmer_beats_the_golden(monkeypatch):
    """Break it on purpose: with the total clip removed, 100 farmed steps outrank a passed episode."""
    monkeypatch.setattr(rewards, "_clip", lambda x, lo, hi: x)
    assert compose(0.0, [{"step": 1.0}] * 100).total > compose(1.0, []).total


def test_dapo_overlong_penalty_inside_the_caps():
    ol = Overlong(max_length=100, buffer=20)
    assert (ol.penalty(80), ol.penalty(90), ol.penalty(100), ol.penalty(150)) == (0.0, -0.5, -1.0, -1.0)
    cfg = RewardConfig(overlong=ol)
    c = compose(1.0, [{}], cfg, response_length=90)
    assert c.components["overlong"]["raw"] == -0.5 and c.total == pytest.approx(0.75)  # penalty capped at 0.25
    assert compose(1.0, [], cfg, response_length=50).total == 1.0
    assert compose(1.0, [], RewardConfig(clip=(0.0, 0.9))).total == 0.9


def test_step_components_from_the_env():
    assert step_components(0.5, {}) == {"step": 0.5}
    assert step_components(0.0, None) == {}
    assert step_components(0.1, {"reward_components": {"tool": 0.1, "format": -1}}) == {"tool": 0.1, "format": -1.0}
