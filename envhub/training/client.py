"""``RolloutClient``: the trainer's side of the rollout service, async, over one or several servers.

::

    async with RolloutClient(["http://10.0.0.7:8006", "http://10.0.0.8:8006"]) as client:
        await client.add_llm_server("http://10.0.0.7:8000")           # on every server
        trajs = await asyncio.gather(*(client.process(inst, {"temperature": 1.0}) for inst in batch))

What it takes care of:

* **Its own job ids.** Every job gets a client-made id before it is sent, so :meth:`cancel` works at once and a
  retry is safe: the server joins a retried job to the one in flight, or replays its stored answer. A job never
  runs twice because a connection dropped.
* **Retries.** A connection that could not be opened (nothing reached the server) moves the job to another server;
  a connection lost after the request was sent retries on the *same* server (which has the job) until that server
  is unreachable. A 503 (server stopped, no LLM server yet) is retried with backoff; a 4xx is the request's fault
  and raised at once as :class:`RolloutClientError`.
* **Several servers.** Each job goes to the server with the fewest jobs in flight from this client; among equally
  loaded ones a server on this host comes first (no network hop), then the others in round-robin order.

aiohttp is used (one connection per in-flight request; a job can take minutes, so there is no total timeout).
"""
from __future__ import annotations

import asyncio
import ipaddress
import itertools
import logging
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

RETRY_STATUSES = {502, 503, 504}
log = logging.getLogger(__name__)
MAX_OPENING = 256
"""Connections opened at once. Thousands of simultaneous connects overflow a listener's accept queue (Linux:
``net.core.somaxconn``, ``tcp_max_syn_backlog``); the dropped SYNs are retried after 1, 3, 7, 15... s, which stalled
a 25,000-job run in bursts of ~1,000. Opening a bounded number at a time keeps every connect under the backlog."""


class _OpeningSlot:
    """One request's hold on an opening slot, given back once (connection up, reused, or the request over)."""

    __slots__ = ("sem", "held")

    def __init__(self, sem: asyncio.Semaphore):
        self.sem, self.held = sem, False

    async def take(self) -> None:
        await self.sem.acquire()
        self.held = True

    def give_back(self) -> None:
        if self.held:
            self.held = False
            self.sem.release()


async def _opened(session: Any, ctx: Any, params: Any) -> None:
    """aiohttp trace hook: the request's connection is open (or reused): its opening slot is free again."""
    if isinstance(ctx.trace_request_ctx, _OpeningSlot):
        ctx.trace_request_ctx.give_back()


class RolloutClientError(RuntimeError):
    """A request the server refused (``status`` 4xx, or 5xx after the retries), or no server could be reached."""

    def __init__(self, message: str, status: int | None = None, detail: Any = None):
        super().__init__(message)
        self.status, self.detail = status, detail


@dataclass(eq=False)
class _Server:
    url: str
    local: bool
    in_flight: int = 0
    down_until: float = 0.0
    sent: int = 0
    sends_at: bool = True  # False once the server refused ``at`` in a step report (an envhub before 2026-11-27)


def local_addresses() -> set[str]:
    """The addresses of this machine (loopback, hostname, every interface), to tell same-host servers apart."""
    names = {"localhost", socket.gethostname(), socket.getfqdn()}
    try:
        names |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    try:
        import psutil

        for addrs in psutil.net_if_addrs().values():
            names |= {a.address.split("%")[0] for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6)}
    except Exception:  # noqa: S110 (psutil is optional: the names above cover the usual cases)
        pass
    return {n.lower() for n in names if n}


def is_local(url: str, local: set[str] | None = None) -> bool:
    host = (urlsplit(url).hostname or "").lower()
    try:
        if ipaddress.ip_address(host).is_loopback:
            return True
    except ValueError:
        pass
    return host in (local if local is not None else local_addresses())


class RolloutClient:
    """Async client of one or several rollout servers (see the module docstring).

    Args:
        urls: a server URL or a list of them.
        token: the servers' bearer token, if any.
        retries: attempts after the first, per job.
        backoff_s: first retry delay (doubles each time, capped at 5 s).
        connect_timeout_s: seconds to open a connection.
        max_connections: concurrent connections (one per in-flight request).
    """

    def __init__(self, urls: str | list[str], *, token: str | None = None, retries: int = 8,
                 backoff_s: float = 0.2, connect_timeout_s: float = 10.0, max_connections: int = 20_000):
        urls = [urls] if isinstance(urls, str) else list(urls)
        if not urls:
            raise ValueError("RolloutClient needs at least one server URL")
        local = local_addresses()
        self.servers = [_Server(u.rstrip("/"), is_local(u, local)) for u in urls]
        self.token, self.retries, self.backoff_s = token, retries, backoff_s
        self.connect_timeout_s, self.max_connections = connect_timeout_s, max_connections
        self._rr = itertools.count()
        self._where: dict[str, _Server] = {}  # job id -> the server it was sent to (for cancel)
        self._session: Any = None
        self._slots: asyncio.Semaphore | None = None  # in-flight requests, at most max_connections
        self._opening: asyncio.Semaphore | None = None  # connections being opened, at most MAX_OPENING
        self._tasks: set[asyncio.Task] = set()
        self.counts = {"sent": 0, "retried": 0, "moved": 0, "failed": 0}

    # ---- plumbing -----------------------------------------------------------------------------------------------
    async def __aenter__(self) -> RolloutClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def _http(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            # no pool limit in aiohttp: past its limit, aiohttp's connector queues waiters in a way that stalled a
            # 65,000-job run (1,625 sent in 20 min, none in flight, the client at 80% CPU); the client bounds its
            # requests itself with a FIFO semaphore instead (see _call)
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60)
            trace = aiohttp.TraceConfig()  # a request's opening slot is given back once its connection is up
            trace.on_connection_create_end.append(_opened)
            trace.on_connection_reuseconn.append(_opened)
            self._session = aiohttp.ClientSession(
                connector=connector, headers=headers, trace_configs=[trace],
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s))
        return self._session

    async def close(self) -> None:
        if self._tasks:  # cancel requests still on their way
            await asyncio.wait(self._tasks, timeout=10)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    def new_job_id(prefix: str = "job") -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    def pick(self, exclude: set[_Server] | frozenset = frozenset()) -> _Server:
        """The least loaded server that is up (same-host first among equals, then round-robin)."""
        now = time.monotonic()
        up = [s for s in self.servers if s.down_until <= now and s not in exclude]
        if not up:  # every server looks down: try the one that comes back first rather than fail outright
            up = sorted((s for s in self.servers if s not in exclude) or self.servers, key=lambda s: s.down_until)[:1]
        least = min((s.in_flight, not s.local) for s in up)
        ties = [s for s in up if (s.in_flight, not s.local) == least]
        return ties[next(self._rr) % len(ties)]

    async def _call(self, server: _Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        if self._slots is None:
            self._slots, self._opening = asyncio.Semaphore(self.max_connections), asyncio.Semaphore(MAX_OPENING)
        async with self._slots:
            gate = _OpeningSlot(self._opening)
            await gate.take()
            try:
                async with self._http().request(method, server.url + path, json=body, trace_request_ctx=gate) as resp:
                    gate.give_back()
                    try:
                        data = await resp.json(content_type=None)
                    except ValueError:
                        data = {"detail": (await resp.text())[:500]}
                    return resp.status, data
            finally:
                gate.give_back()

    # ---- jobs ---------------------------------------------------------------------------------------------------
    async def process(self, instance: dict[str, Any], sampling_params: dict[str, Any] | None = None, *,
                      job_id: str | None = None, timeout: float | None = None, raw: bool = False) -> Any:
        """Run one rollout; returns a :class:`~envhub.rollout.trajectory.Trajectory` (``raw=True``: the reply dict,
        with ProRL's ``timing``, ``critical_error``...). A failed rollout is a trajectory too (its
        ``finish_reason`` says why); only a refused request or unreachable servers raise."""
        import aiohttp

        job_id = job_id or self.new_job_id()
        body: dict[str, Any] = {"instance": instance, "sampling_params": dict(sampling_params or {}),
                                "job_id": job_id}
        if timeout is not None:
            body["timeout"] = timeout
        server = self.pick()
        errors: list[str] = []
        for attempt in range(self.retries + 1):
            target = server
            self._where[job_id] = target
            target.in_flight += 1
            target.sent += 1
            self.counts["sent"] += 1
            try:
                status, data = await self._call(target, "POST", "/process", body)
            except asyncio.CancelledError:  # the caller gave up on the job: do not leave it running on the server
                self._background(self.cancel(job_id))
                raise
            except aiohttp.ClientConnectorError as e:  # never reached the server: another one may take the job
                errors.append(f"{target.url}: {e}")
                target.down_until = time.monotonic() + min(5.0, self.backoff_s * 2 ** attempt)
                if len(self.servers) > 1:
                    server = self.pick(exclude={target})
                    self.counts["moved"] += server is not target
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:  # sent: the server may hold the job,
                errors.append(f"{target.url}: {type(e).__name__}: {e}")  # so the retry goes there (and joins it)
            else:
                if status == 200:
                    self._where.pop(job_id, None)
                    if raw:
                        return data
                    traj = _trajectory(data)
                    traj.details["server"] = target.url  # whose staleness gate admitted it (report discards there)
                    return traj
                detail = data.get("detail") if isinstance(data, dict) else data
                if status not in RETRY_STATUSES:
                    self._where.pop(job_id, None)
                    self.counts["failed"] += 1
                    raise RolloutClientError(f"{target.url}/process answered {status}: {detail}", status, detail)
                errors.append(f"{target.url}: HTTP {status}: {detail}")
                if len(self.servers) > 1:  # refused before admission: safe to go elsewhere
                    server = self.pick(exclude={target})
            finally:
                target.in_flight -= 1
            self.counts["retried"] += 1
            await asyncio.sleep(min(5.0, self.backoff_s * 2 ** attempt))
        self._where.pop(job_id, None)
        self.counts["failed"] += 1
        raise RolloutClientError(f"job {job_id} failed after {self.retries + 1} attempts: " + " | ".join(errors[-3:]))

    async def cancel(self, job_id: str) -> bool:
        """Cancel a job this client sent (its ``process`` call then returns a ``cancelled`` trajectory).
        False when the job is unknown to the server or already finished."""
        server = self._where.pop(job_id, None)
        targets = [server] if server is not None else self.servers
        for s in targets:
            try:
                status, data = await self._call(s, "POST", "/cancel", {"job_id": job_id})
            except Exception:
                continue
            if status == 200:
                return bool(data.get("cancelled"))
        return False

    # ---- server management (every server) -----------------------------------------------------------------------
    async def _all(self, method: str, path: str, body: Any = None) -> list[Any]:
        async def one(s: _Server) -> Any:
            status, data = await self._call(s, method, path, body)
            if status != 200:
                detail = data.get("detail") if isinstance(data, dict) else data
                raise RolloutClientError(f"{s.url}{path} answered {status}: {detail}", status, detail)
            return data

        return list(await asyncio.gather(*(one(s) for s in self.servers)))

    async def pause(self, mode: str = "hold", timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Stop sampling on every server for a weight update (``POST /pause``); returns once none samples. ``mode``:
        ``"hold"`` (calls in flight wait and continue under the new weights) or ``"abort"`` (they are re-sent as
        prompt + partial output after the resume). Rollouts never see either (``docs/async.md``)."""
        body: dict[str, Any] = {"mode": mode}
        if timeout_s is not None:
            body["timeout_s"] = timeout_s
        return await self._all("POST", "/pause", body)

    async def resume(self, version: int) -> list[dict[str, Any]]:
        """Let every server sample again, tagging later tokens ``version`` (``POST /resume``)."""
        return await self._all("POST", "/resume", {"version": int(version)})

    async def status(self) -> list[dict[str, Any]]:
        """``GET /status`` of every server."""
        return await self._all("GET", "/status")

    async def add_llm_server(self, address: str, api: str = "completions") -> list[dict[str, Any]]:
        """Add an LLM server (vLLM/SGLang URL, or ``"golden"``) to every rollout server's backend pool."""
        return await self._all("POST", "/add_llm_server", {"address": address, "api": api})

    async def clear_llm_server(self) -> list[dict[str, Any]]:
        return await self._all("POST", "/clear_llm_server")

    async def start(self) -> list[dict[str, Any]]:
        return await self._all("POST", "/start")

    async def report_staleness(self, *, server: str | None = None, **report: int) -> list[dict[str, Any]]:
        """The trainer's report to the staleness gate (``POST /staleness/report``): ``version=``, ``consumed=``,
        ``discarded=``. ``server``: only that one (discards belong to the server whose gate accepted the samples:
        ``traj.details["server"]``); else every server (a version)."""
        if server is None:
            return await self._all("POST", "/staleness/report", report)
        target = next((s for s in self.servers if s.url == server), None)
        if target is None:
            raise RolloutClientError(f"{server} is not one of this client's servers")
        status, data = await self._call(target, "POST", "/staleness/report", report)
        if status != 200:
            detail = data.get("detail") if isinstance(data, dict) else data
            raise RolloutClientError(f"{server}/staleness/report answered {status}: {detail}", status, detail)
        return [data]

    async def configure_staleness(self, **settings: Any) -> list[dict[str, Any]]:
        """Set every server's staleness gate (``POST /staleness``): ``max_staleness`` (eta; ``None``: unbounded),
        ``batch_size``, ``max_concurrent``, ``mode``, ``token_max_staleness``, ``replicas``, ``replica``,
        ``admission_timeout_s``. Returns each gate's status."""
        return await self._all("POST", "/staleness", settings)

    async def staleness(self) -> list[dict[str, Any]]:
        """Every server's staleness gate (``GET /staleness``)."""
        return await self._all("GET", "/staleness")

    async def trainer_step(self, phase: str, samples: int | dict[str, int] | None = None) -> list[dict[str, Any]]:
        """Tell every server a step boundary (``POST /trainer/step``), so its ``/status`` can say whether the trainer
        or the generator is the bottleneck: ``"begin"`` once the batch is in hand and compute starts, ``"end"`` once
        the step (weight broadcast included) is done, with the ``samples`` it trained on. Over several servers, pass
        ``{server url: samples from it}`` (``traj.details["server"]``); a plain count is split evenly."""
        if not isinstance(samples, dict):
            n = len(self.servers)
            samples = None if samples is None else {s.url: samples // n + (i < samples % n)
                                                    for i, s in enumerate(self.servers)}

        at = time.time()  # the boundary is now, however late a busy server reads the report

        async def one(s: _Server) -> Any:
            body: dict[str, Any] = {"phase": phase}
            if samples is not None:
                body["samples"] = int(samples.get(s.url, 0))
            status, data = await self._call(s, "POST", "/trainer/step", {**body, "at": at} if s.sends_at else body)
            if status == 422 and s.sends_at and "'at'" in str(data.get("detail") if isinstance(data, dict) else data):
                # an older server that knows no ``at``: send the report as it expects, timed on arrival from now on
                s.sends_at = False
                log.warning("%s does not take 'at' in step reports (an older envhub): its trainer idle ratio counts "
                            "the time a report takes to arrive", s.url)
                status, data = await self._call(s, "POST", "/trainer/step", body)
            if status != 200:
                detail = data.get("detail") if isinstance(data, dict) else data
                raise RolloutClientError(f"{s.url}/trainer/step answered {status}: {detail}", status, detail)
            return data

        return list(await asyncio.gather(*(one(s) for s in self.servers)))

    async def stop(self) -> list[dict[str, Any]]:
        return await self._all("POST", "/stop")


def _trajectory(data: dict[str, Any]) -> Any:
    from envhub.rollout.trajectory import Trajectory

    traj = Trajectory.from_dict(data)  # a ProRL-shaped reply: back to envhub's plain, untrimmed message log
    traj.details.setdefault("job_id", data.get("job_id"))
    for key in ("timing", "critical_error", "trajectory_id", "instance_id", "filter"):  # ProRL's extras, kept
        traj.details[key] = data.get(key)
    return traj
