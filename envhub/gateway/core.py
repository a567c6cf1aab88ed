"""The gateway's core: sessions, exact-token calls to any :class:`~envhub.backends.base.LLMBackend`, rewards.

Dialects (:mod:`envhub.gateway.dialects`) turn a provider request into a :class:`ChatRequest`; :meth:`Gateway.complete`
does the rest and returns a :class:`ChatResult` the dialect turns back into the provider's reply. The gateway owns
rendering and tokenization with the model's real chat template (:class:`~envhub.codec.chat.ChatCodec`), so every
backend works behind it, scripted and transformers included.

**Exact tokens by construction.** When a request extends an earlier call (:func:`envhub.gateway.matching.resolve`),
the backend is given ``parent prompt ids + the ids sampled then + the delta rendering of the new messages``
(``ChatCodec.delta_ids``): the model's own earlier output is never re-tokenized, so the context it is conditioned
on is exactly the context a trainer recomputes. Anything else is rendered canonically and opens a new chain, with
the reason recorded on the call. Every ``drift_every``-th spliced call is also rendered canonically and compared:
``stats["drift"] / stats["drift_checks"]`` is how often a re-rendering gateway would have fed the model other
tokens than it sampled (the drift this design removes).
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from envhub.backends.base import LLMBackend, SamplingParams
from envhub.backends.lifecycle import WeightLifecycle, generate_tagged, lifecycle_of
from envhub.gateway.matching import resolve
from envhub.gateway.messages import BadRequest, ContextLengthExceeded, prepare
from envhub.gateway.records import CallRecord, Session, new_id, new_key
from envhub.rollout.staleness import Lease, NoCapacity, StalenessGate

log = logging.getLogger(__name__)


class UpstreamError(RuntimeError):
    """The backend failed during a call: the client gets a 502 in its provider's shape; the session is marked."""


@dataclass
class ChatRequest:
    """A model call in the gateway's own terms (what every dialect translates to).

    Attributes:
        dialect: the provider API it came in on: ``"chat"`` (OpenAI chat completions), ``"responses"`` (OpenAI
            Responses) or ``"anthropic"`` (Anthropic Messages); it picks the prefix of the call's id.
        messages: the conversation as OpenAI chat messages (made renderable by
            :func:`~envhub.gateway.messages.prepare` when the call is served).
        tools: OpenAI function tools, or ``None``: they pick the chat codec, and a call extends only a chain with the
            same tools.
        params: the sampling parameters; :meth:`Gateway.complete` sets ``max_tokens`` on this object.
        max_tokens_given: whether the client named a completion budget (else the gateway's ``default_max_tokens``).
        stream: whether the client asked for a streamed reply (the app's and the dialect's concern, not the call's).
        model: the model name the client sent, echoed in the reply (``"envhub"`` when empty).
    """

    dialect: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None       # OpenAI function tools
    params: SamplingParams = field(default_factory=SamplingParams)
    max_tokens_given: bool = False
    stream: bool = False
    model: str = ""


@dataclass
class ChatResult:
    """What :meth:`Gateway.complete` returns: the dialect turns it into the provider's reply.

    Attributes:
        call: the call's record in the session (prompt ids, sampled ids, logprobs, versions, the chain's parent).
        text: the reply's text content (``""`` when the model only called tools).
        tool_calls: the parsed tool calls as OpenAI tool calls, their ids minted by the gateway.
        finish_reason: ``"length"`` when the completion budget cut the reply, else ``"tool_calls"`` when it has tool
            calls, else ``"stop"``.
    """

    call: CallRecord
    text: str
    tool_calls: list[dict[str, Any]]                # OpenAI tool calls, ids minted by the gateway
    finish_reason: str                              # "stop" | "length" | "tool_calls"

    @property
    def prompt_tokens(self) -> int:
        """Tokens in the prompt the backend was given (``len(call.prompt_ids)``)."""
        return len(self.call.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        """Tokens the model sampled (``len(call.sampled_ids)``)."""
        return len(self.call.sampled_ids)


class Gateway:
    """Sessions and calls (the HTTP app in :mod:`envhub.gateway.app` is a thin layer over this).

    Args:
        backend: any :class:`LLMBackend`.
        tokenizer: the model's tokenizer (its chat template renders every prompt).
        parser: tool-call parser name (``"auto"``: from the template).
        max_model_len: prompt + completion budget, capped by the backend's own context when it knows it
            (:func:`~envhub.gateway.context.backend_context`); a longer prompt gets the provider's context-length
            error (400) before the backend is called.
        default_max_tokens: completion budget when the request names none.
        drift_every: compare a canonical rendering with the spliced prompt on every n-th spliced call (0: never).
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
                 default_max_tokens: int = 1024, drift_every: int = 8, session_timeout_s: float = 3600.0,
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

    # ---- calls ------------------------------------------------------------------------------------------------
    def codec_for(self, tools: list[dict[str, Any]] | None, k: str | None = None) -> Any:
        """The chat codec for a tool set: the one shared per tokenizer, tools and parser (bounded,
        :meth:`ChatCodec.shared`).

        Args:
            tools: OpenAI function tools (``None`` or empty: none).
            k: not read (callers pass the tools' :func:`tools_key`).

        Returns:
            A :class:`~envhub.codec.chat.ChatCodec` for the gateway's tokenizer and ``parser``.
        """
        from envhub.codec.chat import ChatCodec

        return ChatCodec.shared(self.tokenizer, tools=tools or None, parser=self.parser)

    def count_tokens(self, req: ChatRequest) -> int:
        """The length of the prompt ``req`` would open a new chain with (its canonical rendering; Anthropic's
        ``count_tokens`` route). Records nothing.

        Args:
            req: the request (its messages and tools are read).

        Returns:
            The number of prompt token ids.

        Raises:
            BadRequest: malformed messages (:func:`~envhub.gateway.messages.prepare`), or a conversation the chat
                template cannot render (as in :meth:`complete`: the client's request, a 400, not a server error).
        """
        from envhub.codec.chat import ChatTemplateError

        codec = self.codec_for(req.tools)
        try:
            return len(codec.prompt_ids(self._opening(codec, prepare(req.messages))))
        except ChatTemplateError as e:
            raise BadRequest(f"the model's chat template cannot render this conversation: {e}") from e

    async def complete(self, session: Session, req: ChatRequest) -> ChatResult:
        """Serve one model call: find the chain it extends, build its prompt ids, sample, parse, record.

        The call is recorded on the session before the backend is called, so a failed call is kept with its error.
        ``req.params.max_tokens`` is set to the request's budget (``default_max_tokens`` when it named none), capped
        by the room ``max_model_len`` leaves after the prompt.

        Args:
            session: the session the client's key is bound to.
            req: the call, as a dialect translated it.

        Returns:
            A :class:`ChatResult`: the call's record, the reply's text, its tool calls (ids minted here), its finish
            reason.

        Raises:
            BadRequest: the session has ended (410); its call budget ``max_calls`` is spent (403,
                ``call_budget_exhausted``; the session is flagged so); malformed messages, or a conversation the
                chat template cannot render (400).
            ContextLengthExceeded: the prompt leaves no room in ``max_model_len`` (400; no backend call is made).
            UpstreamError: the backend failed (502); the call keeps the error and the session is flagged
                ``upstream_failure``.
            asyncio.CancelledError: the client went away mid-call; the session is flagged ``aborted_call``.
        """
        from envhub.codec.chat import ChatTemplateError

        if session.ended:
            raise BadRequest(f"session {session.session_id} already ended", status=410)
        session.touch()
        if session.max_calls is not None and len(session.calls) >= session.max_calls:
            session.flag("call_budget_exhausted")
            # 403, not 429 or 400: clients retry those with backoff until their own patience runs out (litellm
            # retries even a 400); a permission error is final for every client probed
            raise BadRequest(f"this session's budget of {session.max_calls} model calls is spent; the episode is "
                             "over", status=403, code="call_budget_exhausted")
        messages = prepare(req.messages)
        tk = tools_key(req.tools)
        codec = self.codec_for(req.tools, tk)
        parent, reason = resolve(session, messages, tk)
        try:
            if parent is not None:
                new = messages[len(parent.request) + 1:]
                context = parent.context + [parent.reply] + new
                prompt = self.splice(codec, parent, new)
            else:
                context = self._opening(codec, messages)
                prompt = codec.prompt_ids(context)
        except ChatTemplateError as e:
            raise BadRequest(f"the model's chat template cannot render this conversation: {e}") from e
        room = self.max_model_len - len(prompt)
        if room <= 0:  # before any backend call: the client must shorten its history, not retry
            raise ContextLengthExceeded(len(prompt), self.max_model_len)
        params = req.params
        params.max_tokens = min(params.max_tokens if req.max_tokens_given else self.default_max_tokens, room)
        call = CallRecord(call_id=new_id(_ID_PREFIX.get(req.dialect, "call-")), dialect=req.dialect,
                          prompt_ids=prompt, request=messages, context=context, tools_key=tk,
                          parent=parent.call_id if parent else None, break_reason=reason,
                          policy_version=self.policy_version, has_tools=bool(req.tools))
        session.add(call)
        self.stats["calls"] += 1
        self.stats["spliced" if parent else "new_chains"] += 1
        if parent is not None and self.drift_every and self.stats["spliced"] % self.drift_every == 1 % self.drift_every:
            self.stats["drift_checks"] += 1
            call.drift = codec.prompt_ids(context) != prompt
            self.stats["drift"] += int(call.drift)
        try:
            gen = await self._generate(session, codec, call, params)
        except asyncio.CancelledError:
            call.error, call.finish_reason = "cancelled: the client went away", "error"
            session.flag("aborted_call")
            raise
        except Exception as e:
            self.stats["errors"] += 1
            call.error, call.finish_reason = f"{type(e).__name__}: {e}", "error"
            session.flag("upstream_failure")
            log.warning("gateway: backend failed on %s/%s", session.session_id, call.call_id, exc_info=True)
            raise UpstreamError(f"the model backend failed: {type(e).__name__}: {e}") from e
        msg, _ = codec.assistant_message(gen.token_ids, stop=params.stop or None)
        calls = []
        for c in msg.get("tool_calls") or []:
            c = dict(c, id=new_id("call_"))
            session.issued_tool_ids[c["id"]] = call
            calls.append(c)
        reply: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
        if calls:
            reply["tool_calls"] = calls
        call.sampled_ids, call.logprobs = list(gen.token_ids), list(gen.logprobs)
        call.versions = list(gen.versions or [call.policy_version] * len(gen.token_ids))
        if call.versions:
            call.policy_version = min(call.versions)
        call.finish_reason = "length" if gen.finish_reason == "length" else ("tool_calls" if calls else "stop")
        call.reply = reply
        if len({v for c in session.calls if c.ok for v in c.versions}) > 1:
            session.flag("mixed_policy_versions")
        return ChatResult(call, reply["content"], calls, call.finish_reason)

    @staticmethod
    def splice(codec: Any, parent: CallRecord, new: list[dict[str, Any]]) -> list[int]:
        """The prompt of a call that extends ``parent`` with ``new`` messages: the parent's prompt ids, the ids it
        sampled (as sampled: never decoded and re-encoded), then the delta rendering of ``new`` (which closes the
        parent's turn when the model did not sample its end-of-turn token).

        Args:
            codec: the call's :class:`~envhub.codec.chat.ChatCodec`.
            parent: the finished call being extended.
            new: the messages after the parent's reply (tool results, the next user turn).

        Returns:
            The prompt ids.
        """
        history = parent.context + [parent.reply]
        return parent.prompt_ids + parent.sampled_ids + codec.delta_ids(
            history, new, sampled_eos=codec.ends_turn(parent.sampled_ids))

    def _opening(self, codec: Any, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        note = codec.tool_prompt() if self.system_tool_list else None
        if not note:
            return messages
        from envhub.codec.messages import with_system_note

        return with_system_note(messages, note)

    async def _generate(self, session: Session, codec: Any, call: CallRecord, params: SamplingParams) -> Any:
        backend = session.backend or self.backend
        if getattr(backend, "name", "") != "scripted":
            if session.backend_codec is None:
                session.backend_codec = codec
                backend.open_session(session.session_id, task=session.task, messages=session.live, codec=codec)
            return await generate_tagged(backend, call.prompt_ids, params, session_id=session.session_id)
        # a scripted policy reads the conversation: one call at a time per session, with this call's context
        assert session.lock is not None
        async with session.lock:
            if session.backend_codec is not codec:
                session.backend_codec = codec
                backend.open_session(session.session_id, task=session.task, messages=session.live, codec=codec)
            session.live[:] = call.context
            return await generate_tagged(backend, call.prompt_ids, params, session_id=session.session_id)


_ID_PREFIX = {"chat": "chatcmpl-", "responses": "resp_", "anthropic": "msg_"}


def tools_key(tools: list[dict[str, Any]] | None) -> str:
    """The tools as rendered: JSON in the request's own key order (never sorted: a template that ``tojson``s a tool
    renders its keys in that order, and the trajectory stores this string for the fidelity check to re-render).

    Args:
        tools: OpenAI function tools, or ``None``.

    Returns:
        The JSON string (``"[]"`` for no tools).
    """
    return json.dumps(tools or [], ensure_ascii=False)


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
