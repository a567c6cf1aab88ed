"""The HTTP API (FastAPI): ProRL Agent's endpoints over :class:`~envhub.service.service.RolloutService`.

==========================  ==============================================================================
``POST /process``           ``{instance, sampling_params, job_id?, timeout?}`` → the trajectory, when done
``POST /cancel``            ``{job_id}`` → the job's waiting request is answered with a cancelled trajectory
                            (an id the server does not hold: 200 ``{"cancelled": false}``, as ProRL)
``POST /add_llm_server``    ``{address}`` → add a vLLM/SGLang server (or ``"golden"``) to the backend pool
``POST /clear_llm_server``  remove every backend; running rollouts wait for the next one (checkpoint swap)
``POST /start``             start the worker pools (the server starts them itself unless told not to)
``POST /stop``              cancel everything in flight, stop the pools and every sandbox
``POST /pause``             ``{mode: hold|abort, timeout_s}`` → stop sampling for a weight update; answers once no
                            token is being sampled (rollouts never see it: :mod:`envhub.backends.lifecycle`)
``POST /resume``            ``{version?}`` → sampling continues, later tokens tagged ``version`` (409: no pause, or
                            a version going backwards)
``GET /status``             queue depth and in-flight per stage, job counts, backends with their assignments
``GET /staleness``          the staleness gate (:mod:`envhub.rollout.staleness`): version, capacity, counts
``POST /staleness``         its settings ``{max_staleness, batch_size, max_concurrent, mode, ...}``
``POST /staleness/report``  the trainer: ``{version?, consumed?, discarded?}``; every ``/process`` job is admitted
                            by the gate (it waits while there is no room; 429 after ``admission_timeout_s``)
``POST /trainer/step``      ``{phase: begin|end, samples?}``: the trainer's step boundaries (idle ratios, consumption)
``GET /metrics``            Prometheus text (:mod:`envhub.rollout.throughput`; docs/metrics.md defines each metric)
``GET /healthz``            liveness
``GET /openapi.json``       the schema (``/docs`` renders it)
==========================  ==============================================================================

Errors are JSON ``{"detail": "..."}`` with a status saying whose fault it is: 400 (unknown env, as ProRL), 401 (token),
404 (unknown task or split), 409 (job id reused for another request), 422 (malformed request: the detail lists each problem), 503 (stopped,
or no LLM server yet). Replies of ``/process`` are encoded once and sent as bytes: a trajectory holds thousands of
token ids, and FastAPI's generic encoder would walk each of them.

Bound to a non-loopback address, every endpoint (the schema included) requires ``Authorization: Bearer <token>``
(and so does every endpoint on loopback when a token is given). Limits on what a client may send -- body size (413),
time to send it (408), JSON content type (415), cross-site origins (403), open connections, time to send the request
head -- are in :mod:`envhub.http.limits`.
"""
from __future__ import annotations

import hmac
from contextlib import asynccontextmanager
from typing import Any

from fastapi import Body, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

import envhub
from envhub.http.limits import DEFAULT_BODY_TIMEOUT_S, DEFAULT_MAX_BODY_BYTES, RequestGuard
from envhub.service.schemas import (CancelRequest, LLMServerRequest, PauseRequest, ProcessRequest, ProcessResponse,
                                    ResumeRequest, ServiceError, StartRequest)


class BearerAuth:
    """ASGI middleware: every HTTP request must carry ``Authorization: Bearer <token>`` (compared in constant time)."""

    def __init__(self, app: Any, token: str):
        self.app = app
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            got = b""
            for name, value in scope.get("headers", []):
                if name == b"authorization":
                    got = value
                    break
            if not hmac.compare_digest(got, self.expected):
                reply = JSONResponse({"detail": "missing or wrong bearer token: send 'Authorization: Bearer <token>' "
                                                "(the token `envhub serve` printed or was given)"},
                                     status_code=401, headers={"WWW-Authenticate": "Bearer"})
                await reply(scope, receive, send)
                return
        await self.app(scope, receive, send)


def _readable(errors: list[dict[str, Any]]) -> str:
    parts = []
    for e in errors:
        where = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts)


def _gate_route(service: Any, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
    from envhub.rollout.staleness import GateError, http_route

    try:
        out = http_route(service.gate, "POST", path, body)
    except GateError as e:
        raise ServiceError(400, str(e)) from None
    assert out is not None
    return out


def create_app(service: Any, *, token: str | None = None, autostart: bool = True,
               max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> FastAPI:
    """The FastAPI app serving ``service``. ``autostart``: start the pools when the server starts (``/start``
    still works after a ``/stop``). The service is shut down (jobs cancelled, sandboxes stopped, backends closed)
    when the server stops."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if autostart:
            await service.start()
        try:
            yield
        finally:
            await service.shutdown()

    app = FastAPI(title="envhub rollout service", version=envhub.__version__, lifespan=lifespan,
                  description="Rollout-as-a-service (ProRL Agent API): INIT/RUN/EVAL pools over envhub envs.")
    app.state.service = service
    if token:
        app.add_middleware(BearerAuth, token=token)
    # outermost: size, time, content type and origin are checked before anything else reads the request
    app.add_middleware(RequestGuard, max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s)

    @app.exception_handler(ServiceError)
    async def service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return JSONResponse({"detail": exc.message}, status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        clean = [{"loc": list(e.get("loc", ())), "msg": e.get("msg"), "type": e.get("type")} for e in errors]
        return JSONResponse({"detail": f"invalid request to {request.url.path}: {_readable(errors)}",
                             "errors": clean}, status_code=422)

    @app.post("/process", responses={200: {"model": ProcessResponse}}, response_class=Response)
    async def process(req: ProcessRequest) -> Response:
        """Run one rollout (INIT, RUN, EVAL) and answer with its trajectory, reward and stage timings."""
        body = await service.process(req)
        return Response(content=body, media_type="application/json")

    @app.post("/cancel")
    async def cancel(req: CancelRequest) -> dict[str, Any]:
        """Cancel a job: its stage is cancelled, its sandbox freed, its request answered ``cancelled``."""
        return service.cancel(req.job_id)

    @app.post("/add_llm_server")
    async def add_llm_server(req: LLMServerRequest) -> dict[str, Any]:
        """Add an LLM server to the backend pool; running rollouts can use it at their next turn."""
        if req.api not in ("completions", "sglang"):
            raise ServiceError(422, f"api must be 'completions' (vLLM) or 'sglang', got {req.api!r}")
        name, added = service.add_backend(req.address.strip(), api=req.api)
        status = f"Added LLM server address: {name}" if added else f"LLM server {name} was already added"
        return {"status": status, "name": name, "added": added, "backends": list(service.pool.backends)}

    @app.post("/clear_llm_server")
    async def clear_llm_server() -> dict[str, Any]:
        """Remove every LLM server. Running rollouts wait for the next /add_llm_server (their in-flight turn ends
        where it is)."""
        removed = service.clear_backends()
        return {"status": "Cleared all LLM server addresses", "removed": removed}

    @app.post("/pause")
    async def pause(req: PauseRequest | None = Body(default=None)) -> dict[str, Any]:
        """Stop sampling for a weight update; answers once no token is being sampled. Rollouts never see it."""
        req = req or PauseRequest()
        return await service.pause(req.mode, req.timeout_s)

    @app.post("/resume")
    async def resume(req: ResumeRequest | None = Body(default=None)) -> dict[str, Any]:
        """Sampling continues; later tokens are tagged ``version``."""
        return service.resume((req or ResumeRequest()).version)

    @app.post("/start")
    async def start(req: StartRequest | None = Body(default=None)) -> dict[str, Any]:
        """Start the worker pools (optionally resized). Starting a running server changes nothing."""
        req = req or StartRequest()
        started = await service.start(init_workers=req.init_workers, run_workers=req.run_workers,
                                      eval_workers=req.eval_workers)
        return {"status": "Server started successfully" if started else "Server is already running",
                "started": started, "workers": dict(service.pipeline.sizes)}

    @app.post("/stop")
    async def stop() -> dict[str, Any]:
        """Cancel every job in flight, stop the worker pools and every sandbox."""
        cancelled = await service.stop()
        return {"status": "Server stopped successfully", "cancelled": cancelled}

    @app.get("/status")
    async def status() -> dict[str, Any]:
        """Queues and in-flight jobs per stage, job counts, backends with their assigned rollouts."""
        return service.status()

    @app.get("/staleness")
    async def staleness() -> dict[str, Any]:
        """The staleness gate: the trainer's version, capacity, running / accepted / rejected, its settings."""
        return service.gate.status()

    @app.post("/staleness")
    async def configure_staleness(body: dict[str, Any] | None = Body(default=None)) -> dict[str, Any]:
        """Set the gate: ``max_staleness`` (eta), ``batch_size`` (B), ``max_concurrent``, ``mode``
        (pace | drop | withhold), ``token_max_staleness``, ``replicas``, ``replica``, ``admission_timeout_s``."""
        return _gate_route(service, "/staleness", body)

    @app.post("/staleness/report")
    async def report_staleness(body: dict[str, Any] | None = Body(default=None)) -> dict[str, Any]:
        """The trainer's report: ``{version?, consumed?, discarded?}`` (after each weight update; samples trained;
        delivered samples it filtered out)."""
        out = _gate_route(service, "/staleness/report", body)
        service.gate_reported(body)
        return out

    @app.post("/trainer/step")
    async def trainer_step(body: dict[str, Any] | None = Body(default=None)) -> dict[str, Any]:
        """The trainer's step boundary: ``{"phase": "begin"}`` when it has its batch and starts computing,
        ``{"phase": "end", "samples": n}`` when the step (weight broadcast included) is done; ``at``: when, in Unix
        seconds (a report that reaches a busy server late is then not counted as trainer idle)."""
        body = body or {}
        unknown = sorted(set(body) - {"phase", "samples", "at"})
        if unknown:
            raise ServiceError(422, f"unknown field(s) {unknown}: send {{phase: begin|end, samples?: int, at?: float}}")
        return service.trainer_step(body.get("phase"), body.get("samples"), body.get("at"))

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text exposition of the throughput figures (docs/metrics.md)."""
        if service.metrics is None:
            raise ServiceError(404, "metrics are off on this server")
        if getattr(app.state, "registry", None) is None:
            from envhub.rollout.throughput_export import registry_for

            extra = service.controller.families if service.controller is not None else None  # envhub_controller_*
            app.state.registry = registry_for(service.metrics, extra)  # this server's own, never the global one
        from envhub.rollout.throughput_export import render

        text, ctype = render(app.state.registry)
        return Response(content=text, media_type=ctype)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True, "status": "running" if service.running else "stopped"}

    return app
