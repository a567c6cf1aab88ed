"""ProRL Agent's trainer-side clients, as they read a ``/process`` reply: written by us, mirroring their code line
for line where it touches the wire (request building, the reply fields read, how ids/logprobs/flags are assembled).

Each function names the call site it mirrors (repository, path, commit, function). What is left out is what does
not touch the reply: Ray, load balancing across ProRL servers, logging, padding widths to the model's length.

* NeMo-RL's ``ProRLEnvironment``: yuki-97/NeMo-RL-ProRL ``nemo_rl/environments/prorl_environment.py`` at
  37e5157c950292a05285081ad5ba1bec7ce76cee (``__init__`` sampling params, ``BatchedDataDict2Messages``,
  ``_send_single_message_to_prorl_server``, ``Results2BatchedDataDict``, ``calculate_metrics``) and its DAPO
  variant ``nemo_rl/environments/prorl_environment_dapo.py`` at the same commit (``filter_easy_hard_instance``,
  the progress log that indexes ``["resolved"]`` and ``["finish"]``).
* verl's ProRL/OpenHands manager: the converter that trims to the last assistant message and asserts it
  ("The last message should be an assistant message"), builds ``loss_mask`` from assistant messages and
  ``rollout_log_probs`` from ``logprobs`` (zeros where ``None``), and reads ``success``/``error``/``resolved``/
  ``finish``. Read from the public code index (stored file id 66446390775, a verl fork carrying ProRL's
  ``generate_sequences``/``DataProto2Messages``); its repository name was not resolvable from the index.
"""
from __future__ import annotations

import asyncio
from collections import defaultdict
from copy import deepcopy
from typing import Any

import aiohttp
import torch


# ---- NeMo-RL ProRLEnvironment -----------------------------------------------------------------------------------
def nemo_rl_sampling_params(*, max_prompt_length: int, max_response_length: int, max_turns: int,
                            temperature: float = 1.0, top_p: float = 1.0, tokenizer_name: str = "tiny") -> dict:
    """``ProRLEnvironment.__init__``'s ``self.sampling_params`` (token-level generation, as it asserts)."""
    return {
        "model": "hosted_vllm/org/model",
        "api_key": "dummy_key",
        "modify_params": False,
        "log_completions": False,
        "native_tool_calling": True,
        "temperature": temperature,
        "top_p": top_p,
        "max_iterations": max_turns,
        "max_input_tokens": max_prompt_length,
        "max_output_tokens": max_response_length,
        "token_level_generation": True,
        "custom_tokenizer": tokenizer_name,
        "max_model_len": max_prompt_length + max_response_length,  # asserted equal in __init__
        "ensure_thinking_end_properly": False,  # = not token_level_generation
        "strict_loop_detector": True,
        "is_reasoning_task": False,
    }


def batched_data_dict_to_messages(instances: list[dict], num_trajectories: int) -> list[dict]:
    """``BatchedDataDict2Messages``: each dataset instance copied ``num_trajectories`` times with a
    ``trajectory_id``."""
    out = []
    for inst in instances:
        for j in range(num_trajectories):
            m = inst.copy()
            m["trajectory_id"] = j
            out.append(m)
    return out


async def send_single_message(session: aiohttp.ClientSession, url: str, message: dict,
                              sampling_params: dict, job_id: str | None = None) -> tuple[Any, bool]:
    """``_send_single_message_to_prorl_server``: ``(reply, should_retry)``. A reply without messages is retried.
    (``job_id`` is sent by the DAPO sender only; NeMo-RL's plain client sends none.)"""
    request_data = {"instance": message, "sampling_params": sampling_params}
    if job_id is not None:
        request_data["job_id"] = job_id
    async with session.post(url=f"{url}/process", headers={"Content-Type": "application/json"},
                            json=request_data) as resp:
        if resp.status == 200:
            data = await resp.json()
            out_message = data.get("messages", [])
            if out_message and len(out_message) > 0:
                return data, False
            return None, True
        await resp.text()
        return None, True


async def request_from_prorl_server(url: str, messages: list[dict], sampling_params: dict) -> dict:
    """``request_from_prorl_server`` without the dispatcher: every message sent (3 attempts), results keyed
    ``{instance_id: {trajectory_id: result}}``, failures replaced by the placeholder dict it stores."""
    results: dict = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        async def one(message: dict) -> None:
            result = None
            for _ in range(3):
                result, retry = await send_single_message(session, url, message, sampling_params)
                if not retry:
                    break
            if result is None:
                result = {"error": "Empty response", "messages": [], "score": 0.0, "success": False,
                          "resolved": False, "finish": False}
            results.setdefault(message["instance_id"], {})[message["trajectory_id"]] = result

        await asyncio.gather(*(one(m) for m in messages))
    return results


def _pad(t: torch.Tensor, n: int, side: str, value: int) -> torch.Tensor:
    pad = torch.full((n - len(t),), value, dtype=t.dtype)
    return torch.cat([pad, t]) if side == "left" else torch.cat([t, pad])


def results_to_batched_data_dict(results: dict, input_batch: dict, pad_token_id: int) -> dict:
    """``Results2BatchedDataDict`` (a plain dict stands in for ``BatchedDataDict``, a dict subclass)."""

    def handle_empty_messages(results: dict, instance_id: str) -> None:
        valid = None
        for result in results[instance_id].values():
            if result.get("messages", []):
                valid = result
                break
        if valid:
            for idx, result in results[instance_id].items():
                if len(result.get("messages", [])) == 0:
                    results[instance_id][idx].update(messages=valid["messages"].copy(), resolved=valid.get(
                        "resolved", False), score=valid.get("score", 0.0), error=valid.get("error"),
                        finish=valid.get("finish", False), is_padded=True)

    def split_prompt_and_response(messages: list[dict]) -> tuple[list[dict], list[dict]]:
        starting_index = 0
        for i, msg in enumerate(messages):
            if msg["role"] == "assistant":
                starting_index = i
                break
        if starting_index == 0:
            starting_index = len(messages)
        return messages[:starting_index], messages[starting_index:]

    def get_prompt_response_ids(messages: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
        prompt, response = split_prompt_and_response(messages)
        prompt_ids = torch.cat([m["token_ids"] for m in prompt]) if prompt else torch.tensor([])
        response_ids = torch.cat([m["token_ids"] for m in response]) if response else torch.tensor([])
        return prompt_ids, response_ids

    result_dict: dict = defaultdict(list)
    for instance in input_batch["instance"]:
        instance_id = instance["instance_id"]
        handle_empty_messages(results, instance_id)
        for trajectory in results[instance_id].values():
            messages = trajectory.get("messages", [])
            for message in messages:
                message["token_ids"] = torch.tensor(message["token_ids"], dtype=torch.int64)
                if "logprobs" in message:
                    if message["logprobs"] is not None:
                        message["generation_logprobs"] = torch.tensor(message["logprobs"], dtype=torch.float32)
                    message.pop("logprobs")
            prompt_ids, response_ids = get_prompt_response_ids(messages)
            result_dict["message_log"].append(messages)
            result_dict["prompt_ids"].append(prompt_ids)
            result_dict["response_ids"].append(response_ids)
            result_dict["length"].append(len(prompt_ids))
            result_dict["extra_env_info"].append({
                "success": trajectory.get("success", False), "error": trajectory.get("error", None),
                "resolved": trajectory.get("resolved", False), "finish": trajectory.get("finish", False),
                "is_padded": trajectory.get("is_padded", False)})
            result_dict["task_name"].append("prorl")
            result_dict["total_reward"].append(trajectory.get("score", 0.0))
            result_dict["truncated"].append(not trajectory.get("end_properly", False))
            result_dict["loss_multiplier"].append(1.0)
            result_dict["data_source"].append(instance["data_source"])
            result_dict["extra_info"].append(instance["extra_info"])

    def concat_ids(ids_list: list[torch.Tensor], pad_side: str) -> torch.Tensor:
        max_len = max(len(ids) for ids in ids_list)
        return torch.stack([_pad(ids, max_len, pad_side, pad_token_id) for ids in ids_list])

    result_dict["prompt_ids_left_padded"] = concat_ids(result_dict["prompt_ids"], "left")
    result_dict["prompt_ids"] = concat_ids(result_dict["prompt_ids"], "right")
    result_dict["response_ids"] = concat_ids(result_dict["response_ids"], "right")
    result_dict["length"] = torch.tensor(result_dict["length"], dtype=torch.int32)
    result_dict["total_reward"] = torch.tensor(result_dict["total_reward"], dtype=torch.float32)
    result_dict["truncated"] = torch.tensor(result_dict["truncated"], dtype=torch.bool)
    result_dict["loss_multiplier"] = torch.tensor(result_dict["loss_multiplier"], dtype=torch.bool)
    return dict(result_dict)


def calculate_metrics(batch: dict, max_turns: int) -> dict:
    """``calculate_metrics``: turns, token counts and rates read from ``message_log``."""
    turns, gen, env = [], [], []
    for messages in batch["message_log"]:
        turns.append(sum(m["role"] == "assistant" for m in messages))
        gen.append(sum(len(m["token_ids"]) for m in messages if m["role"] == "assistant"))
        env.append(sum(len(m["token_ids"]) for i, m in enumerate(messages) if m["role"] != "assistant" and i >= 2))
    n = len(batch["message_log"])
    return {"truncation_rate": batch["truncated"].float().mean().item(),
            "max_turns_reached_rate": sum(t == max_turns for t in turns) / n,
            "mean_gen_tokens_per_sample": sum(gen) / n, "mean_total_reward": batch["total_reward"].mean().item()}


def dapo_filter_easy_hard_instance(all_responses: dict, num_trajectories: int) -> tuple[dict, list]:
    """``prorl_environment_dapo.filter_easy_hard_instance``: complete groups whose ``score`` is all equal are
    dropped; plus its progress log, which indexes ``["resolved"]`` and ``["finish"]`` (a ``KeyError`` without)."""
    for group in all_responses.values():
        for t in group.values():
            t["resolved"], t["finish"]  # noqa: B018 - the DAPO progress log reads both keys directly
    filtered = []
    for instance_id in list(all_responses):
        group = all_responses[instance_id]
        if len(group) == num_trajectories and len({t.get("score", 0) for t in group.values()}) == 1:
            all_responses.pop(instance_id)
            filtered.append(instance_id)
    return all_responses, filtered


# ---- verl's ProRL converter ---------------------------------------------------------------------------------------
def verl_convert(results: list[dict], pad_token_id: int) -> dict:
    """The verl manager's results → ``DataProto`` tensors (before its left/right padding to model length):
    per sample ``prompts``, ``responses``, ``loss_mask`` (assistant tokens), ``rollout_log_probs``; and the
    non-tensor ``success``/``error``/``resolved``/``finish`` lists."""
    out: dict = defaultdict(list)
    for result in deepcopy(results):
        messages = result.get("messages", [])
        out["error_mask"].append(result.get("error", None) is not None and result.get("error", None) != "")
        starting_index = 0
        for i, msg in enumerate(messages):
            if msg["role"] == "assistant":
                starting_index = i
                break
        if starting_index == 0:
            starting_index = len(messages)
        while messages and messages[-1]["role"] != "assistant":
            messages = messages[:-1]
        assert messages[-1]["role"] == "assistant", (
            f"The last message should be an assistant message. len(messages) == {len(messages)} "
            f"and roles are {[m['role'] for m in messages]}")
        all_ids = [msg["token_ids"] for msg in messages]
        all_log_probs = [msg["logprobs"] if "logprobs" in msg and msg["logprobs"] is not None
                         else [0.0] * len(msg["token_ids"]) for msg in messages]
        assistant_masks = [[0] * len(ids) for ids in all_ids]
        for i, msg in enumerate(messages):
            if msg["role"] == "assistant":
                assistant_masks[i] = [1] * len(all_ids[i])
        prompt_ids = sum(all_ids[:starting_index], [])
        response_ids = sum(all_ids[starting_index:], [])
        assistant_masks = sum(assistant_masks, [])[len(prompt_ids):]
        response_log_probs = sum(all_log_probs[starting_index:], [])
        out["prompts"].append(prompt_ids)
        out["responses"].append(response_ids)
        out["loss_mask"].append(assistant_masks)
        out["rollout_log_probs"].append(response_log_probs)
        out["success"].append(result.get("success", False))
        out["error"].append(result.get("error", None))
        out["resolved"].append(result.get("resolved", False))
        out["finish"].append(result.get("finish", False))
    return dict(out)
