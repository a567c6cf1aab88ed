"""Admission's shaping-hack check (#30): a policy farming an env's step rewards (the golden's rewarded lookups, over
and over) must fail the outcome and total less than the golden; the caps of ``envhub.rewards`` are what make it so."""
from __future__ import annotations

import pytest

import envhub.probes as probes
from envhub import EnvSpec
from envhub.admission import admit
from envhub.grading import Budget
from envhub.rewards import Composed, RewardConfig
from envhub.scaffold_template import tool_env as S

pytestmark = pytest.mark.timeout(300)
BUDGET = Budget(regrades=4, min_total=8, seconds=2)
TASKS = S.make_tasks(0, 3)


class ShapedShop(S.ShopEnv):
    """The scaffold's shop, crediting 0.2 per price lookup (a process reward a policy can farm)."""

    def respond(self, action):
        r = super().respond(action)
        n = sum(c.name == "price" for c in action.tool_calls)
        if n:
            r.reward = 0.2 * n
            r.info["reward_components"] = {"lookup": 0.2 * n}
        return r


def spec(rewards: RewardConfig | None = None) -> EnvSpec:
    return EnvSpec(id="shaped-shop", env=ShapedShop, tasks=lambda split: TASKS, verifier=S.verify, golden=S.golden,
                   hack_probes=dict(S.HACK_PROBES), max_turns=6, rewards=rewards)


def check(report, name):
    return [c for t in report.tasks for c in t.checks if c.name == name]


def test_farming_the_step_reward_scores_below_the_golden_and_fails():
    report = admit(spec(), budget=BUDGET)
    assert report.fit, report.unfit_reasons
    totals = check(report, "shaping-hack:total")
    assert len(totals) == 3 and all(c.ok and c.status == "pass" for c in totals)
    assert "process raw 3.000, capped 0.500" in totals[0].message and "golden 1.500" in totals[0].message
    assert all(c.ok for c in check(report, "shaping-hack"))  # the farmer's outcome fails, as every probe's must


def uncapped(outcome, steps, config=None, **kw):
    raw = sum(v for s in steps for v in s.values())
    return Composed(outcome + raw, outcome, raw, raw, [], {})


def test_without_the_caps_the_farmer_outranks_the_golden(monkeypatch):
    """Break it on purpose: composition without caps (the pre-#30 executor's ``reward + sum(step_rewards)``)."""
    monkeypatch.setattr(probes, "compose", uncapped)
    report = admit(spec(), budget=BUDGET)
    assert not report.fit
    assert all(not c.ok for c in check(report, "shaping-hack:total"))
    assert any(r.startswith("shaping-hack:total check failed on 3 task(s)") for r in report.unfit_reasons)


def test_envs_without_step_rewards_skip_the_check():
    plain = EnvSpec(id="shop", env=S.ShopEnv, tasks=lambda split: TASKS, verifier=S.verify, golden=S.golden,
                    hack_probes=dict(S.HACK_PROBES), max_turns=6)
    report = admit(plain, budget=BUDGET)
    assert report.fit and all(c.status == "skip" for c in check(report, "shaping-hack:total"))
