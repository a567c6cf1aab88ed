"""The loop behind ``envhub rollout``: bounded episodes, results kept as they finish, an honest Ctrl-C.

- Every episode is bounded by ``timeout`` (the executor marks it ``timeout``); its cleanup gets a grace period more,
  after which it is reported as ``timeout`` too, so one hung env or verifier can never hang the run.
- Each finished trajectory goes to ``on_done`` (and to the run directory) the moment it finishes.
- First Ctrl-C: no new episode starts, the running ones are cancelled and cleaned up (their sandboxes released);
  what finished is kept and the run ends with status 130. Second Ctrl-C: exit at once, after killing this
  process's sandboxes and removing their state, with the run's metadata written.
- With a run directory, the run's throughput figures (:class:`envhub.rollout.throughput.Throughput`: rollouts per
  second, slots used, latency, stage times, outcomes) are appended to ``throughput.jsonl`` every ``SERIES_EVERY_S``
  seconds and once at the end (``envhub show RUN --plot``). A local run has no trainer: its trainer figures stay
  unknown; model calls are not timed one by one here (the summary's tokens/s says the model's speed).
- The event loop is this module's own (not ``asyncio.run``), with a thread pool sized for ``concurrency``: a
  thread stuck in a hung env must neither starve the others nor be waited for at the end.
"""
from __future__ import annotations

import asyncio
import math
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from statistics import fmean, pstdev
from typing import Any

from envhub.cli.common import console

CLEANUP_GRACE_S = 30.0  # past its timeout, how long an episode's cleanup may take before it is abandoned
SERIES_EVERY_S = 5.0  # a throughput.jsonl line this often (a snapshot took ~8 ms with 2000 rollouts in its window here)


class Run:
    """``n`` tasks x ``samples`` of one env with one backend (see the module docstring)."""

    def __init__(self, spec, backend, tokenizer, *, n: int, samples: int, concurrency: int, config,
                 timeout: float | None = None, split: str | None = None, writer=None, label: str = "",
                 show_progress: bool = True, rows: list | None = None):
        from envhub.cli.common import load_tasks
        from envhub.task import select

        self.spec, self.backend, self.tokenizer, self.config = spec, backend, tokenizer, config
        self.samples, self.concurrency, self.timeout, self.writer = samples, concurrency, timeout, writer
        self.label, self.show_progress = label or spec.id, show_progress
        from envhub.rollout.request import TaskIndex

        self.split = split
        self.index = TaskIndex(specs={spec.id: spec})  # the spec may come from a path: pinned, not looked up
        self.tasks = select(load_tasks(spec, split) if rows is None else rows, n=n)  # rows: already loaded
        done = writer.done if writer is not None else set()
        self.work = [(t, k) for t in self.tasks for k in range(samples) if (str(t["task_id"]), k) not in done]
        self.finished: list[Any] = []  # this invocation's finished trajectories, in finishing order
        self.interrupts = 0
        self._t0, self._model_tokens = time.perf_counter(), 0
        self._sampled_before: int | None = None
        self.wall_s = 0.0
        self.meter: Any = None  # the run's throughput figures, kept when there is a run directory to write them to
        if writer is not None:
            from envhub.rollout.throughput import Throughput

            self.meter = Throughput(window_s=60.0)

    # ---- one episode -------------------------------------------------------------------------------------------
    async def _one(self, task, k: int, sem: asyncio.Semaphore, on_done) -> None:
        from envhub.rollout.executor import run_request
        from envhub.rollout.request import Instance, RolloutRequest
        from envhub.rollout.trajectory import Trajectory

        queued = time.perf_counter()
        async with sem:
            started = time.perf_counter()
            if self.meter is not None:
                self.meter.job_started()
            cfg = self.config
            if cfg.sampling.seed is not None:  # distinct, reproducible seeds per sample (as rollout_many)
                cfg = replace(cfg, sampling=replace(cfg.sampling, seed=cfg.sampling.seed + k))
            request = RolloutRequest(Instance(self.spec.id, task=task, split=self.split), cfg, timeout_s=self.timeout)
            episode = run_request(request, self.backend, self.tokenizer, index=self.index)
            try:
                if self.timeout is None:
                    traj = await episode
                else:
                    traj = await asyncio.wait_for(episode, self.timeout + CLEANUP_GRACE_S)
            except asyncio.TimeoutError:  # the episode timed out and then its cleanup hung too
                traj = Trajectory.failed(self.spec.id, str(task["task_id"]), "timeout",
                                         f"rollout took longer than {self.timeout}s and its cleanup did not finish "
                                         f"within {CLEANUP_GRACE_S:.0f}s more")
            traj.details["sample"] = k
            if not getattr(self.backend, "trainable", True):  # a text-only backend: evaluation only
                from envhub.backends.chat import mark_untrainable

                mark_untrainable(traj)
            self.finished.append(traj)
            if self.meter is not None:
                m = traj.metrics
                self.meter.job_finished({"finish_reason": traj.finish_reason},
                                        {"init": m.get("init_s", 0.0), "run": m.get("run_s", 0.0),
                                         "eval": m.get("eval_s", 0.0), "others": started - queued})
                self.meter.job_left()
            if self.writer is not None:
                self.writer.append(traj)
            on_done(traj)

    async def _all(self) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
        from rich.progress import TimeRemainingColumn

        sem = asyncio.Semaphore(self.concurrency)
        t0 = self._t0 = time.perf_counter()
        self._sampled_before = getattr(self.backend, "tokens_sampled", None)
        rate = self.rate_text
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[rate]}"))
        # progress only on a terminal: a log file gets the summary, not a redrawn bar
        live = self.show_progress and console.is_terminal
        try:
            with Progress(*columns, console=console, transient=True, disable=not live) as progress:
                bar = progress.add_task(self.label, total=len(self.work), rate="")

                def on_done(traj) -> None:
                    self._model_tokens += sum(traj.response_mask)
                    progress.update(bar, advance=1, rate=rate())

                async def tick() -> None:  # redraw the rate while episodes run, not only when one finishes
                    while True:
                        await asyncio.sleep(0.5)
                        progress.update(bar, rate=rate())

                async def series() -> None:
                    while True:
                        await asyncio.sleep(SERIES_EVERY_S)
                        self.record_series()

                ticker = asyncio.ensure_future(tick()) if live else None
                recorder = asyncio.ensure_future(series()) if self.meter is not None else None
                try:
                    await asyncio.gather(*(self._one(t, k, sem, on_done) for t, k in self.work))
                finally:
                    for task in (ticker, recorder):
                        if task is not None:
                            task.cancel()
                    if self.meter is not None:
                        self.record_series()  # the end of the run, whatever cut it short
        finally:
            self.wall_s = time.perf_counter() - t0
            await self.backend.close()

    def record_series(self) -> None:
        """One line of the run's ``throughput.jsonl`` (never fatal: a full disk must not end the run)."""
        from envhub.rollout.live import snapshot_row, total
        from envhub.rollout.livepoll import SERIES, record_line

        row = snapshot_row(self.meter.snapshot(), "local", time.time())
        try:
            with open(self.writer.path / SERIES, "a") as f:
                f.write(record_line([row], total([row])))
        except OSError:
            pass

    def rate_text(self) -> str:
        """Tokens per second so far: counted as they are sampled when the backend counts them (``tokens_sampled``:
        one long generation must not look like a stalled run), else the finished episodes' model tokens."""
        now = getattr(self.backend, "tokens_sampled", None)
        before = self._sampled_before
        n = now - before if isinstance(now, int) and isinstance(before, int) else self._model_tokens
        failed = sum(t.finish_reason in ("error", "timeout") for t in self.finished)
        return f"{n / max(time.perf_counter() - self._t0, 1e-9):.1f} tok/s" + (f", {failed} failed" if failed else "")

    # ---- the loop and Ctrl-C -------------------------------------------------------------------------------------
    def execute(self, handle_sigint: bool = False) -> int:
        """Run every pending episode; 0 when all ran, 130 when interrupted."""
        from envhub.fdlimit import raise_nofile_limit

        raise_nofile_limit()  # many concurrent sandboxed episodes need more than the default 1024 descriptors
        loop = asyncio.new_event_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=2 * self.concurrency + 8,
                                                     thread_name_prefix="envhub-rollout"))
        main = loop.create_task(self._all())
        if handle_sigint:
            loop.add_signal_handler(signal.SIGINT, self._on_sigint, main)
            from envhub.cli import interrupt

            if interrupt.pending():  # a Ctrl-C during start-up that something swallowed: honour it now
                self._on_sigint(main)
        try:
            loop.run_until_complete(main)
            if handle_sigint:
                # a Ctrl-C that came in the loop's last iteration has its callback queued behind the loop's stop:
                # run a few more iterations so it is honoured (130), not dropped with the loop (exit 0)
                for _ in range(3):
                    loop.run_until_complete(asyncio.sleep(0))
            return 130 if self.interrupts else 0
        except asyncio.CancelledError:
            return 130
        finally:
            if handle_sigint:
                loop.remove_signal_handler(signal.SIGINT)
            loop.close()  # shuts the thread pool down without waiting for a thread stuck in a hung env

    def _on_sigint(self, main: asyncio.Task) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            where = f" in {self.writer.path}" if self.writer is not None else ""
            console.print(f"\n[yellow]interrupted[/]: stopping the running rollouts; the {len(self.finished)} "
                          f"finished are kept{where}. Ctrl-C again to exit at once.")
            main.cancel()
            return
        from envhub.cli.runs import remove_own_sandboxes

        removed = remove_own_sandboxes()
        if self.writer is not None:
            self.writer.write_meta(summary=self.summary(), interrupted=True)
            self.writer.close()
        console.print(f"[yellow]exiting now[/]: {len(self.finished)} finished rollouts kept, "
                      f"{removed} sandboxes removed")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)

    # ---- results -------------------------------------------------------------------------------------------------
    def results(self) -> list[Any]:
        """Every trajectory of the run, the ones of an earlier try (``--resume``) included, task-major."""
        from envhub.cli.runs import key_of, read_lines
        from envhub.rollout.trajectory import Trajectory

        by_key = {}
        if self.writer is not None:
            by_key = {key_of(d): Trajectory.from_dict(d) for d in read_lines(self.writer.path)}
        for t in self.finished:
            by_key[(str(t.task_id), t.details.get("sample", 0))] = t
        order = [(str(t["task_id"]), k) for t in self.tasks for k in range(self.samples)]
        return [by_key[key] for key in order if key in by_key]

    def summary(self) -> dict[str, Any]:
        return summarize_run(self.results(), self.finished, self.wall_s)


def summarize_run(trajs: list[Any], new: list[Any], wall_s: float) -> dict[str, Any]:
    """:func:`envhub.rollout.stats.summarize` plus reward mean ± std, pass@k's 95% interval over tasks, and the
    throughput of this invocation (model tokens per second)."""
    from collections import defaultdict

    from envhub.rollout.stats import pass_at_k, summarize

    stats = summarize(trajs)
    if not trajs:
        return stats
    rewards = [t.reward for t in trajs]
    out: dict[str, Any] = {"rollouts": stats.pop("rollouts"), "tasks": stats.pop("tasks"),
                           "reward": f"{fmean(rewards):.3f} ± {pstdev(rewards):.3f}"}
    by_task: dict[str, list[Any]] = defaultdict(list)
    for t in trajs:
        by_task[t.task_id].append(t)
    k = min(len(v) for v in by_task.values())
    per_task = [pass_at_k(len(v), sum(t.passed for t in v), k) for v in by_task.values()]
    out[f"pass@{k}"] = stats.pop(f"pass@{k}")
    out[f"pass@{k}_ci95"] = _ci95(per_task)
    out.update(stats)
    if wall_s > 0 and new:
        out["model_tokens_per_s"] = sum(sum(t.response_mask) for t in new) / wall_s
    return out


def _ci95(values: list[float]) -> str:
    """Normal-approximation 95% interval of the mean over tasks (clipped to [0, 1]); '-' with one task."""
    if len(values) < 2:
        return "-"
    half = 1.96 * pstdev(values) * math.sqrt(len(values) / (len(values) - 1)) / math.sqrt(len(values))
    mean = fmean(values)
    return f"[{max(0.0, mean - half):.3f}, {min(1.0, mean + half):.3f}]"
