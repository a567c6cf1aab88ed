"""ProRL wire conformance: ProRL Agent's trainer-side clients (mirrored in ``prorl_clients``, call sites cited
there and below) train on ``envhub serve``'s replies, over a text env (countdown), a multi-turn env
(guess-number) and a tool env (math-python, a real bwrap sandbox), against a real server on loopback.

What must reach the client's batch exactly: rewards (``score``), truncation flags (``end_properly``), token ids and
logprobs (per-message ``token_ids``/``logprobs``), checked against envhub's own top-level fields of the same reply
(``prompt_ids``, ``response_ids``, ``response_mask``, ``response_logprobs``, ``reward``, ``finish_reason``), and
the logprobs against what the backend reported for each sampled token.
"""
from __future__ import annotations

import asyncio
import sys
from copy import deepcopy
from pathlib import Path

import aiohttp
import httpx
import pytest
import torch
from prorl_fixtures import logprob_of
from prorl_clients import (batched_data_dict_to_messages, calculate_metrics, dapo_filter_easy_hard_instance,
                           nemo_rl_sampling_params, request_from_prorl_server, results_to_batched_data_dict,
                           send_single_message, verl_convert)

from envhub.rollout.fidelity import check_trajectory

ENVS = ["countdown", "guess-number", "math-python"]  # text, multi-turn, tool (sandboxed python)


def dataset(env_id: str, n: int = 2) -> list[dict]:
    """Dataset rows as a ProRL trainer holds them: ``instance_id``, ``data_source``, ``extra_info``."""
    from envhub.plugins import default_hub

    spec = default_hub().get(env_id)
    rows = list(spec.load_tasks(spec.default_split))[:n]
    return [{"instance_id": r["task_id"], "data_source": env_id, "extra_info": {"split": spec.default_split,
                                                                                  "index": i}}
            for i, r in enumerate(rows)]


def replies_in_batch_order(results: dict, instances: list[dict]) -> list[dict]:
    """The replies in the order ``Results2BatchedDataDict`` walks them (instances, then insertion order)."""
    return [t for inst in instances for t in results[inst["instance_id"]].values()]


def padded(row: torch.Tensor, ids: list[int], pad: int) -> None:
    assert row[:len(ids)].tolist() == ids
    assert all(x == pad for x in row[len(ids):].tolist())


def check_sampled_logprobs(reply: dict) -> None:
    """Every assistant message's logprobs are the ones the backend reported for exactly those tokens."""
    for m in reply["messages"]:
        if m["role"] == "assistant":
            assert m["logprobs"] == pytest.approx([logprob_of(i, t) for i, t in enumerate(m["token_ids"])], abs=0)


@pytest.mark.parametrize("env_id", ENVS)
async def test_nemo_rl_and_verl_read_envhubs_exact_tokens_rewards_and_flags(prorl_server, tiny_tokenizer, env_id):
    """NeMo-RL ``ProRLEnvironment`` (yuki-97/NeMo-RL-ProRL ``nemo_rl/environments/prorl_environment.py`` @ 37e5157:
    ``__init__`` sampling params, ``BatchedDataDict2Messages``, ``_send_single_message_to_prorl_server``,
    ``Results2BatchedDataDict``, ``calculate_metrics``) and verl's converter (trim, assert, ``loss_mask``,
    ``rollout_log_probs``) over the same replies: what lands in their batches equals envhub's exact fields."""
    srv, backend = prorl_server()
    instances = dataset(env_id)
    sp = nemo_rl_sampling_params(max_prompt_length=4096, max_response_length=2048, max_turns=12)
    results = await request_from_prorl_server(srv.url, batched_data_dict_to_messages(instances, 2), sp)
    replies = deepcopy(replies_in_batch_order(results, instances))  # before the client turns ids into tensors
    pad = tiny_tokenizer.pad_token_id
    batch = results_to_batched_data_dict(results, {"instance": instances}, pad)

    assert len(replies) == 4 and all(r["finish_reason"] == "done" for r in replies), [r["error"] for r in replies]
    for row, r in enumerate(replies):
        padded(batch["prompt_ids"][row], r["prompt_ids"], pad)
        padded(batch["response_ids"][row], r["response_ids"], pad)
        assert batch["length"][row].item() == len(r["prompt_ids"])
        assert batch["total_reward"][row].item() == pytest.approx(r["reward"]) and r["score"] == r["reward"]
        assert batch["truncated"][row].item() is (r["finish_reason"] != "done")
        info = batch["extra_env_info"][row]
        assert info["resolved"] is r["passed"] and info["finish"] is True and info["success"] is True
        log = batch["message_log"][row]
        assert log[-1]["role"] == "assistant"
        gen_lp = torch.cat([m["generation_logprobs"] for m in log if m["role"] == "assistant"]).tolist()
        sampled = [lp for lp, k in zip(r["response_logprobs"], r["response_mask"]) if k]
        assert gen_lp == pytest.approx(sampled, abs=1e-6)  # float32 in the batch, as NeMo-RL stores them
        check_sampled_logprobs(r)
        for m in r["messages"]:  # each assistant message: the context it was sampled from
            if m["role"] == "assistant":
                full = r["prompt_ids"] + r["response_ids"]
                assert full[:len(m["input_ids"]) + len(m["token_ids"])] == m["input_ids"] + m["token_ids"]
    assert sum(r["reward"] for r in replies) > 0  # the golden players solve tasks: the reward is not lost
    metrics = calculate_metrics(batch, max_turns=12)
    assert metrics["truncation_rate"] == 0.0 and metrics["mean_total_reward"] > 0
    if env_id != "countdown":  # these trajectories end on the env's reply: trimmed, kept as trailing_messages
        assert all(r["trailing_messages"] and r["trailing_messages"][-1]["role"] in ("user", "tool")
                   for r in replies)

    v = verl_convert(replies, pad)
    for i, r in enumerate(replies):
        assert v["prompts"][i] == r["prompt_ids"] and v["responses"][i] == r["response_ids"]
        assert v["loss_mask"][i] == r["response_mask"]
        assert v["rollout_log_probs"][i] == r["response_logprobs"]
        assert v["resolved"][i] is r["passed"] and v["finish"][i] is True and v["error_mask"][i] is False

    # the LLM server got only sampling knobs: none of NeMo-RL's LiteLLM/OpenHands keys was forwarded
    assert backend.seen and all(p.extra == {} for p in backend.seen)
    assert {"model", "api_key", "strict_loop_detector", "custom_tokenizer"} <= set(
        replies[0]["details"]["ignored_params"])


async def test_envhub_client_gets_back_the_untrimmed_faithful_trajectory(prorl_server, tiny_tokenizer):
    """envhub's own client (``RolloutClient``) reads the ProRL-shaped reply back into the plain, untrimmed log,
    and the trajectory still passes the token-fidelity check (its messages re-render to its ids)."""
    from envhub.training.client import RolloutClient

    srv, _ = prorl_server()
    async with RolloutClient(srv.url) as c:
        raw = await c.process({"env_id": "guess-number", "task_id": "guess-2-0000"}, raw=True)
        traj = await c.process({"env_id": "guess-number", "task_id": "guess-2-0001"})
    assert raw["messages"][-1]["role"] == "assistant" and raw["trailing_messages"]
    assert traj.messages[-1]["role"] == "user" and not any("token_ids" in m for m in traj.messages)
    assert check_trajectory(traj, tiny_tokenizer) == []


async def test_sampling_caps_are_honoured_and_a_cut_reaches_the_batch_as_truncated(prorl_server, tiny_tokenizer):
    """ProRL's caps as NeMo-RL sends them (``max_input_tokens = max_prompt_length``, ``max_output_tokens =
    max_response_length``, ``max_model_len`` = their sum): no call samples past ``max_output_tokens`` or what is left
    of ``max_model_len`` (ProRL ``openhands/llm/nvidia/qwen3.py``: ``max_tokens = max_model_len - len(input_ids)``;
    ``openhands/llm/llm.py``: ``max_completion_tokens = max_output_tokens``), the sequence never exceeds
    ``max_model_len``, the cut reaches the batch as ``truncated`` with the assistant's message last; a prompt over
    ``max_input_tokens`` is a marked failure."""
    srv, backend = prorl_server()
    instances = dataset("guess-number", 1)
    async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c:
        probe = (await c.post("/process", json={"instance": {**instances[0], "trajectory_id": 9}})).json()
    prompt_len, cap = len(probe["prompt_ids"]), 40
    assert len(probe["response_ids"]) > cap  # uncapped, the golden game is longer than the cap
    backend.seen.clear()
    sp = nemo_rl_sampling_params(max_prompt_length=prompt_len, max_response_length=cap, max_turns=12)
    results = await request_from_prorl_server(srv.url, batched_data_dict_to_messages(instances, 2), sp)
    replies = deepcopy(replies_in_batch_order(results, instances))
    batch = results_to_batched_data_dict(results, {"instance": instances}, tiny_tokenizer.pad_token_id)
    for row, r in enumerate(replies):
        assert r["finish_reason"] == "length" and r["end_properly"] is False and batch["truncated"][row].item()
        assert len(r["prompt_ids"]) + len(r["response_ids"]) <= sp["max_model_len"]
        assert r["messages"][-1]["role"] == "assistant"
        assert sum(len(m["token_ids"]) for m in batch["message_log"][row]) == len(r["prompt_ids"]) + len(
            r["response_ids"])
        for m in r["messages"]:  # each call: at most max_output_tokens, within what max_model_len left
            if m["role"] == "assistant":
                assert len(m["token_ids"]) <= min(cap, sp["max_model_len"] - len(m["input_ids"]))
    assert backend.seen and all(p.max_tokens <= cap for p in backend.seen)
    assert calculate_metrics(batch, 12)["truncation_rate"] == 1.0

    tight = nemo_rl_sampling_params(max_prompt_length=prompt_len - 1, max_response_length=64, max_turns=12)
    async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c:
        r = (await c.post("/process", json={"instance": {**instances[0], "trajectory_id": 0},
                                            "sampling_params": tight})).json()
    assert r["finish_reason"] == "error" and r["critical_error"] == "init" and r["filter"] is True
    assert "max_prompt_length" in r["error"] and r["messages"] == [] and r["score"] == 0.0


def test_without_max_tokens_a_call_may_use_the_rest_of_max_model_len():
    """Not envhub's default 512: with only ``max_model_len`` (ProRL's token-level client), a call's cap is the
    rest of the context; an explicit ``max_tokens`` still wins; unknown keys are dropped, vLLM knobs kept."""
    from envhub.rollout.request import config_from_wire

    cfg, _, ignored = config_from_wire({"max_model_len": 3000, "repetition_penalty": 1.1, "strict_loop_detector": 1})
    assert cfg.max_length == 3000 and cfg.sampling.max_tokens == 3000 and ignored == ["strict_loop_detector"]
    assert cfg.sampling.extra == {"repetition_penalty": 1.1}
    cfg, _, _ = config_from_wire({"max_model_len": 3000, "max_output_tokens": 700, "max_tokens": 9})
    assert cfg.sampling.max_tokens == 9 and cfg.max_response_length is None


async def test_dapo_group_filter_reads_score_and_finish(prorl_server):
    """``prorl_environment_dapo.filter_easy_hard_instance`` groups by ``score`` and its progress log indexes
    ``["resolved"]`` and ``["finish"]``: with envhub's replies a mixed group is kept and a uniform one dropped."""
    srv, _ = prorl_server()
    # countdown golden solves every task: a uniform group (dropped); svc-coin-free envs are all golden here, so
    # one group is made mixed by a cap that cuts half of its samples (their score is 0)
    instances = dataset("countdown", 1)
    results = await request_from_prorl_server(srv.url, batched_data_dict_to_messages(instances, 2),
                                              nemo_rl_sampling_params(max_prompt_length=4096,
                                                                      max_response_length=2048, max_turns=4))
    kept, filtered = dapo_filter_easy_hard_instance(deepcopy(results), 2)
    assert filtered == [instances[0]["instance_id"]] and kept == {}  # all score 1.0: zero variance
    mixed = {"m": {0: results[instances[0]["instance_id"]][0], 1: {**results[instances[0]["instance_id"]][1],
                                                                     "score": 0.0}}}
    kept, filtered = dapo_filter_easy_hard_instance(mixed, 2)
    assert filtered == [] and list(kept) == ["m"]


async def _wait_running(c: httpx.AsyncClient, n: int = 1) -> None:
    for _ in range(600):
        st = (await c.get("/status")).json()
        if st["active_run"] >= n:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no job reached RUN: {st}")


async def test_dapo_cancel_then_retry_with_the_same_job_id_runs_a_new_job(prorl_server):
    """The DAPO sender's timeout path: ``/process`` with a ``job_id``; on timeout ``/cancel`` it and resend the same
    request with the same ``job_id``. The retry must run a new job (and the cancelled request is answered
    ``cancelled``), never replay the cancelled answer: both when the retry comes after the cancelled answer and
    while the cancelled job is still unwinding."""
    srv, backend = prorl_server()
    inst = {**dataset("countdown", 1)[0], "trajectory_id": 0}
    sp = nemo_rl_sampling_params(max_prompt_length=4096, max_response_length=256, max_turns=4)
    async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c, aiohttp.ClientSession() as s:
        for concurrent in (False, True):
            job_id = f"dapo-{concurrent}"
            backend.hold.clear()
            backend.unwind_s = 1.5 if concurrent else 0.0  # concurrent: the retry lands while the job unwinds
            first = asyncio.ensure_future(c.post("/process", json={"instance": inst, "sampling_params": sp,
                                                                   "job_id": job_id}))
            await _wait_running(c)
            cancel = await c.post("/cancel", json={"job_id": job_id})
            assert cancel.status_code == 200 and cancel.json()["cancelled"] is True
            if not concurrent:
                assert (await first).json()["finish_reason"] == "cancelled"
            retry = asyncio.ensure_future(send_single_message(s, srv.url, inst, sp, job_id=job_id))
            await asyncio.sleep(0.3)
            if concurrent:
                assert not first.done()  # the cancelled job is still unwinding: the retry really raced it
            backend.hold.set()
            data, should_retry = await retry
            assert not should_retry and data["finish_reason"] == "done" and data["score"] == 1.0, data
            assert data["messages"][-1]["role"] == "assistant"
            if concurrent:
                assert (await first).json()["finish_reason"] == "cancelled"
        assert (await c.get("/status")).json()["jobs"]["replayed"] == 0


async def test_status_codes_a_prorl_client_sees(prorl_server):
    """The five status codes where ProRL's server and envhub's could differ, as decided (docs/service.md)."""
    srv, _ = prorl_server()
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        unknown_env = await c.post("/process", json={"instance": {"data_source": "swebench", "instance_id": "x"}})
        assert unknown_env.status_code == 400  # as ProRL
        no_env = await c.post("/process", json={"instance": {"instance_id": "x"}})
        assert no_env.status_code == 422 and "no default env" in no_env.json()["detail"]  # ProRL: swebench
        cancel = await c.post("/cancel", json={"job_id": "never-seen"})
        assert cancel.status_code == 200 and cancel.json()["cancelled"] is False  # as ProRL
        again = await c.post("/start")
        assert again.status_code == 200 and again.json()["started"] is False  # ProRL: 400
        assert (await c.post("/stop")).status_code == 200
        stopped = await c.get("/status")
        assert stopped.status_code == 200 and stopped.json()["status"] == "stopped"  # ProRL: 503
        refused = await c.post("/process", json={"instance": {"data_source": "countdown",
                                                              "instance_id": "countdown-2-0000"}})
        assert refused.status_code == 503  # as ProRL: a stopped server runs nothing


@pytest.mark.slow
def test_real_envhub_serve_subprocess_feeds_nemo_rl(tiny_tokenizer):
    """The same NeMo-RL path against ``envhub serve --backend golden`` started as a process (the CLI's server)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "service"))
    from svc_helpers import spawn_server

    proc, url, _ = spawn_server("--backend", "golden", "--run-workers", "4")
    try:
        instances = dataset("guess-number", 2)
        sp = nemo_rl_sampling_params(max_prompt_length=4096, max_response_length=2048, max_turns=12)
        results = asyncio.run(request_from_prorl_server(url, batched_data_dict_to_messages(instances, 2), sp))
        replies = deepcopy(replies_in_batch_order(results, instances))
        batch = results_to_batched_data_dict(results, {"instance": instances}, tiny_tokenizer.pad_token_id)
        assert batch["total_reward"].tolist() == [r["reward"] for r in replies] and batch["total_reward"].sum() > 0
        assert not batch["truncated"].any()
        for row, r in enumerate(replies):
            padded(batch["response_ids"][row], r["response_ids"], tiny_tokenizer.pad_token_id)
        assert verl_convert(replies, 0)["loss_mask"] == [r["response_mask"] for r in replies]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


async def test_a_saved_raw_reply_loads_as_the_faithful_trajectory(prorl_server, tiny_tokenizer):
    """A raw reply written to disk and read back with ``Trajectory.from_dict`` (what ``envhub`` fidelity tools
    load) is the plain, untrimmed trajectory, which passes the token-fidelity check."""
    import json

    from envhub.rollout.trajectory import Trajectory

    srv, _ = prorl_server()
    async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c:
        raw = (await c.post("/process", json={"instance": {"env_id": "math-python", "task_id": "math-2-0000"}})).json()
    traj = Trajectory.from_dict(json.loads(json.dumps(raw)))
    assert raw["trailing_messages"] and traj.messages[-len(raw["trailing_messages"]):] == raw["trailing_messages"]
    assert check_trajectory(traj, tiny_tokenizer, tools=json.loads(traj.details["tools"])) == []
