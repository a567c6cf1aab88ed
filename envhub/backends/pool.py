"""``BackendPool``: many LLM backends behind one, balanced per session, sticky, and tolerant of failures.

The pool is itself an :class:`~envhub.backends.base.LLMBackend`, so the executor does not know it is talking to one::

    pool = BackendPool([OpenAIBackend("http://10.0.0.1:8000"), OpenAIBackend("http://10.0.0.2:8000")])
    gen = await pool.generate(prompt_ids, params, session_id="rollout-17")

Routing (the ProRL Agent scheme):

* **Least loaded first.** A session (one rollout) is assigned to the backend with the fewest sessions assigned right
  now, taken from a min-heap keyed by ``(assigned, ticket)``; the ticket is a counter, so among equally loaded
  backends the one that waited longest goes first (round robin on ties).
* **Sticky.** Every later turn of that session goes to the same backend: its prompt is the previous prompt plus a few
  tokens, so the server's prefix cache already holds almost all of it.
* **Elastic.** :meth:`add`, :meth:`remove` and :meth:`clear` work while rollouts run (a trainer swaps servers after a
  weight update). A removed backend takes no new sessions; its sessions move to another backend at their next turn
  (or, with ``drain=True``, finish where they are). With no backend at all, ``generate`` waits up to
  ``wait_timeout`` seconds for one to be added instead of failing the rollout.
* **Failover.** A backend whose ``generate`` raises :class:`BackendError` or a connection error is marked down; the
  session that saw the failure retries on another backend at once, and the failed backend's other sessions move
  at their next turn. A down backend is tried again after ``revive_after`` seconds (``None``: never, until re-added).
  Other exceptions (bad input, a policy that raised) are not the backend's fault and pass through unchanged.

When a session moves, the new backend gets the same ``open_session`` call the first one got (the scripted backend
needs the task and the live conversation), and the old one gets ``close_session``.

Everything runs on the caller's event loop and no method awaits while it edits the pool's state, so no lock is needed.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import time
from dataclasses import dataclass
from typing import Any

from envhub.backends.base import BackendError, Generation, LLMBackend, SamplingParams
from envhub.backends.lifecycle import PausedTooLong, generate_tagged, lifecycle_of

FAILOVER_ERRORS: tuple[type[BaseException], ...] = (BackendError, ConnectionError, TimeoutError, asyncio.TimeoutError)
"""Errors that mean "this backend is unwell", so the pool moves the session elsewhere. Not every ``OSError``: a
policy that fails to read a file is a bug to report, not a server to abandon. (``asyncio.TimeoutError`` is
``TimeoutError`` from Python 3.11 on, listed for 3.10; the HTTP backends wrap transport errors in ``BackendError``.)"""

log = logging.getLogger(__name__)


@dataclass
class _Member:
    name: str
    backend: LLMBackend
    assigned: int = 0  # sessions pinned here now
    version: int = -1  # renewed whenever `assigned` changes; heap entries with another version are stale
    healthy: bool = True
    down_since: float = 0.0
    removed: bool = False  # out of the pool: takes no new sessions
    draining: bool = False  # removed, but its sessions finish here
    in_flight: int = 0
    requests: int = 0
    failures: int = 0
    last_error: str | None = None

    def eligible(self, now: float, revive_after: float | None) -> bool:
        if self.removed:
            return False
        if not self.healthy and revive_after is not None and now - self.down_since >= revive_after:
            self.healthy = True  # half-open: give it another chance; one more failure marks it down again
        return self.healthy


@dataclass
class _Session:
    member: _Member | None
    kwargs: dict[str, Any] | None = None  # what open_session got, replayed on a move; None: never opened


class BackendPool(LLMBackend):
    """Balances sessions over backends (see the module docstring).

    Args:
        backends: initial backends, a list (named ``<backend.name>-<i>``) or a ``{name: backend}`` dict.
        revive_after: seconds after which a down backend is tried again; ``None`` keeps it down.
        wait_timeout: how long ``generate`` waits for a backend to be added when none is available.
        max_attempts: how many backends one ``generate`` tries before giving up (default: all of them).
    """

    name = "pool"
    samples_under_lifecycle = True  # its members' calls go through generate_tagged, under the pool's lifecycle

    def __init__(self, backends: Any = None, *, revive_after: float | None = 30.0, wait_timeout: float = 60.0,
                 max_attempts: int | None = None):
        self.revive_after = revive_after
        self.wait_timeout = wait_timeout
        self.max_attempts = max_attempts
        self._members: dict[str, _Member] = {}
        self._heap: list[tuple[int, int, int, str]] = []  # (assigned, ticket, version, name)
        self._tickets = itertools.count()
        self._sessions: dict[str, _Session] = {}
        self._retired: list[LLMBackend] = []  # removed backends, closed with the pool
        # ``observer.model_call(name, seconds, tokens)`` after each answered call (the rollout service's
        # envhub.rollout.throughput.Throughput: model-call times and tokens/s per backend); None: nothing is timed
        self.observer: Any = None
        items = backends.items() if isinstance(backends, dict) else ((None, b) for b in backends or [])
        for name, backend in items:
            self.add(backend, name=name)

    # ---- membership -------------------------------------------------------------------------------------------
    def add(self, backend: LLMBackend, *, name: str | None = None) -> str:
        """Add ``backend`` (usable at once, also by running rollouts) and return its name in the pool.

        Adding the same backend object again under its name revives it (marks it healthy) and is otherwise a no-op.
        """
        if name is None:
            name = getattr(backend, "address", None) or f"{backend.name}-{len(self._members) + len(self._retired)}"
            base, i = name, 1
            while name in self._members and self._members[name].backend is not backend:
                name, i = f"{base}#{i}", i + 1
        member = self._members.get(name)
        if member is not None:
            if member.backend is not backend:
                raise ValueError(f"a different backend is already in the pool as {name!r}; remove it first")
            member.healthy, member.last_error = True, None
            return name
        shared, own = lifecycle_of(self), getattr(backend, "lifecycle", None)
        if own is not None and own is not shared:
            for engine in own.engines:  # a server paused by its own routes (vllm-rl+): the pool's pause reaches it
                if engine not in shared.engines:
                    shared.add_engine(engine)
        backend.lifecycle = shared  # type: ignore[attr-defined]  # one policy: one version, one pause
        member = _Member(name, backend)
        self._members[name] = member
        self._push(member)
        return name

    def remove(self, backend: LLMBackend | str, *, drain: bool = False) -> LLMBackend:
        """Take a backend out of the pool and return it. It gets no new sessions. Its sessions move to another
        backend at their next turn, or with ``drain=True`` finish on it. The pool closes it in :meth:`close`."""
        member = self._find(backend)
        del self._members[member.name]
        member.removed, member.draining = True, drain
        self._retired.append(member.backend)
        return member.backend

    def clear(self, *, drain: bool = False) -> list[LLMBackend]:
        """Remove every backend (see :meth:`remove`). Running rollouts wait for the next :meth:`add`."""
        return [self.remove(name, drain=drain) for name in list(self._members)]

    def mark_down(self, backend: LLMBackend | str, error: str = "marked down") -> None:
        """Mark a backend unhealthy by hand (a health probe failed): its sessions move at their next turn."""
        self._down(self._find(backend), error)

    @property
    def backends(self) -> dict[str, LLMBackend]:
        return {name: m.backend for name, m in self._members.items()}

    def status(self) -> dict[str, Any]:
        """What the rollout service's ``GET /status`` shows: every backend's load and health."""
        now = time.monotonic()
        return {
            "backends": [
                {
                    "name": m.name,
                    "type": m.backend.name,
                    "assigned": m.assigned,
                    "in_flight": m.in_flight,
                    "healthy": m.eligible(now, self.revive_after),
                    "requests": m.requests,
                    "failures": m.failures,
                    "last_error": m.last_error,
                }
                for m in self._members.values()
            ],
            "sessions": len(self._sessions),
            "draining": sum(1 for s in self._sessions.values() if s.member is not None and s.member.draining),
        }

    # ---- sessions ---------------------------------------------------------------------------------------------
    def open_session(self, session_id: str, *, task: Any = None, messages: list | None = None, codec: Any = None) -> None:
        """Pin ``session_id`` to the least loaded backend now (if any; else at its first ``generate``)."""
        if session_id in self._sessions:
            self.close_session(session_id)
        session = _Session(None, {"task": task, "messages": messages, "codec": codec})
        self._sessions[session_id] = session
        member = self._pick()
        if member is not None:
            self._bind(session_id, session, member)

    def close_session(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None and session.member is not None:
            self._unbind(session_id, session)

    def assignment(self, session_id: str) -> str | None:
        """The name of the backend ``session_id``'s next turn goes to; ``None`` when it is not pinned, or pinned to a
        backend that was removed or went down (it moves at its next turn)."""
        session = self._sessions.get(session_id)
        if session is None or session.member is None or not self._usable_for_session(session.member):
            return None
        return session.member.name

    # ---- generation -------------------------------------------------------------------------------------------
    async def generate(self, prompt_ids: list[int], params: SamplingParams, *, session_id: str = "") -> Generation:
        """Generate on the session's backend; on a backend failure, move the session and retry elsewhere."""
        session = self._sessions.get(session_id)
        ephemeral = session is None  # a call outside any session: balanced, not pinned, released afterwards
        if ephemeral:
            session = _Session(None)
            if session_id:  # an unknown but named session: pin it from now on
                self._sessions[session_id] = session
                ephemeral = False
        attempts, errors = 0, []
        try:
            while True:
                member = session.member
                if member is None or not self._usable_for_session(member):
                    if member is not None:
                        self._unbind(session_id, session)
                    member = await self._wait_pick()
                    self._bind(session_id, session, member)
                member.in_flight += 1
                member.requests += 1
                try:
                    if self.observer is None:
                        return await generate_tagged(member.backend, prompt_ids, params, session_id=session_id)
                    t0 = time.monotonic()
                    gen = await generate_tagged(member.backend, prompt_ids, params, session_id=session_id)
                    self.observer.model_call(member.name, time.monotonic() - t0, len(gen.token_ids))
                    return gen
                except PausedTooLong:
                    raise  # the trainer never resumed: not this backend's fault, and no other would do better
                except FAILOVER_ERRORS as e:
                    attempts += 1
                    errors.append(f"{member.name}: {e}")
                    self._down(member, f"{type(e).__name__}: {e}")
                    if attempts >= (self.max_attempts or max(1, len(self._members))):
                        raise BackendError(f"generate failed on {attempts} backend(s): " + "; ".join(errors)) from e
                finally:
                    member.in_flight -= 1
        finally:
            if ephemeral and session.member is not None:
                self._unbind(session_id, session)

    async def close(self) -> None:
        """Close every backend the pool holds or held."""
        backends = [m.backend for m in self._members.values()] + self._retired
        self._members.clear()
        self._heap.clear()
        self._retired = []
        for b in {id(b): b for b in backends}.values():
            await b.close()

    # ---- internals --------------------------------------------------------------------------------------------
    def _find(self, backend: LLMBackend | str) -> _Member:
        if isinstance(backend, str):
            if backend in self._members:
                return self._members[backend]
        else:
            for m in self._members.values():
                if m.backend is backend:
                    return m
        raise KeyError(f"no such backend in the pool: {backend!r} (have {sorted(self._members)})")

    def _usable_for_session(self, member: _Member) -> bool:
        if member.removed:
            return member.draining and member.healthy
        return member.eligible(time.monotonic(), self.revive_after)

    def _push(self, member: _Member) -> None:
        # versions come from the pool-wide counter, so a stale entry of a removed backend can never match a new
        # backend added later under the same name
        member.version = next(self._tickets)
        heapq.heappush(self._heap, (member.assigned, next(self._tickets), member.version, member.name))
        if len(self._heap) > 4 * len(self._members) + 64:  # drop stale entries now and then
            self._heap = [(m.assigned, next(self._tickets), m.version, m.name) for m in self._members.values()]
            heapq.heapify(self._heap)

    def _pick(self) -> _Member | None:
        """Pop the least loaded eligible backend, or ``None``. Down backends found on the way are set aside and
        pushed back, so they are found again when they revive. The caller must :meth:`_bind` what it gets."""
        now, skipped, found = time.monotonic(), [], None
        while self._heap:
            assigned, _, version, name = heapq.heappop(self._heap)
            member = self._members.get(name)
            if member is None or member.version != version:
                continue  # stale entry
            if member.eligible(now, self.revive_after):
                found = member
                break
            skipped.append(member)
        for member in skipped:
            self._push(member)
        return found  # the caller binds it, which pushes it back with its new count

    async def _wait_pick(self) -> _Member:
        member = self._pick()
        if member is not None:
            return member
        deadline = time.monotonic() + self.wait_timeout
        # poll rather than wait on an asyncio.Event: the pool may outlive one event loop (tests, notebooks)
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            member = self._pick()
            if member is not None:
                return member
        down = [f"{m.name}: {m.last_error}" for m in self._members.values() if not m.healthy]
        raise BackendError(
            f"no healthy backend after waiting {self.wait_timeout:g}s"
            + (f" (down: {'; '.join(down)})" if down else " (the pool is empty: add a backend)")
        )

    def _bind(self, session_id: str, session: _Session, member: _Member) -> None:
        session.member = member
        member.assigned += 1
        if not member.removed:
            self._push(member)
        if session.kwargs is not None:
            member.backend.open_session(session_id, **session.kwargs)

    def _unbind(self, session_id: str, session: _Session) -> None:
        member, session.member = session.member, None
        member.assigned -= 1
        if not member.removed:
            self._push(member)
        if session.kwargs is None:
            return
        try:
            member.backend.close_session(session_id)
        except Exception:  # a dying backend must not stop the session from moving on
            log.warning("backend %r: close_session(%s) raised", member.backend, session_id, exc_info=True)

    def _down(self, member: _Member, error: str) -> None:
        member.healthy = False
        member.down_since = time.monotonic()
        member.failures += 1
        member.last_error = error
