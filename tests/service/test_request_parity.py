"""One request, one resolution, wherever it runs: the same instances through the in-process adapter path and through
a real rollout service on loopback resolve to the same tasks (or fail the same way), and the trainer's length caps
travel with the request, so the service enforces them instead of spending tokens a trainer would throw away."""
from __future__ import annotations

import pytest

import envhub
from envhub.backends.base import SamplingParams
from envhub.backends.scripted import ScriptedBackend
from envhub.training.source import AdapterOptions, EpisodeRunner

pytestmark = pytest.mark.asyncio


def _instances():
    spec = envhub.get_spec("guess-number")
    default = spec.load_tasks(spec.default_split)
    other = next(s for s in ("train", "test") if s != spec.default_split)
    other_rows = spec.load_tasks(other)
    only_other = next(r for r in other_rows if r["task_id"] not in {d["task_id"] for d in default})
    inline = {k: v for k, v in dict(default[1]).items() if k != "task_id"}
    return spec, [
        {"env_id": spec.id, "task_id": default[0]["task_id"]},                        # default split
        {"env_id": spec.id, "task_id": only_other["task_id"], "split": other},       # named split
        {"env_id": spec.id, "task_id": only_other["task_id"]},                        # not in the default split
        {"data_source": spec.id, "instance_id": default[2]["task_id"]},               # ProRL's aliases
        {"env_id": spec.id, "task": dict(default[3])},                                # inline row with its id
        {"env_id": spec.id, "task": inline},                                          # inline row without an id
        {"env_id": spec.id, "task_id": "no-such-task"},
        {"env_id": spec.id, "task_id": default[0]["task_id"], "split": "no-such-split"},
        {"env_id": "no-such-env", "task_id": "x"},
    ]


def _outcome(traj) -> tuple:
    """What resolution decided: the task that ran (and its reward), or the kind of failure."""
    if traj.finish_reason == "error":
        for kind in ("has no task split", "has no task", "no-such-env"):
            if kind in (traj.error or ""):
                return ("error", kind)
        return ("error", traj.error)
    return (traj.task_id, traj.reward, traj.passed)


async def test_instances_resolve_identically_in_process_and_over_http(serve, tiny_tokenizer):
    spec, instances = _instances()
    srv = serve()
    sampling = SamplingParams(max_tokens=64)
    local = EpisodeRunner(AdapterOptions(), tiny_tokenizer)
    remote = EpisodeRunner(AdapterOptions(service_urls=[srv.url]), tiny_tokenizer)
    try:
        for inst in instances:
            a = await local.run(inst, ScriptedBackend(spec.golden), sampling, max_length=4096)
            b = await remote.run(inst, None, sampling, max_length=4096)
            assert _outcome(a) == _outcome(b), inst
            if a.finish_reason != "error":  # the golden ran on the same task: the same tokens, both ways
                assert (a.prompt_ids, a.response_ids, a.response_mask) == (b.prompt_ids, b.response_ids,
                                                                           b.response_mask), inst
    finally:
        await remote.aclose()
    outcomes = [_outcome(await local.run(i, ScriptedBackend(spec.golden), sampling, max_length=4096))
                for i in instances]
    # the rule itself: found in the default and the named split, not elsewhere; inline rows run as given
    assert [o[0] != "error" for o in outcomes] == [True, True, False, True, True, True, False, False, False]
    assert outcomes[2] == ("error", "has no task") and outcomes[7] == ("error", "has no task split")


async def test_the_trainers_caps_travel_to_the_service(serve, tiny_tokenizer):
    """The service enforces max_prompt_length before RUN and max_response_length while sampling. (Without the caps
    on the wire it would run the whole episode and the adapter's guard would then throw it away as an error.)"""
    spec = envhub.get_spec("guess-number")
    task = next(r for r in spec.load_tasks("test") if r["budget"] >= 6)
    inst = {"env_id": spec.id, "task_id": task["task_id"], "split": "test"}
    srv = serve()
    remote = EpisodeRunner(AdapterOptions(service_urls=[srv.url]), tiny_tokenizer)
    sampling = SamplingParams(max_tokens=64)
    try:
        full = await remote.run(inst, None, sampling, max_length=4096)
        capped = await remote.run(inst, None, sampling, max_length=4096, max_response_length=40)
        short = await remote.run(inst, None, sampling, max_length=4096, max_prompt_length=5)
    finally:
        await remote.aclose()
    assert full.finish_reason == "done" and len(full.response_ids) > 40
    assert capped.finish_reason == "length" and 0 < len(capped.response_ids) <= 40, capped.error
    assert capped.response_ids == full.response_ids[: len(capped.response_ids)]
    assert short.finish_reason == "error" and "max_prompt_length" in short.error and short.response_ids == []
    assert "older envhub" not in (short.error or "") and short.num_turns == 0



async def test_a_grader_crash_is_the_same_failure_in_process_and_over_http(serve, tiny_tokenizer, caplog):
    """A verifier that raises gives no verdict: a failed rollout (nothing trained), both ways; a verifier that
    quotes agent text reading "verifier crashed" is a wrong answer, both ways (the typed flag, not the text)."""
    import logging

    srv = serve()
    sampling = SamplingParams(max_tokens=128)
    local = EpisodeRunner(AdapterOptions(), tiny_tokenizer)
    remote = EpisodeRunner(AdapterOptions(service_urls=[srv.url]), tiny_tokenizer)
    try:
        for env_id, task_id in (("svc-raise-eval", "re-1"), ("svc-raise-aeval", "ra-1"), ("svc-crash-text", "ct-1")):
            spec = envhub.get_spec(env_id)
            inst = {"env_id": env_id, "task_id": task_id}
            caplog.clear()
            with caplog.at_level(logging.ERROR):
                a = await local.run(inst, ScriptedBackend(spec.golden), sampling, max_length=1024)
                b = await remote.run(inst, None, sampling, max_length=1024)
            crashed = env_id != "svc-crash-text"
            assert (a.finish_reason == "error") is crashed and (b.finish_reason == "error") is crashed, (a, b)
            assert a.reward == b.reward == 0.0 and not a.passed and not b.passed
            if crashed:
                assert a.error.startswith("EVAL: ") and b.error.startswith("EVAL: ")
                assert sum(a.loss_mask) == 0 and sum(b.loss_mask) == 0  # nothing of it is trained on
                # one failure record per run: the executor's in-process, the service's (with its job id) over HTTP
                for logger in ("envhub.rollout.executor", "envhub.service"):
                    assert [r.stage for r in caplog.records if r.name == logger and hasattr(r, "stage")] == ["eval"]
            else:
                assert a.finish_reason == b.finish_reason == "done" and sum(a.loss_mask) > 0
    finally:
        await remote.aclose()
