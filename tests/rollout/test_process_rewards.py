"""The executor composes the outcome with the env's step rewards through ``envhub.rewards`` (#30): capped, raw and
capped recorded, ``step_rewards`` the capped per-turn shares (veRL's ``turn_scores``); farming scores below the golden."""
from __future__ import annotations

import pytest

import envhub.rollout.executor as executor
from envhub import EnvSpec
from envhub.backends.scripted import ScriptedBackend
from envhub.probes import farming_probe
from envhub.rewards import Overlong, RewardConfig, token_rewards
from envhub.rollout.executor import rollout
from envhub.rollout.request import RolloutConfig
from envhub.scaffold_template import tool_env as S

pytestmark = pytest.mark.timeout(120)
TASKS = S.make_tasks(0, 2)


class ShapedShop(S.ShopEnv):
    def respond(self, action):
        r = super().respond(action)
        n = sum(c.name == "price" for c in action.tool_calls)
        if n:
            r.reward = 0.2 * n
            r.info["reward_components"] = {"lookup": 0.2 * n}
        return r


def spec(rewards=None) -> EnvSpec:
    return EnvSpec(id="shaped-shop", env=ShapedShop, tasks=lambda split: TASKS, verifier=S.verify, golden=S.golden,
                   max_turns=6, rewards=rewards)


def golden_actions(task):
    env = spec().make()
    messages, _ = env.reset(options={"task": task})
    actions, history = [], list(messages)
    while True:
        a = S.golden(task, history)
        actions.append(a)
        obs, _, done, trunc, _ = env.step(a)
        history += [a.to_message(), *obs]
        if done or trunc:
            return actions


async def test_the_golden_and_the_farmer_through_the_executor(tiny_tokenizer):
    task = TASKS[0]
    g = await rollout(spec(), task, ScriptedBackend(S.golden), tiny_tokenizer)
    assert g.passed and g.num_turns == 2
    rec = g.details["reward"]
    assert rec["components"]["lookup"]["raw"] == pytest.approx(0.6) and rec["process"] == pytest.approx(0.5)
    assert g.reward == pytest.approx(1.5) and sum(g.step_rewards) == pytest.approx(0.5)
    assert len(g.step_rewards) == g.num_turns and g.step_rewards[-1] == 0.0  # the finish turn earned nothing
    farmer = farming_probe(golden_actions(task), 6).policy
    f = await rollout(spec(), task, ScriptedBackend(farmer), tiny_tokenizer)
    assert not f.passed and f.details["reward"]["process_raw"] == pytest.approx(3.0)
    assert f.reward == pytest.approx(0.5) and f.reward < g.reward


async def test_without_composition_the_farmer_outranks_the_golden(tiny_tokenizer, monkeypatch):
    """Break it on purpose: the pre-#30 sum (outcome + every step reward, uncapped)."""
    from envhub.rewards import Composed

    monkeypatch.setattr(executor, "compose", lambda o, steps, cfg, **kw: Composed(
        o + sum(v for s in steps for v in s.values()), o, 0.0, 0.0, [sum(s.values()) for s in steps], {}))
    task = TASKS[0]
    g = await rollout(spec(), task, ScriptedBackend(S.golden), tiny_tokenizer)
    f = await rollout(spec(), task, ScriptedBackend(farming_probe(golden_actions(task), 6).policy), tiny_tokenizer)
    assert f.reward > g.reward


async def test_the_overlong_penalty_applies_to_model_tokens(tiny_tokenizer):
    base = await rollout(spec(), TASKS[0], ScriptedBackend(S.golden), tiny_tokenizer)
    n = sum(base.response_mask)
    cfg = RewardConfig(overlong=Overlong(max_length=n, buffer=n))  # n tokens reach max_length: the full -1
    t = await rollout(spec(cfg), TASKS[0], ScriptedBackend(S.golden), tiny_tokenizer, RolloutConfig())
    assert t.details["reward"]["components"]["overlong"]["raw"] == -1.0
    assert t.reward == pytest.approx(0.75)  # +0.6 lookups - 1 overlong = -0.4, floored at the penalty cap -0.25


async def test_step_rewards_on_token_positions(tiny_tokenizer):
    g = await rollout(spec(), TASKS[0], ScriptedBackend(S.golden), tiny_tokenizer)
    per_token = token_rewards(g.step_rewards, g.action_ranges, len(g.response_ids), g.reward)
    assert len(per_token) == len(g.response_ids) and sum(per_token) == pytest.approx(g.reward)
    (a0, a1), (b0, b1) = g.action_ranges
    assert per_token[a1 - 1] == pytest.approx(0.5)  # the lookups' capped share, on the first turn's last token
    assert per_token[b1 - 1] == pytest.approx(1.0)  # the outcome, on the last model token
    assert sum(1 for x in per_token if x) == 2 and all(g.response_mask[i] for i, x in enumerate(per_token) if x)
    assert token_rewards([0.1], [], 5, 1.0) == [0.0] * 5
