"""The gateway's core: sessions, rewards and the weights' version over any :class:`~envhub.backends.base.LLMBackend`.

:class:`Gateway` is what the HTTP app (:mod:`envhub.gateway.app`), the harness envs and a Python caller hold: it
starts sessions (each admitted by the staleness gate), binds their keys, ends and drops them, and sets rewards. Serving
a model call -- finding the chain it extends, the exact-token splice, sampling, parsing -- is its other half,
:class:`~envhub.gateway.calls.CallServing` (:mod:`envhub.gateway.calls`), where :class:`ChatRequest`,
:class:`ChatResult`, :class:`UpstreamError` and :func:`tools_key` live (importable from here as before).
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from envhub.backends.base import LLMBackend
from envhub.backends.lifecycle import WeightLifecycle, lifecycle_of
from envhub.gateway.calls import ChatRequest, ChatResult, CallServing, OpeningCache, UpstreamError, tools_key
from envhub.gateway.messages import BadRequest
from envhub.gateway.records import CallRecord, Session, new_key
from envhub.rollout.staleness import Lease, NoCapacity, StalenessGate

__all__ = ["ChatRequest", "ChatResult", "Gateway", "UpstreamError", "tools_key"]
log = logging.getLogger(__name__)


class Gateway(CallServing):
    """Sessions and calls (the HTTP app in :mod:`envhub.gateway.app` is a thin layer over this).

    Args:
        backend: any :class:`LLMBackend`.
        tokenizer: the model's tokenizer (its chat template renders every prompt).
        parser: tool-call parser name (``"auto"``: from the template).
        max_model_len: prompt + completion budget, capped by the backend's own context when it knows it
            (:func:`~envhub.gateway.context.backend_context`); a longer prompt gets the provider's context-length
            error (400) before the backend is called.
        default_max_tokens: completion budget when the request names none.
        drift_every: compare a canonical rendering with the spliced prompt on every n-th spliced call (0: never;
            each is a full rendering of the call's context: :mod:`envhub.gateway.calls`).
        session_timeout_s: sessions idle this long are dropped when new ones start (AReaL: one hour).
        capacity: sessions granted at start (AReaL's ``/grant_capacity`` counter), as grants of the gate.
        gate: the :class:`~envhub.rollout.staleness.StalenessGate` every session is admitted by (a rollout service
            passes its own: one gate for jobs and sessions). Default: a gate with no bound, which only counts.
        system_tool_list: for a chat template that does not render tools (SmolLM2's), append the tool list to the
            system message. Off by default: vLLM's server then renders no tool definitions, and a policy must be
            trained on the prompts it will be served (docs/decisions.md, #28).

    Raises:
        NoCapacity: ``capacity`` sessions cannot be granted under ``gate``'s bounds.
    """

    def __init__(self, backend: LLMBackend, tokenizer: Any, *, parser: str = "auto", max_model_len: int = 32768,
                 default_max_tokens: int = 1024, drift_every: int = 64, session_timeout_s: float = 3600.0,
                 capacity: int | None = None, gate: StalenessGate | None = None, system_tool_list: bool = False):
        from envhub.gateway.context import backend_context

        self.backend, self.tokenizer, self.parser = backend, tokenizer, parser
        own = backend_context(backend)
        self.max_model_len = min(int(max_model_len), own) if own else int(max_model_len)
        self.default_max_tokens, self.system_tool_list = int(default_max_tokens), bool(system_tool_list)
        self.drift_every, self.session_timeout_s = int(drift_every), float(session_timeout_s)
        self.gate = gate if gate is not None else StalenessGate()
        self.leases: dict[str, tuple[Lease, bool]] = {}  # session id -> (its admission, released by the gateway)
        if capacity:
            self.gate.grant(capacity)
        self.sessions: dict[str, Session] = {}
        self.keys: dict[str, str] = {}
        self.stats = {"calls": 0, "spliced": 0, "new_chains": 0, "errors": 0, "drift_checks": 0, "drift": 0}
        self.openings = OpeningCache()  # a chain's opening, rendered once per distinct (tools, messages)
        self.codecs: dict[str, Any] = {}  # tools key -> its shared ChatCodec
        self.prepare_memo = True  # prepare only a request's new messages (CallServing._prepared)

    # ---- weights ------------------------------------------------------------------------------------------------
    @property
    def lifecycle(self) -> WeightLifecycle:
        """The backend's weight-update lifecycle (:mod:`envhub.backends.lifecycle`): ``pause`` / ``resume``; every
        sampled token is tagged with the version that sampled it."""
        return lifecycle_of(self.backend)

    @property
    def policy_version(self) -> int:
        """The version of the weights sampling now (the lifecycle's). Setting it is AReaL's ``set_version``: a bump
        with nothing sampling; :class:`~envhub.backends.lifecycle.LifecycleError` if the version goes backwards or
        calls are sampling (pause first)."""
        return self.lifecycle.version

    @policy_version.setter
    def policy_version(self, version: int) -> None:
        """AReaL's ``set_version``: a bump with nothing sampling (refused if it goes backwards or would mislabel
        tokens being sampled: pause first)."""
        self.lifecycle.set_version(version)

    # ---- sessions ---------------------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        """Sessions granted and not yet started (AReaL's ``/grant_capacity`` counter)."""
        return len(self.gate.granted)

    def grant(self, n: int = 1) -> int:
        """Admit ``n`` sessions ahead of their start (AReaL's ``/grant_capacity``); each later
        :meth:`start_session` without a ``lease`` spends one.

        Args:
            n: how many sessions to admit: all of them or none.

        Returns:
            The sessions now granted and not yet started (all of them, not only these ``n``).

        Raises:
            NoCapacity: the gate has no room for all ``n`` (nothing is granted; HTTP 429).
        """
        return self.gate.grant(n)

    def start_session(self, task_id: str = "", *, task: Any = None, api_key: str | None = None,
                      session_id: str | None = None, lease: Lease | None = None,
                      granted_only: bool = False) -> Session:
        """Start a session, admitted by the gate (sessions idle past ``session_timeout_s`` are dropped first).

        Args:
            task_id: the task it plays: the trajectories' ``task_id``, and the stem of a generated ``session_id``
                (``"{task_id}-{i}"``; ``"session-{i}"`` without one).
            task: the task row, handed to a scripted backend's policy.
            api_key: the key its client will send (default: a new random one). A key bound to an ended session is
                taken over.
            session_id: its id (default: generated as above).
            lease: the caller's admission (e.g. the rollout job a harness episode runs in): the caller releases it,
                and :meth:`end_session` then reports nothing to the gate. Without one, the session spends a granted
                lease (:meth:`grant`), else takes a new one if the gate has room.
            granted_only: AReaL's ``/rl/start_session``: with a gate that bounds nothing, only a grant admits, as on
                AReaL's proxy (a bounded gate admits by its rule either way).

        Returns:
            The new :class:`~envhub.gateway.records.Session`; its ``api_key`` is what the client authenticates with.

        Raises:
            BadRequest: ``api_key`` is bound to a session that has not ended, or ``session_id`` exists (status 409).
            NoCapacity: no grant is left and the gate has no room (HTTP 429).
        """
        self._sweep()
        if api_key is not None and api_key in self.keys:
            old = self.sessions.get(self.keys[api_key])
            if old is not None and not old.ended:
                raise BadRequest(f"API key is already bound to active session {old.session_id}", status=409)
            self.keys.pop(api_key, None)
        if session_id is None:
            i = 0
            while (session_id := f"{task_id or 'session'}-{i}") in self.sessions:
                i += 1
        elif session_id in self.sessions:
            raise BadRequest(f"session {session_id!r} exists", status=409)
        owned = lease is None
        if lease is None:  # every session is admitted, whichever route starts it (AReaL#1481)
            lease = self.gate.claim()
            if lease is None:
                if granted_only and not self.gate.bounded:
                    raise NoCapacity("No available capacity to start a new session (POST /grant_capacity first)")
                lease = self.gate.acquire_now("session")
        key = api_key or new_key()
        session = Session(session_id, key, task_id=task_id, task=task, ended_event=asyncio.Event(),
                          lock=asyncio.Lock())
        self.sessions[session_id], self.keys[key] = session, session_id
        self.leases[session_id] = (lease, owned)
        return session

    def session_for_key(self, key: str) -> Session | None:
        """The session a client's API key is bound to.

        Args:
            key: the key the client sent.

        Returns:
            Its :class:`~envhub.gateway.records.Session` (an ended one too, until it is dropped), or ``None`` for a
            key bound to none.
        """
        sid = self.keys.get(key)
        return self.sessions.get(sid) if sid is not None else None

    def end_session(self, session: Session) -> None:
        """End a session: later calls on it are refused (410), and whatever waits for its end (an export) goes on.

        When the gateway admitted the session (no caller's ``lease``), the gate learns its outcome: ``ok`` when a
        call finished and none failed upstream or was aborted; a session the gate calls stale is flagged
        ``stale_withheld`` or ``stale_dropped``. The backend's per-session state, if it opened any, is closed. The
        session and its calls stay in the gateway for the builders until :meth:`drop_session`.

        Args:
            session: the session to end.
        """
        entry = self.leases.pop(session.session_id, None)
        if entry is not None and entry[1]:  # the gate learns the outcome; a stale session is marked, not trained
            ok = any(c.ok for c in session.calls) and not {"upstream_failure", "aborted_call"} & set(session.flags)
            verdict = self.gate.finish(entry[0], ok=ok)["verdict"]
            if verdict in ("withheld", "dropped"):
                session.flag(f"stale_{verdict}")
        session.ended = True
        if session.ended_event is not None:
            _set_from_any_thread(session.ended_event)
        if session.backend_codec is not None:
            (session.backend or self.backend).close_session(session.session_id)

    def drop_session(self, session: Session) -> None:
        """Forget a session, ending it first (:meth:`end_session`) if it has not ended: its record and its key go.

        Args:
            session: the session to drop (build its trajectories first: :func:`~envhub.gateway.builders.build`).
        """
        if not session.ended:
            self.end_session(session)
        self.sessions.pop(session.session_id, None)
        if self.keys.get(session.api_key) == session.session_id:  # a later session may have taken the key over
            del self.keys[session.api_key]

    def _sweep(self) -> None:
        now = time.monotonic()
        for s in [s for s in self.sessions.values() if now - s.last_access > self.session_timeout_s]:
            log.info("gateway: dropping session %s, idle for %.0f s", s.session_id, now - s.last_access)
            self.drop_session(s)

    def set_reward(self, session: Session, reward: float, call_id: str | None = None) -> CallRecord:
        """Set the reward of one call (AReaL's ``set_reward``); the builders turn it into trajectory rewards.

        Args:
            session: the session the call belongs to.
            reward: a finite number (a ``bool`` is refused).
            call_id: the call, by the id its client saw (``chatcmpl-...``, ``resp_...``, ``msg_...``); ``None``: the
                session's last finished call, i.e. the episode's outcome.

        Returns:
            The :class:`~envhub.gateway.records.CallRecord` that now holds the reward.

        Raises:
            BadRequest: ``reward`` is not a finite number; ``call_id`` is None and no call has finished; no call of
                the session has ``call_id``, or that call did not finish (its reward would be lost).
        """
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise BadRequest(f"reward must be a finite number, got {reward!r}", param="reward")
        done = [c for c in session.calls if c.ok]
        if call_id is None:
            if not done:
                raise BadRequest("no interactions in session")
            call = done[-1]
        else:
            found = session.by_id.get(call_id)
            if found is None:
                raise BadRequest(f"interaction {call_id} not found")
            if not found.ok:  # the builders train on finished calls only: a 200 here would drop the reward silently
                raise BadRequest(f"interaction {call_id} did not finish ({found.error or 'no reply'}): no trajectory "
                                 "is built from it, so its reward would be lost; set the reward on a finished call")
            call = found
        call.reward = float(reward)
        return call


def _set_from_any_thread(event: asyncio.Event) -> None:
    """Set ``event`` from whichever thread ends a session. ``asyncio.Event.set`` is not thread-safe: called from
    another thread than the loop its waiter runs on (the app's export wait, on ``GatewayThread``'s loop), it wakes
    that loop late or, in asyncio debug mode, raises. Such a set goes through ``call_soon_threadsafe``."""
    loop = getattr(event, "_loop", None)  # bound by the first waiter (asyncio's _LoopBoundMixin); None: no waiter
    try:
        current = asyncio.get_running_loop()
    except RuntimeError:
        current = None
    if loop is not None and loop is not current and loop.is_running():
        loop.call_soon_threadsafe(event.set)
    else:
        event.set()
