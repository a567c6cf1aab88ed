"""``envhub.rollout.request``: the one rollout request type, its wire form, and the one resolution rule."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import envhub
from envhub.backends.base import SamplingParams
from envhub.rollout.request import (
    Instance, RequestError, RolloutConfig, RolloutRequest, TaskIndex, TaskNotFound, config_from_wire, config_to_wire,
)

small = st.integers(min_value=1, max_value=100_000)
maybe = st.one_of(st.none(), small)
configs = st.builds(
    RolloutConfig,
    max_turns=maybe, max_length=small, max_prompt_length=maybe, max_response_length=maybe,
    sampling=st.builds(SamplingParams, max_tokens=small, temperature=st.floats(0, 2), top_p=st.floats(0, 1),
                       top_k=st.integers(-1, 100), seed=st.one_of(st.none(), st.integers(0, 2**31)),
                       stop=st.lists(st.text(min_size=1, max_size=5), max_size=3),
                       stop_token_ids=st.lists(st.integers(0, 50_000), max_size=3),
                       extra=st.dictionaries(st.sampled_from(["min_p", "repetition_penalty"]), st.floats(0, 1))),
    parser=st.sampled_from(["auto", "hermes"]), policy_version=st.one_of(st.none(), st.integers(0, 10**6), st.text()),
)


@settings(max_examples=200, deadline=None)
@given(configs, st.one_of(st.none(), st.floats(0.01, 1e4)))
def test_the_wire_form_reads_back_as_the_same_config(config, timeout):
    """Every field that shapes a rollout survives ``to_wire`` -> ``from_wire`` (caps included: a cap lost on the way
    would let the service spend tokens a trainer then has to throw away)."""
    back, timeout_back, ignored = config_from_wire(config_to_wire(config, timeout))
    assert back == config and timeout_back == timeout and ignored == []


def test_every_config_field_is_on_the_wire():
    """A field added to RolloutConfig must be given a wire form (or be declared local, as ``env_kwargs``)."""
    from dataclasses import fields

    local = {"env_kwargs", "seed"}  # env_kwargs never travel; the seed travels in the instance
    c = RolloutConfig(max_turns=3, max_length=99, max_prompt_length=7, max_response_length=8, parser="hermes",
                      policy_version=5, sampling=SamplingParams(max_tokens=9, temperature=0.5, top_p=0.9, top_k=4,
                                                                seed=1, stop=["x"], stop_token_ids=[2],
                                                                extra={"min_p": 0.1}))
    for f in fields(RolloutConfig):
        if f.name in local:
            continue
        default = RolloutConfig()
        changed = RolloutConfig(**{**{g.name: getattr(default, g.name) for g in fields(default)},
                                   f.name: getattr(c, f.name)})
        assert config_from_wire(config_to_wire(changed))[0] == changed, f.name


def test_env_kwargs_do_not_travel_and_the_seed_rides_in_the_instance():
    with pytest.raises(RequestError, match="env_kwargs"):
        config_to_wire(RolloutConfig(env_kwargs={"sandbox": "/"}))
    req = RolloutRequest(Instance("countdown", task_id="t"), RolloutConfig(seed=11))
    wire = req.to_wire()
    assert wire["instance"]["seed"] == 11
    back, _ = RolloutRequest.from_wire(wire["instance"], wire["sampling_params"])
    assert back.config.seed == 11 and back == req
    with pytest.raises(RequestError, match="instance.seed"):
        RolloutRequest.from_wire({"env_id": "e", "task_id": "t", "seed": "1"}, {})


def test_instance_round_trips_and_accepts_prorl_aliases():
    for inst in (Instance("e", task_id="t"), Instance("e", task_id="t", split="dev", trajectory_id=2),
                 Instance.from_dict({"env_id": "e", "task": {"task_id": "x", "a": 1}}),
                 Instance("e", task_id="t", harness="codex")):
        assert Instance.from_dict(inst.to_dict()) == inst
    assert Instance.from_dict({"data_source": "e", "instance_id": 5}) == Instance("e", task_id="5")
    assert Instance.from_dict({"task_id": "t"}, env_id="d", split="s") == Instance("d", task_id="t", split="s")
    assert Instance.from_dict({"env_id": "e", "task_id": "t", "split": "x"}, split="s").split == "x"


def test_one_resolution_rule():
    """A task id is looked up in the named split, else in the env's default split and nowhere else."""
    spec = envhub.get_spec("guess-number")
    index = TaskIndex()
    test_row = spec.load_tasks(spec.default_split)[0]
    other = next(s for s in ("train", "test") if s != spec.default_split)
    other_row = spec.load_tasks(other)[0]
    assert index.resolve(Instance(spec.id, task_id=test_row["task_id"]))[1] == dict(test_row)
    assert index.resolve(Instance(spec.id, task_id=other_row["task_id"], split=other))[1] == dict(other_row)
    if other_row["task_id"] not in {r["task_id"] for r in spec.load_tasks(spec.default_split)}:
        with pytest.raises(TaskNotFound, match="default split"):
            index.resolve(Instance(spec.id, task_id=other_row["task_id"]))
    with pytest.raises(TaskNotFound, match="no task split 'nope'"):
        index.resolve(Instance(spec.id, task_id="x", split="nope"))
    with pytest.raises(KeyError, match="no-such-env"):
        index.resolve(Instance("no-such-env", task_id="x"))
    row = {"task_id": "inline-1", "secret": 3, "budget": 4}
    assert index.resolve(Instance(spec.id, task=row))[1] == row
