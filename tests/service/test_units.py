"""Fast unit tests of the service's pure parts: the phase timer, the result cache, request parsing."""
from __future__ import annotations

import time

import pytest

from envhub.service.jobs import PhaseTimer, ResultCache
from envhub.rollout.request import Instance, RequestError, config_from_wire, split_params


def test_phase_timer_counts_only_stages():
    t = PhaseTimer(timeout=1.0)
    time.sleep(0.05)  # queued
    t.enter("init")
    time.sleep(0.05)
    t.exit()
    time.sleep(0.05)  # queued again
    t.enter("run")
    time.sleep(0.02)
    assert 0.06 < t.counted() < 0.2 and 0.8 < t.remaining() < 0.94
    t.exit()
    timing = t.timing()
    assert timing["others_time"] >= 0.1 and timing["init_time"] >= 0.05 and timing["run_time"] >= 0.02
    assert timing["counted_elapsed"] == pytest.approx(timing["init_time"] + timing["run_time"] + timing["eval_time"])
    assert PhaseTimer(None).remaining() is None


def test_result_cache_is_bounded_by_count_bytes_and_age():
    c = ResultCache(size=3, max_bytes=10, ttl_s=0.2)
    c.put("a", "fa", b"12345")
    c.put("b", "fb", b"12345")
    c.put("c", "fc", b"1")  # 11 bytes > 10: the oldest goes
    assert c.get("a") is None and c.get("c") == ("fc", b"1") and c.bytes == 6
    time.sleep(0.25)
    assert c.get("b") is None and len(c) == 0 and c.bytes == 0


def test_instances_name_env_and_task():
    assert Instance.from_dict({"env_id": "x", "task_id": "t"}).env_id == "x"
    assert Instance.from_dict({"data_source": "y", "instance_id": 7}) == Instance("y", task_id="7")
    with pytest.raises(RequestError, match="env_id"):
        Instance.from_dict({"task_id": "t"})
    assert Instance.from_dict({"env_id": "e", "task": {"task_id": 3, "a": 1}}).task == {"task_id": "3", "a": 1}
    assert Instance.from_dict({"env_id": "e", "task": {"a": 1}, "instance_id": "i-1"}).task["task_id"] == "i-1"
    assert Instance.from_dict({"env_id": "e", "task": {"a": 1}}).task["task_id"].startswith("inline-")
    assert Instance.from_dict({"env_id": "e", "task_id": "t", "split": "dev"}).split == "dev"
    for bad, key in (({"env_id": "x"}, "task"), ({"env_id": "x", "task_id": "t", "split": 3}, "split"),
                     ({"env_id": "x", "task": [1]}, "task"),
                     ({"env_id": "x", "task_id": "t", "harness": 1}, "harness"), ([1], "JSON object")):
        with pytest.raises(RequestError, match=key):
            Instance.from_dict(bad)


def test_sampling_params_split_like_prorl():
    sampling, agent, ignored = split_params({"temperature": 0.6, "max_iterations": 5, "model": "hosted_vllm/q",
                                             "api_key": "k", "repetition_penalty": 1.1, "timeout": 9})
    assert sampling == {"temperature": 0.6, "repetition_penalty": 1.1}
    assert agent == {"max_turns": 5, "timeout": 9} and ignored == ["api_key", "model"]
    cfg, timeout, _ = config_from_wire({"max_new_tokens": 7, "stop": "</a>", "max_turns": 2.0, "policy_version": 3})
    assert cfg.sampling.max_tokens == 7 and cfg.sampling.stop == ["</a>"] and cfg.max_turns == 2
    assert cfg.policy_version == 3 and timeout is None
    assert config_from_wire({"timeout": 5})[1] == 5
    for bad in ({"max_tokens": 1.5}, {"temperature": -1}, {"top_k": -2}, {"seed": True}, {"stop_token_ids": ["a"]},
                {"max_length": 0}, {"timeout": float("inf")}, {"max_response_length": 0}, {"policy_version": [1]}):
        with pytest.raises(RequestError) as e:
            config_from_wire(bad)
        assert next(iter(bad)) in str(e.value)


@pytest.mark.parametrize("rewards,keep", [([1.0, 1.0], False), ([0.0, 1.0], True), ([0.3, 0.1 + 0.2], False),
                                          ([0.5], False), ([], False), ([0.0, 0.0, 1e-6], True)])
def test_the_dapo_collector_keeps_groups_by_the_trainers_rule(rewards, keep):
    """``Group.informative`` is ``dapo_keep`` (one DAPO keep/drop rule), with float noise counted as equal."""
    from types import SimpleNamespace

    from envhub.training.dapo import TOL, Group
    from envhub.training.advantages import dapo_keep

    group = Group("k", {}, [SimpleNamespace(reward=r) for r in rewards])
    assert group.informative is keep
    if rewards:
        assert dapo_keep(rewards, group_size=len(rewards), tol=TOL) == [keep] * len(rewards)
