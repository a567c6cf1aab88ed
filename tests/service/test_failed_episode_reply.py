"""The service's reply of an episode that fails mid-RUN carries no trainable token (#13), over real HTTP: envhub's
own clients see an all-zero ``loss_mask`` (the exact record is kept), ProRL's clients no assistant message.

Before, a RUN timeout after several model turns answered with those turns as ProRL assistant messages, which ProRL's
clients train on. (Test adapted from helper j13a's.)"""
from __future__ import annotations

from envhub.rollout.trajectory import Trajectory
from envhub.training.client import RolloutClient


async def test_a_run_timeout_reply_has_no_trainable_token(serve):
    srv = serve(init_workers=1, run_workers=1, eval_workers=1, timeout_s=1.0)
    async with RolloutClient(srv.url) as c:
        d = await c.process({"env_id": "svc-slow", "task": {"task_id": "r", "n": 3, "run_s": 0.25, "turns": 20}},
                            raw=True)
        traj = await c.process({"env_id": "svc-slow", "task": {"task_id": "r2", "n": 3, "run_s": 0.25, "turns": 20}})
    assert d["finish_reason"] == "timeout" and "RUN" in d["error"] and d["num_turns"] > 0
    assert d["messages"] == [] and d["trailing_messages"]  # no assistant message for ProRL's clients to train
    rebuilt = Trajectory.from_dict(d)
    assert rebuilt.response_ids and rebuilt.loss_mask == [0] * len(rebuilt.response_ids)  # ids kept, none trained
    assert traj.finish_reason == "timeout" and traj.trainable_ranges == [] and traj.messages  # envhub's client
