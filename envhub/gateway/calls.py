"""Serving one model call: :class:`ChatRequest` in, :class:`ChatResult` out (:meth:`CallServing.complete`, the half of
:class:`~envhub.gateway.core.Gateway` that talks to the backend; the other half, sessions and rewards, is
:mod:`envhub.gateway.core`).

Dialects (:mod:`envhub.gateway.dialects`) turn a provider request into a :class:`ChatRequest`; :meth:`complete
<CallServing.complete>` does the rest and returns a :class:`ChatResult` the dialect turns back into the provider's
reply. The gateway owns rendering and tokenization with the model's real chat template
(:class:`~envhub.codec.chat.ChatCodec`), so every backend works behind it, scripted and transformers included.

**Exact tokens by construction.** When a request extends an earlier call (:func:`envhub.gateway.matching.resolve`),
the backend is given ``parent prompt ids + the ids sampled then + the delta rendering of the new messages``
(``ChatCodec.delta_ids``): the model's own earlier output is never re-tokenized, so the context it is conditioned
on is exactly the context a trainer recomputes. Anything else is rendered canonically and opens a new chain, with
the reason recorded on the call. Every ``drift_every``-th spliced call is also rendered canonically and compared:
``stats["drift"] / stats["drift_checks"]`` is how often a re-rendering gateway would have fed the model other
tokens than it sampled (the drift this design removes).

**What a call costs** (#28 item 10, ``benchmarks/gateway_throughput.py``): a spliced call renders only its new
messages; the full renderings left are a chain's opening and the drift checks. The opening is rendered once per
distinct conversation (:class:`OpeningCache`: the sessions of a GRPO group, retries and sub-agents that reopen with
the same messages and tools get the ids of the first rendering, which is deterministic), and the drift check runs on
every 64th spliced call by default: on a 64 KB context it is a 20 ms rendering, as much as 50 spliced calls.
"""
from __future__ import annotations

import asyncio
import json
import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from envhub.backends.base import SamplingParams
from envhub.backends.lifecycle import generate_tagged
from envhub.gateway.jsonkey import compact_json, remembered, same
from envhub.gateway.matching import resolve
from envhub.gateway.messages import BadRequest, ContextLengthExceeded, prepare
from envhub.gateway.records import CallRecord, Session, new_id
from envhub.gateway.toolskey import tools_key

log = logging.getLogger("envhub.gateway.core")


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


class OpeningCache:
    """The prompt ids of a chain's opening, by what decides them: the tools (as rendered) and the messages (their
    compact JSON, in their own key order, and equal to it parsed back: :mod:`envhub.gateway.jsonkey`). Rendering is
    deterministic, so a hit is exactly the rendering it saves; bounded by the token ids it holds (least recently
    used first out; each entry also keeps its messages as parsed JSON, ~10 bytes per token of a 64 KB opening).

    Args:
        max_tokens: the most token ids held over all entries.
    """

    def __init__(self, max_tokens: int = 1 << 20):
        self.max_tokens, self.tokens = int(max_tokens), 0
        self.entries: OrderedDict[tuple[str, bytes | str], tuple[Any, tuple[int, ...]]] = OrderedDict()
        self.hits = self.misses = 0

    @staticmethod
    def key(tk: str, context: list[dict[str, Any]]) -> tuple[str, bytes | str] | None:
        """``(tk, compact JSON)``; ``json.dumps``' string where the compact serialiser refuses (an int past 64 bits
        for orjson), a key that needs no equality check as before; None where neither can write the messages."""
        try:
            return tk, compact_json(context)  # ~13 µs for a 64 KB context by orjson; json.dumps took ~320
        except Exception:  # noqa: S110 -- json.dumps decides, as it always did
            pass
        try:
            return tk, json.dumps(context, ensure_ascii=False)
        except (TypeError, ValueError):  # not JSON (a Python caller's objects): not cached, rendered every time
            return None

    def ids(self, codec: Any, tk: str, context: list[dict[str, Any]]) -> list[int]:
        """``codec.prompt_ids(context)``, rendered once per distinct (tools, messages)."""
        k = self.key(tk, context)
        hit = self.entries.get(k) if k is not None else None
        if hit is not None and (isinstance(k[1], str) or self.same(hit[0], context)):  # type: ignore[index]
            self.entries.move_to_end(k)  # type: ignore[arg-type]
            self.hits += 1
            return list(hit[1])
        ids = codec.prompt_ids(context)
        self.misses += 1
        if k is not None and len(ids) <= self.max_tokens:
            try:
                kept = remembered(context) if isinstance(k[1], bytes) else None
            except (TypeError, ValueError):  # json.dumps refuses it (bytes, a set): never cached before either
                return ids
            if hit is not None:  # same key, other messages (NaN, a tuple...): this rendering replaces that one
                self.tokens -= len(self.entries.pop(k)[1])
            self.entries[k] = (kept, tuple(ids))
            self.tokens += len(ids)
            while self.tokens > self.max_tokens:
                self.tokens -= len(self.entries.popitem(last=False)[1][1])
        return ids

    @staticmethod
    def same(remembered_context: Any, context: Any) -> bool:
        return same(remembered_context, context)


class CallServing:
    """The call half of :class:`~envhub.gateway.core.Gateway` (a mixin: it reads the gateway's ``backend``,
    ``tokenizer``, ``parser``, ``max_model_len``, ``default_max_tokens``, ``drift_every``, ``system_tool_list``,
    ``stats``, ``policy_version``, ``openings``, ``codecs`` and ``prepare_memo``)."""

    backend: Any
    tokenizer: Any
    parser: Any
    max_model_len: int
    default_max_tokens: int
    drift_every: int
    system_tool_list: bool
    stats: dict[str, int]
    policy_version: int
    openings: OpeningCache
    codecs: dict[str, Any]
    prepare_memo: bool

    def codec_for(self, tools: list[dict[str, Any]] | None, k: str | None = None) -> Any:
        """The chat codec for a tool set: the one shared per tokenizer, tools and parser (bounded,
        :meth:`ChatCodec.shared`), remembered here by the tools' key so a call does not serialise its tools twice.

        Args:
            tools: OpenAI function tools (``None`` or empty: none).
            k: the tools' :func:`tools_key` when the caller has it (computed otherwise).

        Returns:
            A :class:`~envhub.codec.chat.ChatCodec` for the gateway's tokenizer and ``parser``.
        """
        from envhub.codec.chat import ChatCodec

        k = tools_key(tools) if k is None else k
        codec = self.codecs.get(k)
        if codec is None:
            if len(self.codecs) >= 64:  # a client varying its tools on every call must not grow memory
                self.codecs.clear()
            codec = self.codecs[k] = ChatCodec.shared(self.tokenizer, tools=tools or None, parser=self.parser)
        return codec

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

        tk = tools_key(req.tools)
        codec = self.codec_for(req.tools, tk)
        try:
            return len(self.openings.ids(codec, tk, self._opening(codec, prepare(req.messages))))
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
        messages, tk = self._prepared(session, req.messages), tools_key(req.tools)
        codec = self.codec_for(req.tools, tk)
        parent, reason = resolve(session, messages, tk)
        try:
            if parent is not None:
                new = messages[len(parent.request) + 1:]
                context = parent.context + [parent.reply] + new
                prompt = self.splice(codec, parent, new)
            else:
                context = self._opening(codec, messages)
                prompt = self.openings.ids(codec, tk, context)
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
                          policy_version=self.policy_version, has_tools=bool(req.tools),
                          spliced_from=(parent.prompt_ids, parent.sampled_ids) if parent is not None else None)
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

    def _prepared(self, session: Session, sent: Any) -> list[dict[str, Any]]:
        """:func:`~envhub.gateway.messages.prepare` of ``sent``, preparing only the messages after the session's
        previous request when ``sent`` starts with it (a harness re-sends its history: 60 messages prepared again
        per call otherwise). Exact: a message's preparation depends only on itself and on whether a non-system
        message came before it (a later ``system`` message becomes a ``<system-reminder>`` user turn), so the new
        messages are prepared behind a user message standing for that history. Checked against a full pass on every
        ``drift_every``-th use (a difference is logged and turns the memo off). A malformed new message is reported
        by a full pass, with its own index. The comparison is dict equality, blind to key order; a prepared message
        depends on key order only through a chat client's tool arguments sent as an object rather than the string
        the API specifies, which the periodic full pass catches. (A Python caller that edits a message it sent in
        place and sends the same dict again defeats the comparison: send new dicts, as every HTTP request does.)"""
        memo = session.last_sent if self.prepare_memo else None
        if memo is not None and isinstance(sent, list) and len(sent) > len(memo[0]):
            before, done = memo
            if sent[:len(before)] == before and any(m["role"] != "system" for m in done):
                try:
                    new = prepare([_HISTORY] + sent[len(before):])[1:]
                except BadRequest:
                    new = None
                if new is not None:
                    messages = done + new
                    self.stats["prepare_memo"] = uses = self.stats.get("prepare_memo", 0) + 1
                    if self.drift_every and uses % self.drift_every == 1 % self.drift_every and \
                            prepare(sent) != messages:  # checked against a full pass, as the splice is
                        log.warning("gateway: preparing only a request's new messages gave another result than "
                                    "preparing all of them; preparing every request whole from now on")
                        self.prepare_memo = False
                        messages = prepare(sent)
                    session.last_sent = (sent, messages)
                    return messages
        messages = prepare(sent)
        session.last_sent = (sent, messages)
        return messages

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
        ids = parent.prompt_ids + parent.sampled_ids  # one 16k-element copy, extended in place (not a second)
        ids += codec.delta_ids(history, new, sampled_eos=codec.ends_turn(parent.sampled_ids))
        return ids

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


_HISTORY = {"role": "user", "content": ""}  # stands for a history that holds a non-system message
_ID_PREFIX = {"chat": "chatcmpl-", "responses": "resp_", "anthropic": "msg_"}
