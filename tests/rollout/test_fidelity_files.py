"""check_file: the entry point behind `envhub check-trajectory FILE` (JSON lines, JSON, parquet, datasets dirs)."""
from __future__ import annotations

import json

import pytest
from rollout_sim import TOOLS, Turn, assemble

from envhub.env import Action, ToolCall
from envhub.rollout.fidelity import check_file, iter_trajectories


@pytest.fixture(scope="module")
def trajs(tiny_tokenizers):
    from envhub.codec.chat import ChatCodec

    codec = ChatCodec(tiny_tokenizers["chatml"], tools=TOOLS)
    out = []
    for k in range(3):
        ids = codec.action_ids(Action("", [ToolCall("bash", {"cmd": f"ls {k}"})]))
        turns = [Turn(ids, [-0.25] * len(ids), lambda a: [{"role": "tool", "tool_call_id": a.tool_calls[0].id,
                                                            "name": "bash", "content": "ok"}]),
                 Turn(codec.encode("done é") + [codec.end_of_turn_id], [-1.0] * 4, None)]
        turns[1].logprobs = [-1.0] * len(turns[1].ids)
        traj, _, _ = assemble(codec, [{"role": "user", "content": f"task {k}"}], turns)
        traj.details["tools"] = json.dumps(TOOLS)  # a string: to_row sorts dict keys, which would reorder them
        out.append(traj)
    bad = out[2]
    bad.response_mask = list(bad.response_mask)
    bad.response_mask[0] = 0  # a sampled token marked as env
    return out


def test_jsonl_json_parquet_and_dataset_dir(trajs, tiny_models, tmp_path):
    import datasets

    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text("".join(t.to_json() + "\n" for t in trajs))
    js = tmp_path / "t.json"
    js.write_text(json.dumps([t.to_row() for t in trajs]))
    ds = datasets.Dataset.from_list([t.to_row() for t in trajs])
    ds.save_to_disk(str(tmp_path / "ds"))
    ds.to_parquet(str(tmp_path / "t.parquet"))
    (tmp_path / "pq").mkdir()
    ds.to_parquet(str(tmp_path / "pq" / "part-0.parquet"))
    for path in (jsonl, js, tmp_path / "ds", tmp_path / "t.parquet", tmp_path / "pq"):
        assert [t.response_ids for t in iter_trajectories(path)] == [t.response_ids for t in trajs]
        bad = check_file(path, tiny_models["chatml"])  # a model directory; tools come from details["tools"]
        assert list(bad) == [2] and any("logprob" in p or "sampled" in p for p in bad[2]), (path, bad)
    assert list(check_file(jsonl, tiny_models["chatml"], limit=2)) == []


def test_tools_as_a_list_survive_json_lines_but_not_sorted_rows(trajs, tiny_models, tmp_path):
    from envhub.rollout.trajectory import Trajectory

    t = Trajectory.from_dict({**trajs[0].to_dict(), "details": {"tools": TOOLS}})
    (tmp_path / "a.jsonl").write_text(t.to_json() + "\n")
    assert check_file(tmp_path / "a.jsonl", tiny_models["chatml"]) == {}
    (tmp_path / "b.json").write_text(json.dumps([t.to_row()]))  # sorted keys: the tool block renders differently
    assert "prompt_ids differ" in check_file(tmp_path / "b.json", tiny_models["chatml"])[0][0]


def test_missing_tools_are_noticed(trajs, tiny_models, tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [t.to_dict() for t in trajs[:1]]
    rows[0]["details"] = {}
    path.write_text(json.dumps(rows[0]) + "\n")
    bad = check_file(path, tiny_models["chatml"])  # rendered without the tool block: the prompt differs
    assert any("prompt_ids differ" in p for p in bad[0])
    assert check_file(path, tiny_models["chatml"], tools=TOOLS) == {}
