"""``envhub.training.source``: how trainer adapters read instances, configure themselves, run and cap episodes.

In-process runs use envhub's real executor with the scripted backend and the real tiny tokenizer; no trainer is
needed (the trainers' own code paths are tested in tests/adapters, in the trainers venv).
"""
import asyncio
import json

import pytest

from envhub.backends.base import SamplingParams
from envhub.backends.scripted import ScriptedBackend
from envhub.rollout.request import Instance, RolloutRequest
from envhub.rollout.trajectory import Trajectory
from envhub.training.source import AdapterOptions, EpisodeRunner, InstanceError, check_caps, parse_instance


def test_instance_shapes():
    opts = AdapterOptions(env_id="countdown", split="train")
    assert parse_instance('{"env_id": "guess-number", "task_id": "g1"}', opts) == Instance(
        "guess-number", task_id="g1", split="train")
    assert parse_instance("countdown-1-0007", opts) == Instance("countdown", task_id="countdown-1-0007", split="train")
    row = {"task_id": "x", "numbers": [1, 2], "target": 3}
    assert parse_instance({"task": row}, opts).task == row
    assert parse_instance(b'{"env_id": "e", "task_id": "t", "split": "test"}').split == "test"


@pytest.mark.parametrize("label, match", [
    ("{not json", "not valid JSON"),
    ("task-7", "needs a configured env_id"),
    ('{"task_id": "t"}', "must name its env"),
    ('{"env_id": "countdown"}', "must give the task"),
    ('{"env_id": "countdown", "task": [1, 2]}', "must be a task row"),
    ("[1, 2]", "not an instance"),
    (42, "must be a JSON object"),
])
def test_bad_instances_are_clear_errors(label, match):
    with pytest.raises(InstanceError, match=match):
        parse_instance(label)


def test_options_from_config_and_environment():
    opts = AdapterOptions.resolve({"env_id": "countdown", "max_turns": "3"},
                                  environ={"ENVHUB_SERVICE_URLS": "http://a:1, http://b:2", "ENVHUB_SPLIT": "test"})
    assert opts.service_urls == ["http://a:1", "http://b:2"] and opts.split == "test" and opts.max_turns == 3
    with pytest.raises(ValueError, match="unknown envhub adapter option"):
        AdapterOptions.resolve({"env": "countdown"}, environ={})
    with pytest.raises(ValueError, match="must be a number"):
        AdapterOptions.resolve({"timeout_s": "soon"}, environ={})


def test_the_request_carries_the_agent_keys_and_the_caps():
    """What an adapter sends the service: sampling, agent keys and both length caps (so the service enforces them
    before spending tokens), read back by the service into the same config."""
    runner = EpisodeRunner(AdapterOptions(env_id="countdown", max_turns=4, timeout_s=30.0), tokenizer=None)
    req = runner.request("countdown-1-0007", SamplingParams(max_tokens=64, temperature=0.7, seed=3, stop=["</answer>"]),
                         max_length=4096, max_prompt_length=512, max_response_length=1024, policy_version=7)
    wire = req.to_wire()
    assert wire["instance"] == {"env_id": "countdown", "task_id": "countdown-1-0007"}
    assert wire["sampling_params"] == {"max_tokens": 64, "temperature": 0.7, "top_p": 1.0, "top_k": -1, "seed": 3,
                                       "stop": ["</answer>"], "max_length": 1536, "max_turns": 4, "timeout": 30.0,
                                       "max_input_tokens": 512, "max_response_length": 1024, "policy_version": 7}
    back, ignored = RolloutRequest.from_wire(wire["instance"], wire["sampling_params"])
    assert back == req and ignored == []


def test_check_caps_marks_what_a_service_let_through():
    t = Trajectory(env_id="e", task_id="t", prompt_ids=[1, 2, 3], response_ids=[4, 5, 6, 7],
                   response_mask=[1, 1, 0, 1], response_logprobs=[-1.0, -2.0, 0.0, -3.0], reward=1.0, passed=True)
    over = check_caps(t, 8, 2)
    assert over.finish_reason == "error" and over.response_ids == [] and over.reward == 0.0 and not over.passed
    assert "response of 4 tokens > max_response_length 2" in over.error and "older envhub" in over.error
    long_prompt = check_caps(t, 2, 8)
    assert long_prompt.finish_reason == "error" and long_prompt.response_ids == [] and long_prompt.reward == 0.0
    assert "prompt of 3 tokens > max_prompt_length 2" in long_prompt.error
    assert check_caps(t, None, None) is t and check_caps(t, 3, 4) is t


@pytest.fixture(scope="module")
def gn_task():
    import envhub

    spec = envhub.get_spec("guess-number")
    return spec, next(r for r in spec.load_tasks("test") if r["budget"] >= 6)


def run(runner, label, policy, **kw):
    kw.setdefault("max_length", 4096)
    return asyncio.run(runner.run(label, ScriptedBackend(policy), SamplingParams(max_tokens=64), **kw))


def test_runner_in_process_matches_a_direct_rollout(tiny_tokenizer, gn_task):
    from envhub.rollout.executor import RolloutConfig, rollout

    spec, task = gn_task
    runner = EpisodeRunner(AdapterOptions(env_id=spec.id, split="test"), tiny_tokenizer)
    got = run(runner, task["task_id"], spec.golden)
    ref = asyncio.run(rollout(spec, task, ScriptedBackend(spec.golden), tiny_tokenizer,
                              RolloutConfig(max_length=4096, sampling=SamplingParams(max_tokens=64))))
    assert got.reward == ref.reward == 1.0
    assert (got.prompt_ids, got.response_ids, got.response_mask) == (ref.prompt_ids, ref.response_ids,
                                                                       ref.response_mask)


def test_runner_caps_and_failures_are_marked(tiny_tokenizer, gn_task):
    spec, task = gn_task
    runner = EpisodeRunner(AdapterOptions(), tiny_tokenizer)
    label = json.dumps({"env_id": spec.id, "task_id": task["task_id"], "split": "test"})
    full = run(runner, label, spec.hack_probes["claim-victory"])
    capped = run(runner, label, spec.hack_probes["claim-victory"], max_response_length=40)
    assert len(full.response_ids) > 40 and len(capped.response_ids) <= 40
    assert capped.response_ids == full.response_ids[: len(capped.response_ids)]
    # `truncated` (OpenRLHF's meaning): whether the model's last turn itself was cut, not the env reply after it
    last = len(capped.action_ranges) - 1
    assert capped.finish_reason == "length"
    assert capped.truncated == (capped.action_ranges[last] != full.action_ranges[last])

    too_long = run(runner, label, spec.golden, max_prompt_length=5)
    assert too_long.finish_reason == "error" and "prompt length 5" in too_long.error and too_long.response_ids == []
    missing = run(runner, json.dumps({"env_id": spec.id, "task_id": "nope", "split": "test"}), spec.golden)
    assert missing.finish_reason == "error" and "has no task 'nope'" in missing.error
    unknown = run(runner, '{"env_id": "no-such-env", "task_id": "x"}', spec.golden)
    assert unknown.finish_reason == "error" and "no-such-env" in unknown.error and unknown.env_id == "no-such-env"
    no_engine = asyncio.run(runner.run(label, None, SamplingParams(), max_length=100))
    assert no_engine.finish_reason == "error" and "need the trainer's engine" in no_engine.error


def test_runner_timeout_is_marked(tiny_tokenizer):
    import time

    from envhub import EnvSpec, Response, TextEnv

    class Stuck(TextEnv):
        def start(self, task):
            return "wait"

        def respond(self, action):
            time.sleep(1.0)
            return Response("late", done=True, artifacts={})

    spec = EnvSpec(id="stuck-source-test", env=Stuck, tasks=lambda s: [], verifier=lambda t, a: True,
                   golden=lambda t, m: "ok")
    from envhub.plugins import Hub
    from envhub.rollout.request import TaskIndex

    hub = Hub(entry_points=[])
    hub.register(spec)
    runner = EpisodeRunner(AdapterOptions(timeout_s=0.3), tiny_tokenizer, index=TaskIndex(hub))
    t = run(runner, {"env_id": spec.id, "task": {"task_id": "s"}}, spec.golden)
    assert t.finish_reason == "timeout" and t.reward == 0.0 and t.task_id == "s"


def test_a_row_that_does_not_resolve_is_logged_once_with_its_ids(tiny_tokenizer, caplog):
    import logging

    runner = EpisodeRunner(AdapterOptions(), tiny_tokenizer)
    with caplog.at_level(logging.ERROR, logger="envhub.training.source"):
        t = run(runner, '{"env_id": "no-such-env", "task_id": "x"}', lambda task, messages: "hi")
    assert t.finish_reason == "error"
    recs = [r for r in caplog.records if r.name == "envhub.training.source"]
    assert len(recs) == 1 and (recs[0].env_id, recs[0].task_id, recs[0].stage) == ("no-such-env", "x", "resolve")
