"""The three-stage pipeline: INIT, RUN and EVAL worker pools with their own queues (the ProRL Agent design).

::

            submit                 INIT workers (n_init)         RUN workers (n_run)         EVAL workers (n_eval)
    job ──▶ [init queue] ──▶ make env, reset (sandbox  ──▶ [run queue] ──▶ agent loop ──▶ [eval queue] ──▶ verifier
                             from the prewarmed pool),                    (RUN sandbox                    ──▶ done
                             render the prompt                             freed at its end)

Why separate pools: the stages load different resources (sandbox starts and resets; the LLM servers; test runs), so
each pool is sized to its own resource, and a RUN worker (the expensive one: it is what keeps the LLM busy) never
waits for a sandbox to start or a test suite to finish. Workers are asyncio tasks on the server's event loop; the
blocking parts of envs and verifiers run in the loop's thread pool, which :meth:`Pipeline.start` sizes to the
workers.

Guarantees, whatever happens:

* **Timeouts count only time inside stages** (:class:`~envhub.service.jobs.PhaseTimer`). A stage gets the job's
  remaining budget; past it the stage is cancelled and the job ends ``finish_reason="timeout"``.
* **Cancel** (:meth:`Pipeline.cancel`) marks the job discarded (workers skip it in the queues), cancels the stage
  task running it, frees its sandboxes, and answers with a ``cancelled`` trajectory.
* **A stage that raises** (a broken plugin) gives a well-formed ``error`` trajectory naming the stage; the worker
  goes on with the next job.
* **Stop** cancels every job, waits for them to be released, stops the workers, closes the sandbox pools and stops
  any sandbox still alive in the process.

**Concurrency.** Every job holds a slot from the moment an INIT worker takes it until it is answered (INIT, RUN and
EVAL, and the queues between them): :attr:`Pipeline.in_flight` counts them. :meth:`Pipeline.set_concurrency` caps
the slots (the controller of :mod:`envhub.service.control_loop` moves the cap at run time; ``None``: only the pools
bound it). A job over the cap waits in the INIT queue, before it starts anything (no sandbox, no env). Lowering the
cap never touches a job that holds a slot: the excess drains as those jobs finish.
"""
from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from envhub.fdlimit import raise_nofile_limit
from envhub.service.errors import job_failure, log, log_job_failure, scrub
from envhub.service.jobs import STAGES, Job, State, result_dict
from envhub.service.sandboxes import JobSandboxes, SandboxProvider, stop_all_live

_STATE = {"init": State.INIT, "run": State.RUN, "eval": State.EVAL}
_QUEUED = {"init": State.QUEUED_INIT, "run": State.QUEUED_RUN, "eval": State.QUEUED_EVAL}
_NEXT = {"init": "run", "run": "eval"}


class Pipeline:
    """INIT/RUN/EVAL worker pools over one event loop (see the module docstring).

    Args:
        tokenizer: renders prompts (token in / token out: the backend's model's tokenizer).
        init_workers, run_workers, eval_workers: pool sizes.
        sandboxes: where INIT gets sandboxes (default: a :class:`SandboxProvider` with 2 prewarmed per spec).
        on_finish: ``(job, result) -> None`` called once per job when its result is final.
    """

    def __init__(self, tokenizer: Any, *, init_workers: int = 8, run_workers: int = 16, eval_workers: int = 4,
                 sandboxes: SandboxProvider | None = None, on_finish: Callable[[Job, dict], None] | None = None):
        for name, n in (("init", init_workers), ("run", run_workers), ("eval", eval_workers)):
            if int(n) < 1:
                raise ValueError(f"{name}_workers must be >= 1, got {n}")
        self.tokenizer = tokenizer
        self.sizes = {"init": int(init_workers), "run": int(run_workers), "eval": int(eval_workers)}
        self.sandboxes = sandboxes or SandboxProvider()
        self.on_finish = on_finish
        self.jobs: dict[str, Job] = {}  # every job not yet finished, by id
        self.running = False
        self.stopping = False  # stop() is cancelling jobs: nothing new is submitted
        self.counts = {"submitted": 0, "done": 0, "failed": 0, "timeout": 0, "cancelled": 0}
        self._queues: dict[str, asyncio.Queue] = {}
        self._waiting: dict[str, set[Job]] = {s: set() for s in STAGES}  # queued and not discarded
        self._active: dict[str, set[Job]] = {s: set() for s in STAGES}  # inside the stage now
        self._workers: list[asyncio.Task] = []
        self._background: set[asyncio.Task] = set()
        self._executor: ThreadPoolExecutor | None = None
        self.limit: int | None = None  # slots at most (set_concurrency); None: only the pools bound concurrency
        self.in_flight = 0  # jobs holding a slot: taken by an INIT worker, not yet answered
        self._slot_freed: asyncio.Event | None = None  # set (and replaced) whenever a slot may have opened

    # ---- lifecycle ----------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the worker pools on the running event loop (idempotent)."""
        if self.running:
            return
        raise_nofile_limit()  # a node with a thousand live sandboxes needs far more than the default 1024
        loop = asyncio.get_running_loop()
        if self._executor is None:
            # env/verifier code that blocks runs in the loop's default thread pool (asyncio.to_thread); the
            # default (cores + 4 threads) would cap blocking stages far below the pool sizes on a small host
            self._executor = ThreadPoolExecutor(sum(self.sizes.values()) + 8, thread_name_prefix="envhub-stage")
            loop.set_default_executor(self._executor)
        if self.sandboxes.closed:
            old = self.sandboxes
            self.sandboxes = old.renewed()
        self._queues = {s: asyncio.Queue() for s in STAGES}
        self._workers = [asyncio.create_task(self._worker(stage), name=f"envhub-{stage}-worker-{i}")
                         for stage in STAGES for i in range(self.sizes[stage])]
        self.running = True

    async def stop(self, reason: str = "the server stopped", grace_s: float = 30.0) -> int:
        """Cancel every job (each answered ``cancelled``), stop the workers, close the sandbox pools and stop every
        sandbox left in the process. Returns how many jobs were cancelled."""
        # from here no job is submitted: a request the staleness gate admits meanwhile (a cancelled job gave its
        # lease back) would otherwise start after this list was taken and be cut down mid-stage below
        self.stopping = True
        jobs = list(self.jobs.values())
        for job in jobs:
            self.cancel(job.id, reason)
        if jobs:
            await asyncio.wait([j.future for j in jobs], timeout=grace_s)
        self.running = self.stopping = False
        for w in self._workers:
            w.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        for job in list(self.jobs.values()):  # only if a release outlived grace_s: answer anyway
            if job.current is not None:
                job.current.cancel()
            self._resolve(job)
        await asyncio.to_thread(self.sandboxes.close)
        await asyncio.to_thread(stop_all_live)
        if self._background:
            await asyncio.wait(self._background, timeout=grace_s)
        return len(jobs)

    # ---- jobs ---------------------------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        """Queue ``job`` for INIT. Its ``future`` resolves with the result dict when it is finished."""
        if not self.running or self.stopping:
            raise RuntimeError("the pipeline is not running" if not self.running else "the pipeline is stopping")
        job.sandboxes = JobSandboxes(self.sandboxes)
        job.episode.log_failures = False  # the pipeline logs each failed job once, with its job id (_run_stage)
        self.jobs[job.id] = job
        self.counts["submitted"] += 1
        self._enqueue(job, "init")

    def cancel(self, job_id: str, reason: str = "cancelled by request") -> bool:
        """Cancel a job wherever it is. False when no such job is in flight (unknown, or already finished)."""
        job = self.jobs.get(job_id)
        if job is None or job.discarded or job.state in (State.FINISHING, State.DONE):
            return False
        job.discarded = True
        job.episode.fail("cancelled", reason)
        if job.current is not None and not job.current.done():
            job.current.cancel()  # the worker running the stage finishes the job once the stage has unwound
        else:
            for waiting in self._waiting.values():
                waiting.discard(job)
            self._spawn(self._finish(job))
            self._slots_changed()  # an INIT worker holding it while it waited for a slot lets it go
        return True

    def set_concurrency(self, limit: int | None) -> None:
        """Cap the jobs in flight at ``limit`` (``None``: uncapped). Safe at any time: raising it lets waiting jobs
        start at once; lowering it stops new starts until the jobs above it have finished (none is cancelled)."""
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"concurrency must be an integer >= 1 or None, got {limit!r}")
        self.limit = limit
        self._slots_changed()

    def _slots_changed(self) -> None:
        if self._slot_freed is not None:
            self._slot_freed.set()  # wakes every waiter; each re-checks the cap (at most init_workers of them)
            self._slot_freed = asyncio.Event()

    async def _take_slot(self, job: Job) -> None:
        """Wait until ``job`` may start under the cap (or was cancelled meanwhile), then hold a slot for it."""
        while not job.discarded and self.limit is not None and self.in_flight >= self.limit:
            if self._slot_freed is None:
                self._slot_freed = asyncio.Event()
            await self._slot_freed.wait()
        if not job.discarded:
            job.slot = True
            self.in_flight += 1

    def _enqueue(self, job: Job, stage: str) -> None:
        job.state = _QUEUED[stage]
        self._waiting[stage].add(job)
        self._queues[stage].put_nowait(job)

    async def _worker(self, stage: str) -> None:
        queue = self._queues[stage]
        while True:
            job = await queue.get()
            if stage == "init":  # the job stays listed as queued while it waits for a slot under the cap
                await self._take_slot(job)
            self._waiting[stage].discard(job)
            if job.discarded:  # cancelled while queued: cancel() already finishes it
                continue
            try:
                await self._run_stage(job, stage)
                if job.discarded or job.episode.failed or stage == "eval":
                    await self._finish(job)
                else:
                    self._enqueue(job, _NEXT[stage])
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a bug of ours must not kill the worker: the job still gets an answer
                if job.episode.failed:  # its failure is logged already; our bug still is, on its own
                    log.error("job %s: the envhub service raised after the job ended", job.id, exc_info=e)
                else:
                    job.episode.fail("error", job_failure(job, job.stage or "service", e, "envhub service"))
                    log_job_failure(job, job.stage or stage)
                await self._finish(job)

    async def _run_stage(self, job: Job, stage: str) -> None:
        ep = job.episode
        remaining = job.timer.remaining()
        if remaining is not None and remaining <= 0:
            return self._timeout(job, stage)
        job.state = _STATE[stage]
        self._active[stage].add(job)
        job.timer.enter(stage)
        task = job.current = asyncio.create_task(self._stage_coro(job, stage))
        try:
            done, _ = await asyncio.wait({task}, timeout=remaining)
            while not done and (job.timer.remaining() or 0.0) > 0:  # paused time gave the job more
                done, _ = await asyncio.wait({task}, timeout=max(0.05, job.timer.remaining() or 0.0))
            if not done:
                task.cancel()
                await asyncio.wait({task})  # let it unwind (RUN frees its sandbox on the way out)
                self._timeout(job, stage)
            elif not task.cancelled() and task.exception() is not None:
                ep.fail("error", job_failure(job, stage, task.exception()))
        except asyncio.CancelledError:  # the worker itself is being stopped: take its stage down with it
            task.cancel()
            raise
        finally:
            job.timer.exit()
            job.current = None
            self._active[stage].discard(job)
        if ep.traj.finish_reason == "error" and job.failed_stage is None:
            job.failed_stage = stage
            log_job_failure(job, stage)  # the one record of this job's failure, whatever caused it

    def _timeout(self, job: Job, stage: str) -> None:
        job.timer.timeout_triggered = True
        if not job.episode.failed:
            job.episode.fail("timeout", f"the job's timeout of {job.timer.timeout:g}s (time inside stages) ran "
                                        f"out during {stage.upper()}")
            log_job_failure(job, stage, level=logging.WARNING)

    async def _stage_coro(self, job: Job, stage: str) -> None:
        ep = job.episode
        if stage == "init":
            if ep.env is None:
                try:
                    ep.env = self._make_env(job)
                except Exception as e:
                    return ep.fail("error", job_failure(job, stage, e, "making the env failed"))
                ep.codec = ep.codec or self._codec_for(ep.env, ep.config.parser)
            await ep.init()
        elif stage == "run":
            await ep.run()
        else:
            await ep.evaluate()  # a crashed grader marks the episode failed (Episode.evaluate), here as in-process
            if ep.score is not None and ep.score.crashed and ep.traj.error:
                ep.traj.error = scrub(ep.traj.error)  # the verifier's exception text may name host paths

    def _make_env(self, job: Job) -> Any:
        cfg = job.episode.config
        kwargs = dict(cfg.env_kwargs)
        if cfg.max_turns is not None:
            kwargs["max_turns"] = cfg.max_turns
        env = job.spec.make(**kwargs)
        if hasattr(env, "sandbox_factory"):  # ToolEnv: its sandbox comes from the job's factory (prewarmed pool)
            env.sandbox_factory = job.sandboxes
        return env

    def _codec_for(self, env: Any, parser: str) -> Any:
        """The codec for the env's tool set: the one shared per tokenizer (:meth:`ChatCodec.shared`)."""
        from envhub.codec.chat import ChatCodec

        return ChatCodec.shared(self.tokenizer, tools=[t.to_openai() for t in getattr(env, "tools", [])] or None,
                                parser=parser)

    async def _finish(self, job: Job) -> None:
        """Release everything the job holds, then answer it (exactly once)."""
        if job.state in (State.FINISHING, State.DONE):
            return
        job.state = State.FINISHING
        try:
            if job.sandboxes is not None:  # first: refuses sandboxes that a late reset thread still asks for
                if job.sandboxes.used:
                    await asyncio.to_thread(job.sandboxes.close)  # stopping a sandbox blocks (TERM, grace, KILL)
                else:
                    job.sandboxes.close()
            await job.episode.close()
        except Exception as e:
            job.episode.traj.details.setdefault("close_error", f"{type(e).__name__}: {e}")
        finally:
            self._resolve(job)

    def _resolve(self, job: Job) -> None:
        if job.future.done():
            return
        job.state = State.DONE
        self.jobs.pop(job.id, None)
        if job.slot:
            job.slot = False
            self.in_flight -= 1
            self._slots_changed()
        result = result_dict(job)
        reason = job.episode.traj.finish_reason
        self.counts[{"error": "failed", "timeout": "timeout", "cancelled": "cancelled"}.get(reason, "done")] += 1
        if self.on_finish is not None:
            try:
                self.on_finish(job, result)
            except Exception:  # a broken observer must not keep the client from its answer; it is logged
                log.error("job %s: the on_finish callback raised", job.id, exc_info=True)
        job.future.set_result(result)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ---- status -------------------------------------------------------------------------------------------------
    def shutdown_threads(self) -> None:
        """Stop the stage thread pool without waiting (a thread stuck in a hung env must not block shutdown)."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def status(self) -> dict[str, Any]:
        """Queue depth and jobs in flight per stage, pool sizes, and job counts (what ``GET /status`` shows)."""
        stages = {s: {"queued": len(self._waiting[s]), "in_flight": len(self._active[s]), "workers": self.sizes[s]}
                  for s in STAGES}
        return {"stages": stages, "jobs": {**self.counts, "in_flight": len(self.jobs)},
                "concurrency": {"limit": self.limit, "in_flight": self.in_flight},
                "sandboxes": self.sandboxes.status()}
