"""``RolloutService``: what the HTTP endpoints call. Admission, idempotent job ids, backends, status.

The service sits between the HTTP layer (``envhub.service.app``) and the :class:`~envhub.service.pipeline.Pipeline`:

* **Admission.** A ``/process`` request is checked before it costs anything: the env exists, the task exists (inline
  row or id in a split), sampling parameters are valid. A bad request gets a 4xx naming the problem; it never
  becomes a failed job.
* **Idempotent job ids.** Clients pick job ids so that a retry after a dropped connection is safe: a request whose
  ``job_id`` is in flight joins that job (both get the one answer), and one whose job finished recently gets the
  stored answer (:class:`~envhub.service.jobs.ResultCache`). Nothing runs twice. The same id with a different
  request is refused (409).
* **Backends** live in a :class:`~envhub.backends.pool.BackendPool`: ``/add_llm_server`` and ``/clear_llm_server``
  change it while jobs run. A running rollout whose server was cleared moves at its next turn to a server added
  later (it waits up to ``backend_wait_s`` for one), so a trainer can swap checkpoints without failing rollouts.
"""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

from envhub.backends.lifecycle import LifecycleError, WeightLifecycle, lifecycle_of
from envhub.service.gate_admission import GateAdmission
from envhub.service.jobs import Job, PhaseTimer, ResultCache, encode_result
from envhub.service.pipeline import Pipeline
from envhub.service.sandboxes import SandboxProvider
from envhub.rollout.request import RequestError, RolloutRequest, TaskIndex, TaskNotFound
from envhub.rollout.staleness import GateError, NoCapacity, StalenessGate
from envhub.rollout.throughput import Throughput
from envhub.service.schemas import ProcessRequest, ServiceError, fingerprint
from envhub.service.status import ServiceStatus

class RolloutService(ServiceStatus):
    """The rollout lifecycle behind the HTTP API.

    Args:
        tokenizer: the served model's tokenizer (prompts are rendered and tokenized here; token ids travel).
        backends: initial LLM backends (``LLMBackend`` objects, server URLs, or ``"golden"``).
        init_workers, run_workers, eval_workers: pool sizes of the three stages.
        timeout_s: default per-job timeout, in seconds inside stages (ProRL's default is 300).
        sandbox_pool: prewarmed sandboxes kept per repeating sandbox spec.
        max_sandboxes: live sandboxes at most (default: what the node's descriptors and memory allow); at the limit
            jobs wait in INIT for a sandbox to stop (``/status``: ``sandboxes.waiting``) instead of failing.
        backend_wait_s: how long a rollout waits for a backend when the pool is empty (checkpoint swap).
        result_cache: finished results kept for retried job ids.
        hub: where env ids are resolved (default: the process-wide plugin hub).
        gate: the :class:`~envhub.rollout.staleness.StalenessGate` that admits every job and harness session
            (``POST /staleness`` configures it; default: no bound, it only counts).
        metrics: keep the throughput figures (:mod:`envhub.rollout.throughput`: ``GET /metrics``, ``/status``'s
            ``throughput`` and ``bound``); False turns every hook off (the overhead benchmark's baseline).
        metrics_window_s: the sliding window of rates and idle ratios.
        controller: ``"aimd"`` or a :class:`~envhub.service.controller.Knobs`: adjust the rollouts in flight at run
            time from the LLM servers' queues and KV usage (:mod:`envhub.service.control_loop`); ``None`` (default):
            off, only the pools bound concurrency.
    """

    def __init__(self, tokenizer: Any, *, backends: list[Any] | None = None, init_workers: int = 8,
                 run_workers: int = 16, eval_workers: int = 4, timeout_s: float | None = 300.0,
                 sandbox_pool: int = 2, backend_wait_s: float = 120.0, result_cache: int = 10_000,
                 hub: Any = None, max_sandboxes: int | None = None, gate: StalenessGate | None = None,
                 metrics: bool = True, metrics_window_s: float = 60.0, controller: Any = None):
        from envhub.backends.pool import BackendPool

        self.tokenizer = tokenizer
        self.timeout_s = timeout_s
        self.pool = BackendPool(wait_timeout=backend_wait_s)
        for b in backends or []:
            self.add_backend(b)
        self.pipeline = Pipeline(tokenizer, init_workers=init_workers, run_workers=run_workers,
                                 eval_workers=eval_workers, sandboxes=SandboxProvider(pool_size=sandbox_pool, max_live=max_sandboxes),
                                 on_finish=self._on_finish)
        self.cache = ResultCache(result_cache)
        self.hub = hub
        self.started_at = time.time()
        self.counts = {"joined": 0, "replayed": 0, "rejected": 0}
        self._inflight: dict[str, tuple[str, asyncio.Future]] = {}  # job id -> (fingerprint, answer)
        self._cancel_pending: set[str] = set()
        self._cancelled: set[str] = set()  # ids cancelled while in flight: a retry with the id runs a new job
        self._index: TaskIndex | None = None  # specs and task sets, loaded on first use
        self._load_lock: asyncio.Lock | None = None
        self._harness_runner: Any = None  # the gateway, on a Unix socket, for harness jobs (started on first use)
        self.gate = gate if gate is not None else StalenessGate()
        self.admission = GateAdmission(self.gate, self.pipeline.cancel, lambda job_id: job_id in self._cancel_pending)
        self.metrics = Throughput(metrics_window_s, gauges=self._gauges) if metrics else None
        self.pool.observer = self.pipeline.sandboxes.meter = self.metrics
        self.controller: Any = None
        if controller is not None:
            from envhub.service.control_loop import ConcurrencyController
            from envhub.service.controller import Knobs

            if controller == "aimd":
                controller = Knobs()
            if not isinstance(controller, Knobs):
                raise ValueError(f"controller must be 'aimd', a Knobs or None, got {controller!r}")
            self.controller = ConcurrencyController(self, controller)

    # ---- weight updates ---------------------------------------------------------------------------------------------
    @property
    def lifecycle(self) -> WeightLifecycle:
        """The policy's weight-update lifecycle, shared by every backend in the pool."""
        return lifecycle_of(self.pool)

    async def pause(self, mode: str = "hold", timeout_s: float = 60.0) -> dict[str, Any]:
        """Stop sampling for a weight update (see :mod:`envhub.backends.lifecycle`); returns once nothing samples.
        Rollouts do not notice: their calls wait (``hold``) or are re-sent after the resume (``abort``)."""
        try:
            return await asyncio.to_thread(self.lifecycle.pause, mode, timeout_s=timeout_s)
        except LifecycleError as e:
            raise ServiceError(409, str(e)) from None

    def resume(self, version: int | None = None) -> dict[str, Any]:
        """Let sampling continue, tagged ``version`` from now on."""
        try:
            return self.lifecycle.resume(version)
        except LifecycleError as e:
            raise ServiceError(409, str(e)) from None

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.pipeline.running

    async def start(self, *, init_workers: int | None = None, run_workers: int | None = None,
                    eval_workers: int | None = None) -> bool:
        """Start the pools (optionally resized). False when already running (nothing changes then)."""
        if self.running:
            return False
        for stage, n in (("init", init_workers), ("run", run_workers), ("eval", eval_workers)):
            if n is not None:
                self.pipeline.sizes[stage] = int(n)
        await self.pipeline.start()
        if self.controller is not None:
            self.controller.start()
        return True

    async def stop(self) -> int:
        """Cancel every job, stop the pools and every sandbox. Returns how many jobs were cancelled."""
        if self.controller is not None:
            await self.controller.stop()
        if not self.running:
            return 0
        return await self.pipeline.stop("the server was stopped (POST /stop)")

    async def shutdown(self) -> None:
        """Stop, then close the backends (process exit)."""
        await self.stop()
        if self._harness_runner is not None:
            runner, self._harness_runner = self._harness_runner, None
            await runner.aclose()
        await self.pool.close()
        self.pipeline.shutdown_threads()

    # ---- /process -----------------------------------------------------------------------------------------------
    async def process(self, req: ProcessRequest) -> bytes:
        """Run (or join, or replay) the job and return its encoded result."""
        job_id = req.job_id or uuid.uuid4().hex
        fp = fingerprint(req)
        entry = self._inflight.get(job_id)
        if entry is not None and job_id in self._cancelled:
            # ProRL's DAPO client resends a job it has just cancelled with the same job_id: that is a new job, not a
            # share of the cancelled one's answer. Wait for the cancelled job to unwind, then go on as if fresh.
            self._same(job_id, fp, entry[0])
            await asyncio.wait([entry[1]])
            entry = self._inflight.get(job_id)  # a concurrent retry may have started the new job already: join it
        if entry is not None:
            self._same(job_id, fp, entry[0])
            self.counts["joined"] += 1
            return await asyncio.shield(entry[1])
        cached = self.cache.get(job_id)
        if cached is not None:
            self._same(job_id, fp, cached[0])
            self.counts["replayed"] += 1
            return cached[1]
        if not self.running:
            raise ServiceError(503, "the rollout server is stopped: POST /start first")
        if not self.pool.backends:
            raise ServiceError(503, "no LLM server: POST /add_llm_server {\"address\": \"http://host:port\"} first")
        self._cancelled.discard(job_id)
        task = asyncio.ensure_future(self._gated_run(job_id, fp, req))
        self._inflight[job_id] = (fp, task)
        task.add_done_callback(lambda t: self._done(job_id, t))
        return await asyncio.shield(task)  # a dropped connection must not cancel the job: a retry joins it

    def _done(self, job_id: str, task: asyncio.Future) -> None:
        if self._inflight.get(job_id, (None, None))[1] is task:
            del self._inflight[job_id]
            self._cancelled.discard(job_id)
        if not task.cancelled():
            task.exception()  # retrieved: a refused request's error is the caller's, not an unhandled one

    @staticmethod
    def _same(job_id: str, fp: str, other: str) -> None:
        if fp != other:
            raise ServiceError(409, f"job_id {job_id!r} is already used by a different request; job ids must be "
                                    "unique (a retry must resend the same instance and sampling_params)")

    async def _run(self, job_id: str, fp: str, req: ProcessRequest) -> bytes:
        from envhub.rollout.executor import Episode

        try:
            try:
                request, ignored = RolloutRequest.from_wire(req.instance, req.sampling_params, timeout_s=req.timeout)
            except RequestError as e:
                raise ServiceError(422, str(e)) from None
            spec, task = await self._resolve(request)
            config, timeout = request.config, request.timeout_s or self.timeout_s
            if config.parser != "auto":
                self._check_parser(config.parser)
        except ServiceError:
            self.counts["rejected"] += 1
            self._cancel_pending.discard(job_id)
            raise
        loop = asyncio.get_running_loop()
        if request.instance.harness is not None:
            episode = await self._harness_episode(request.instance.harness, spec, task, config, timeout)
        else:
            episode = Episode(spec, task, self.pool, self.tokenizer, config, session_id=job_id)
        meter = self.metrics if self.gate.bounded else None  # an unbounded gate admits at once: nothing to time
        if meter is not None:  # waiting for admission is not generating: the generator's slot is idle meanwhile
            meter.job_left()
        try:
            await self._admit(job_id, episode, req.instance)  # the staleness gate: waits while it has no room (AReaL)
        finally:
            if meter is not None:
                meter.job_started()
        timer = PhaseTimer(timeout, self.lifecycle.paused_s)  # paused for a weight update: not counted
        job = Job(job_id, spec, task, dict(req.instance), episode, timer, loop.create_future(),
                  fingerprint=fp)
        if ignored:
            job.notes["ignored_params"] = ignored
        if not self.running or self.pipeline.stopping:  # stopped (or stopping) while this request was admitted
            self._cancel_pending.discard(job_id)
            raise ServiceError(503, "the rollout server is stopped: POST /start first")
        episode.meter = self.metrics
        self.pipeline.submit(job)
        if job_id in self._cancel_pending:
            self._cancel_pending.discard(job_id)
            self.pipeline.cancel(job_id)
        await job.future
        return job.body

    async def _gated_run(self, job_id: str, fp: str, req: ProcessRequest) -> bytes:
        meter = self.metrics
        if meter is not None:  # the generator is busy with this request from its arrival to its reply
            meter.job_started()
        try:
            return await self._run(job_id, fp, req)
        finally:  # admitted but never finished (refused, stopped while admitted): the slot is given back
            if meter is not None:
                meter.job_left()
            self.admission.release(job_id)

    async def _admit(self, job_id: str, episode: Any, instance: dict[str, Any]) -> None:
        """Wait for the gate to admit this job (429 after ``admission_timeout_s``; groups together: see
        :mod:`envhub.service.gate_admission`). A job cancelled while it waits takes no slot."""
        try:
            lease = await self.admission.admit(job_id, instance)
        except (NoCapacity, GateError) as e:
            self.counts["rejected"] += 1
            raise ServiceError(429 if isinstance(e, NoCapacity) else 400, str(e)) from None
        if lease is not None and hasattr(episode, "lease"):  # a harness episode: its session runs under the lease
            episode.lease = lease

    async def _harness_episode(self, harness: Any, spec: Any, task: dict, config: Any, timeout: Any) -> Any:
        """An unmodified agent CLI for this job (``instance.harness``): its model calls go through the gateway to
        this service's backends; with only ``golden`` backends, the harness's own scripted golden plays."""
        from envhub.harness.episode import HarnessEpisode, HarnessRunner
        from envhub.harness.presets import HarnessNotInstalled, get_preset, golden_commands, scripted

        try:
            preset = get_preset(str(harness))
            preset.check_installed()
        except (ValueError, HarnessNotInstalled) as e:
            raise ServiceError(400, str(e)) from None
        if self._harness_runner is None:
            from envhub.gateway import Gateway

            self._harness_runner = await HarnessRunner.in_loop(Gateway(self.pool, self.tokenizer, gate=self.gate))
        backend = None
        if self.pool.backends and all(getattr(b, "name", "") == "golden" for b in self.pool.backends.values()):
            from envhub.backends.scripted import ScriptedBackend

            backend = ScriptedBackend(scripted(preset, golden_commands))
        return HarnessEpisode(self._harness_runner, spec, preset, task, config=config,
                              timeout_s=float(timeout or 600.0), session_backend=backend)

    def _on_finish(self, job: Job, result: dict[str, Any]) -> None:
        verdict = self.admission.finish(job.id, ok=result.get("critical_error") is None,
                                        versions=result.get("response_versions"))
        if verdict is not None:  # what the gate makes of it: fresh, withheld (baseline only), dropped, failed
            result.setdefault("details", {})["staleness"] = verdict
            if verdict["verdict"] in ("withheld", "dropped"):
                result["filter"] = True  # ProRL's "do not train on this"; a withheld reward still counts in its group
            if verdict["verdict"] == "dropped":
                result["critical_error"] = result.get("critical_error") or "stale"
        if self.metrics is not None:
            t = result["timing"]
            self.metrics.job_finished(result, {"init": t["init_time"], "run": t["run_time"],
                                               "eval": t["eval_time"], "others": t["others_time"]})
        job.body = encode_result(result)
        if result.get("finish_reason") == "cancelled":  # never replayed: a retry with this id runs a new job
            return
        self.cache.put(job.id, job.fingerprint, job.body)

    async def _resolve(self, request: RolloutRequest) -> tuple[Any, dict[str, Any]]:
        """``(spec, task row)`` of the request's instance, by :class:`~envhub.rollout.request.TaskIndex` (the rule the
        in-process adapters use too): an unknown env is a 400 (as ProRL answers an unknown ``data_source``), an
        unknown task or split a 404."""
        from envhub.plugins import PluginError

        if self._index is None:
            self._index = TaskIndex(self.hub)
        try:
            return await self._loaded(lambda: self._index.resolve(request.instance))
        except TaskNotFound as e:
            raise ServiceError(404, str(e)) from None
        except (KeyError, PluginError) as e:
            raise ServiceError(400, str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)) from None

    async def _loaded(self, load: Any) -> Any:
        """Run a blocking load (a plugin import, a task file) in a thread, one at a time."""
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        async with self._load_lock:
            return await asyncio.to_thread(load)

    @staticmethod
    def _check_parser(name: str) -> None:
        from envhub.codec.toolcall import get_parser

        try:
            get_parser(name)
        except Exception as e:
            raise ServiceError(422, f"sampling_params.parser: {e}") from None

    # ---- /cancel ------------------------------------------------------------------------------------------------
    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancel a job in flight; its waiting request(s) get a ``cancelled`` trajectory."""
        if self.pipeline.cancel(job_id):
            self._cancelled.add(job_id)
            return {"status": f"cancelled job {job_id}", "job_id": job_id, "cancelled": True}
        if job_id in self.pipeline.jobs or self.cache.get(job_id) is not None:
            return {"status": f"job {job_id} already finished", "job_id": job_id, "cancelled": False}
        if job_id in self._inflight:  # still being admitted (loading its env or task): cancelled once queued
            self._cancel_pending.add(job_id)
            self._cancelled.add(job_id)
            return {"status": f"cancel requested for job {job_id}", "job_id": job_id, "cancelled": True}
        # 200 as ProRL's server: a DAPO client cancels whatever it stopped waiting for, finished or never admitted
        return {"status": f"no job {job_id} in flight or recently finished", "job_id": job_id, "cancelled": False}

    # ---- backends -----------------------------------------------------------------------------------------------
    def add_backend(self, backend: Any, api: str = "completions") -> tuple[str, bool]:
        """Add an ``LLMBackend``, a server URL, or ``"golden"``; returns ``(name, added)`` (False: already there)."""
        from envhub.service.golden import GoldenBackend

        if isinstance(backend, str):
            if backend == "golden":
                if "golden" in self.pool.backends:
                    return "golden", False
                return self.pool.add(GoldenBackend(self._job_spec), name="golden"), True
            from envhub.backends import make_backend

            if not backend.removeprefix("sglang+").startswith(("http://", "https://")):
                raise ServiceError(422, f"address: {backend!r} must be http(s)://host:port of a token-id server "
                                        "(vLLM, or sglang+http(s)://... for SGLang) or 'golden'")
            try:  # the one backend factory; "sglang+http://..." names SGLang as the CLI's --model does
                backend = make_backend(backend if api == "completions" or backend.startswith("sglang+")
                                       else f"{api}+{backend}")
            except ValueError as e:
                raise ServiceError(422, f"address: {e}") from None
            if not hasattr(backend, "address"):
                raise ServiceError(422, f"address: {backend!r} is not one token-id server (http(s)://host:port)")
            if backend.address in self.pool.backends:
                return backend.address, False
        if isinstance(backend, GoldenBackend) and backend.spec_of is None:
            backend.spec_of = self._job_spec  # built by the caller (a test's subclass): it plays this service's jobs
        return self.pool.add(backend), True

    def _job_spec(self, session_id: str) -> Any:
        """The env of the job whose rollout session this is (the golden backend plays its golden)."""
        job = self.pipeline.jobs.get(session_id)
        if job is None:
            raise RuntimeError(f"session {session_id!r} is not a job of this rollout service")
        return job.spec

    def clear_backends(self) -> list[str]:
        names = list(self.pool.backends)
        self.pool.clear()
        return names
