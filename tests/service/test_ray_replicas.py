"""Past one node: rollout-service replicas on a real multi-node Ray cluster on this machine (``ray.cluster_utils.
Cluster``, one raylet per node), a node killed mid-run, and a node added while running (``make test-ray``)."""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

# Ray resolves 127.0.0.1 to this machine's interface address unless told it is not clustering across hosts: keep
# every node, and all the cluster's traffic, on loopback (set before ray is imported; its processes inherit it)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"  # no usage reports
ray = pytest.importorskip("ray", reason="needs the ray extra (make test-ray)")

HERE = Path(__file__).parent
pytestmark = [pytest.mark.ray, pytest.mark.slow]
LOOPBACK = "127.0.0.1"


def slow_job(i: int, run_s: float) -> dict:
    return {"env_id": "svc-slow", "task": {"task_id": f"ray-{i}", "n": 3, "run_s": run_s}, "trajectory_id": i}


@pytest.fixture
def cluster():
    from ray.cluster_utils import Cluster

    fast_death = {"health_check_initial_delay_ms": 0, "health_check_period_ms": 500,
                  "health_check_failure_threshold": 3}
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "_system_config": fast_death,
                                                       "node_ip_address": LOOPBACK, "include_dashboard": False})
    workers = [c.add_node(num_cpus=1, node_ip_address=LOOPBACK) for _ in range(2)]
    path = os.pathsep.join([str(HERE), str(HERE.parent), os.environ.get("PYTHONPATH", "")])
    ray.init(address=c.address, namespace="envhub",
             runtime_env={"env_vars": {"PYTHONPATH": path, "HF_HUB_OFFLINE": "1",
                                       "ENVHUB_SANDBOX_DIR": os.environ.get("ENVHUB_SANDBOX_DIR", "")}})
    c.wait_for_nodes()
    try:
        yield c, workers
    finally:
        ray.shutdown()
        c.shutdown()


async def test_a_node_dies_mid_run_and_no_job_is_lost_or_answered_twice(cluster):
    from envhub.service.ray_replicas import RayRolloutClient, replica_names, start_replicas, stop_replicas

    c, workers = cluster
    names = start_replicas(tokenizer="tiny", backends=["golden"], plugins=["svc_plugins"], run_workers=64)
    assert len(names) == 3  # one per node: head + two workers
    client = RayRolloutClient(refresh_s=0.5)
    nodes = {st["replica"]: st["node_id"] for st in await client.status()}
    assert len(set(nodes.values())) == 3  # each on its own node

    n = 48
    jobs = [asyncio.ensure_future(client.process(slow_job(i, 3.0),
                                                 {"temperature": 1.0}, job_id=f"ray-{i}")) for i in range(n)]
    await asyncio.sleep(1.5)  # every replica has jobs in flight: take a worker node away
    c.remove_node(workers[0])
    results = await asyncio.wait_for(asyncio.gather(*jobs), 300)

    assert [r["job_id"] for r in results] == [f"ray-{i}" for i in range(n)]  # each answered once, by its own job
    assert [r["trajectory_id"] for r in results] == list(range(n))
    assert all(r["finish_reason"] == "done" and r["passed"] for r in results), [r["error"] for r in results]
    assert client.counts["dead_replicas"] == 1 and client.counts["retried"] >= 1, client.counts
    alive = await client.status()
    assert len(alive) == 2
    # the survivors ran each job at most once: their finished counts plus what the dead replica finished before
    # it died add up to no more than the jobs plus those retried away from it
    assert sum(st["jobs"]["done"] for st in alive) <= n

    # a node added while running gets a replica, and the client sends it work
    c.add_node(num_cpus=1, node_ip_address=LOOPBACK)
    c.wait_for_nodes()
    start_replicas(tokenizer="tiny", backends=["golden"], plugins=["svc_plugins"])
    deadline = time.monotonic() + 60
    while len(client.refresh()) < 3 and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
    more = await asyncio.gather(*(client.process(slow_job(100 + i, 0.5), job_id=f"ray-more-{i}")
                                  for i in range(9)))
    assert all(r["finish_reason"] == "done" for r in more)
    per_replica = {st["replica"]: st["jobs"]["done"] for st in await client.status()}
    assert len(per_replica) == 3 and all(v > 0 for v in per_replica.values()), per_replica
    assert stop_replicas() >= 3 and not replica_names()
