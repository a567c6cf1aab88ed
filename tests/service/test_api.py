"""Every endpoint over real HTTP on loopback: replies, ProRL compatibility, malformed requests, auth, idempotent ids."""
from __future__ import annotations

import asyncio

import httpx
import pytest

import envhub
from envhub.rollout.fidelity import check_trajectory
from envhub.rollout.trajectory import Trajectory

COUNTDOWN = {"env_id": "countdown", "task_id": "countdown-2-0001"}


async def test_process_returns_a_faithful_graded_trajectory(serve, tiny_tokenizer):
    srv = serve()
    spec = envhub.get_spec("guess-number")
    row = dict(spec.load_tasks()[3])
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        r1, r2 = await asyncio.gather(
            c.post("/process", json={"instance": COUNTDOWN, "sampling_params": {"temperature": 0}}),
            c.post("/process", json={"instance": {"env_id": "guess-number", "task": row, "trajectory_id": 7},
                                     "sampling_params": {"max_tokens": 64}, "job_id": "mine-1"}))
    for r in (r1, r2):
        assert r.status_code == 200, r.text
        d = r.json()
        assert d["finish_reason"] == "done" and d["passed"] and d["resolved"] and d["reward"] == 1.0
        assert d["critical_error"] is None and d["filter"] is False and d["error"] is None
        assert set(d["timing"]) == {"init_time", "run_time", "eval_time", "others_time", "counted_elapsed",
                                    "timeout_triggered"}
        assert {"init_s", "run_s", "eval_s", "gen_s", "env_s", "queue_s"} <= set(d["metrics"])
        traj = Trajectory.from_dict(d)
        assert check_trajectory(traj, tiny_tokenizer) == []  # token ids survive the HTTP hop exactly
    d2 = r2.json()
    assert d2["job_id"] == "mine-1" and d2["details"]["job_id"] == "mine-1" and d2["trajectory_id"] == 7
    assert d2["task_id"] == row["task_id"] and d2["num_turns"] > 1 and d2["tools"] == []


async def test_instance_forms_and_prorl_aliases(serve):
    srv = serve()
    row = dict(envhub.get_spec("countdown").load_tasks()[2])
    forms = [
        {"env_id": "countdown", "task_id": row["task_id"]},
        {"env_id": "countdown", "task_id": row["task_id"], "split": "test"},
        {"env_id": "countdown", "task": row},
        {"data_source": "countdown", "instance_id": row["task_id"]},  # ProRL's own keys
    ]
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        replies = [await c.post("/process", json={"instance": f, "sampling_params": {}}) for f in forms]
        inline = dict(row)
        inline.pop("task_id")
        anon = await c.post("/process", json={"instance": {"env_id": "countdown", "task": inline}})
    for r in replies:
        assert r.status_code == 200 and r.json()["task_id"] == row["task_id"] and r.json()["passed"], r.text
    assert replies[3].json()["instance_id"] == row["task_id"]
    assert anon.status_code == 200 and anon.json()["task_id"].startswith("inline-") and anon.json()["passed"]


async def test_openapi_schema_lists_every_endpoint(serve):
    srv = serve()
    async with httpx.AsyncClient(base_url=srv.url) as c:
        schema = (await c.get("/openapi.json")).json()
        docs = await c.get("/docs")
    assert {"/process", "/cancel", "/add_llm_server", "/clear_llm_server", "/start", "/stop", "/status",
            "/healthz"} <= set(schema["paths"])
    body = schema["paths"]["/process"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert body.endswith("/ProcessRequest")
    fields = set(schema["components"]["schemas"]["ProcessRequest"]["properties"])
    assert {"instance", "sampling_params", "job_id"} <= fields
    assert "ProcessResponse" in schema["components"]["schemas"] and docs.status_code == 200


MALFORMED = [
    # (request body, status, words the message must contain)
    (b"{not json", 422, "json"),
    ({}, 422, "instance"),
    ({"instance": 3}, 422, "instance"),
    ({"instance": {"task_id": "x"}}, 422, "env_id"),
    ({"instance": {"env_id": "countdwn", "task_id": "x"}}, 400, "countdown"),  # ProRL's 400; suggests the name
    ({"instance": {"env_id": "countdown", "task_id": "nope"}}, 404, "no task 'nope'"),
    ({"instance": {"env_id": "countdown", "task_id": "countdown-2-0001", "split": "nosuch"}}, 404, "split"),
    ({"instance": {"env_id": "countdown"}}, 422, "task_id"),
    ({"instance": {"env_id": "countdown", "task": [1, 2]}}, 422, "task row"),
    ({"instance": COUNTDOWN, "sampling_params": {"max_tokens": 0}}, 422, "max_tokens"),
    ({"instance": COUNTDOWN, "sampling_params": {"temperature": "hot"}}, 422, "temperature"),
    ({"instance": COUNTDOWN, "sampling_params": {"top_p": 2}}, 422, "top_p"),
    ({"instance": COUNTDOWN, "sampling_params": {"stop": [1]}}, 422, "stop"),
    ({"instance": COUNTDOWN, "sampling_params": {"max_turns": -1}}, 422, "max_turns"),
    ({"instance": COUNTDOWN, "sampling_params": {"parser": "nosuchparser"}}, 422, "parser"),
    ({"instance": COUNTDOWN, "job_id": ""}, 422, "job_id"),
    ({"instance": COUNTDOWN, "timeout": -5}, 422, "timeout"),
    ({"instance": COUNTDOWN, "surprise": 1}, 422, "surprise"),
]


async def test_malformed_requests_get_clear_4xx_and_the_server_keeps_serving(serve):
    srv = serve()
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        for body, status, words in MALFORMED:
            r = await (c.post("/process", content=body, headers={"content-type": "application/json"})
                       if isinstance(body, bytes) else c.post("/process", json=body))
            assert r.status_code == status, (body, r.text)
            assert words.lower() in r.json()["detail"].lower(), (body, r.json())
        others = [
            (await c.post("/cancel", json={}), 422, "job_id"),
            (await c.post("/add_llm_server", json={"address": "ftp://x"}), 422, "http"),
            (await c.post("/add_llm_server", json={"address": "http://127.0.0.1:9", "api": "grpc"}), 422, "api"),
            (await c.post("/start", json={"run_workers": 0}), 422, "run_workers"),
            (await c.get("/process"), 405, "not allowed"),
        ]
        for r, status, words in others:
            assert r.status_code == status and words.lower() in r.json()["detail"].lower(), r.text
        unknown = await c.post("/cancel", json={"job_id": "never-seen"})  # ProRL answers 200: nothing to cancel
        assert unknown.status_code == 200 and unknown.json()["cancelled"] is False, unknown.text
        ok = await c.post("/process", json={"instance": COUNTDOWN})
        st = (await c.get("/status")).json()
    assert ok.status_code == 200 and ok.json()["passed"]
    assert st["jobs"]["submitted"] == 1 and st["jobs"]["rejected"] >= 7  # refused requests never became jobs


async def test_status_start_stop_and_backends(serve):
    srv = serve(init_workers=2, run_workers=3, eval_workers=1)
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        assert (await c.get("/healthz")).json() == {"ok": True, "status": "running"}
        await asyncio.gather(*(c.post("/process", json={"instance": COUNTDOWN}) for _ in range(5)))
        st = (await c.get("/status")).json()
        assert st["status"] == "running" and st["jobs"]["done"] == 5 and st["total"] == 0
        assert st["stages"]["run"] == {"queued": 0, "in_flight": 0, "workers": 3}
        assert [b["name"] for b in st["backends"]] == ["golden"] and st["backends"][0]["requests"] == 5
        assert (await c.post("/start")).json()["started"] is False  # already running: nothing changes

        assert (await c.post("/stop")).json()["status"] == "Server stopped successfully"
        r = await c.post("/process", json={"instance": COUNTDOWN})
        assert r.status_code == 503 and "/start" in r.json()["detail"]
        assert (await c.get("/healthz")).json()["status"] == "stopped"
        started = (await c.post("/start", json={"run_workers": 5})).json()
        assert started["started"] and started["workers"]["run"] == 5
        assert (await c.post("/process", json={"instance": COUNTDOWN})).json()["passed"]

        cleared = (await c.post("/clear_llm_server")).json()
        assert cleared["removed"] == ["golden"]
        r = await c.post("/process", json={"instance": COUNTDOWN})
        assert r.status_code == 503 and "add_llm_server" in r.json()["detail"]
        added = (await c.post("/add_llm_server", json={"address": "golden"})).json()
        again = (await c.post("/add_llm_server", json={"address": "golden"})).json()
        assert added["added"] and not again["added"] and added["backends"] == ["golden"]
        assert (await c.post("/process", json={"instance": COUNTDOWN})).json()["passed"]


async def test_job_ids_make_retries_safe(serve):
    srv = serve()
    svc = srv.service
    job = {"instance": {"env_id": "svc-slow", "task": {"task_id": "s", "n": 4, "run_s": 0.3}}, "job_id": "retry-me"}
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        # the same id sent three times at once: one job runs, all three get its answer
        replies = await asyncio.gather(*(c.post("/process", json=job) for _ in range(3)))
        assert {r.status_code for r in replies} == {200} and len({r.content for r in replies}) == 1
        again = await c.post("/process", json=job)  # after it finished: the stored answer, not a new run
        assert again.content == replies[0].content
        other = dict(job, sampling_params={"temperature": 0.5})
        clash = await c.post("/process", json=other)
        assert clash.status_code == 409 and "different request" in clash.json()["detail"]
    assert svc.pipeline.counts["submitted"] == 1
    assert svc.counts["joined"] == 2 and svc.counts["replayed"] == 1


async def test_a_token_is_required_on_every_endpoint_off_loopback(serve):
    from envhub.http.server import check_binding

    with pytest.raises(ValueError, match="token"):
        check_binding("0.0.0.0", None)
    srv = serve(host="0.0.0.0", token="s3cret")
    ok = {"Authorization": "Bearer s3cret"}
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as c:
        for method, path, body in [("GET", "/healthz", None), ("GET", "/status", None), ("GET", "/openapi.json", None),
                                   ("GET", "/docs", None), ("POST", "/process", {"instance": COUNTDOWN}),
                                   ("POST", "/cancel", {"job_id": "x"}), ("POST", "/stop", None),
                                   ("POST", "/start", None), ("POST", "/clear_llm_server", None),
                                   ("POST", "/add_llm_server", {"address": "golden"})]:
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
                r = await c.request(method, path, json=body, headers=headers)
                assert r.status_code == 401 and "token" in r.json()["detail"], (path, headers)
        assert (await c.get("/healthz", headers=ok)).status_code == 200
        r = await c.post("/process", json={"instance": COUNTDOWN}, headers=ok)
        assert r.status_code == 200 and r.json()["passed"]
    assert srv.service.pipeline.counts["submitted"] == 1  # the unauthenticated /process never ran
