"""Trajectory builders over a session's calls: ``per_request`` and ``prefix_merging`` (Polar's names).

Both return envhub :class:`~envhub.rollout.trajectory.Trajectory` objects, so ``to_tensors``, the fidelity check
and both trainer adapters consume them unchanged; per-token policy versions ride in ``details["versions"]``
(aligned with ``response_ids``; ``-1`` on context tokens, as AReaL's ``versions`` tensor).

``per_request``: every finished call is one trajectory (prompt ids, then the sampled ids, all trainable).

``prefix_merging``: calls form a forest (a call's ``parent`` is the call it extends; its prompt starts with the
parent's prompt + sampled ids, by construction). Each root-to-leaf path is one trajectory: the root's prompt, then
every call's sampled ids (mask 1, their logprobs) with the rendered new messages between them (mask 0). A prefix
shared by several leaves (a retried call, a fork) is trained once: in the first leaf that holds it (the main
chain's first), masked in the others. Roles: ``main`` is the leaf path with the most calls that had tools (ties:
the earliest root), ``aux`` a path whose calls had no tools (title generators, compaction summaries), ``sub`` the
rest (sub-agents, post-compaction continuations). A leaf whose reply nobody echoed and whose prompt the harness
sent again later (a retry: the harness abandoned that answer) is built with ``finish_reason="cancelled"``:
recorded, never trained.

**Rewards** (``reward=``): ``"outcome"`` (default) gives every trajectory of the session the last reward set
(AReaL's ``set_reward`` with no interaction id, i.e. the episode's outcome), as slime and Polar broadcast it;
``"discount"`` applies AReaL's turn discount over the calls in order (``r[i] += r[i+1] * discount``) and a merged
trajectory takes its leaf's value (``step_rewards`` lists each call's). Sessions flagged ``upstream_failure`` at
their last call, or with a call aborted mid-generation, are built with ``finish_reason="error"`` (kept, never
trained: ``Trajectory.loss_mask``); ``mixed_policy_versions`` is kept in ``details["flags"]`` with the versions.
"""
from __future__ import annotations

import json
import logging
from typing import Any

from envhub.gateway.records import CallRecord, Session
from envhub.rollout.trajectory import Trajectory

log = logging.getLogger(__name__)
BUILDERS = ("prefix_merging", "per_request")   # the first is the default
REWARD_MODES = ("outcome", "discount")


def call_rewards(session: Session, mode: str = "outcome", discount: float = 1.0) -> dict[str, float]:
    """Reward per finished call under ``mode`` (see the module docstring).

    Args:
        session: the session whose calls are rewarded.
        mode: ``"outcome"``: every finished call gets the reward of the latest finished call that has one (0 when
            none has); ``"discount"``: back from the last finished call, ``r[i] = reward[i] + r[i+1] * discount``
            (an unset reward counts 0; a warning is logged when the last call has none).
        discount: the turn discount of ``"discount"`` mode.

    Returns:
        ``{call_id: reward}`` for every finished call.

    Raises:
        ValueError: ``mode`` is neither ``"outcome"`` nor ``"discount"``.
    """
    done = [c for c in session.calls if c.ok]
    if mode == "outcome":
        last = next((c.reward for c in reversed(done) if c.reward is not None), None)
        return {c.call_id: float(last or 0.0) for c in done}
    if mode != "discount":
        raise ValueError(f"reward mode must be 'outcome' or 'discount', got {mode!r}")
    if done and done[-1].reward is None:
        log.warning("session %s: the last interaction has no reward; using 0", session.session_id)
    out, running = {}, 0.0
    for c in reversed(done):
        running = (c.reward or 0.0) + running * discount
        out[c.call_id] = running
    return out


def _base(session: Session) -> dict[str, Any]:
    return {"env_id": "gateway", "task_id": session.task_id or session.session_id}


def _finish(session: Session, leaf: CallRecord) -> tuple[str, str | None]:
    if "aborted_call" in session.flags:
        return "error", "a call was aborted mid-generation (the client went away)"
    failed = [c for c in session.calls if c.error]
    if failed and failed[-1] is session.calls[-1]:
        return "error", f"the session ended on a failed model call: {failed[-1].error}"
    return ("length" if leaf.finish_reason == "length" else "done"), None


def _details(session: Session, calls: list[CallRecord], role: str, versions: list[int]) -> dict[str, Any]:
    tools = calls[0].tools_key
    start = len(calls[0].prompt_ids)
    # (index of the call's reply in messages, start, end of its sampled ids in response_ids): the executor's
    # Episode.turns, which the rollout service's ProRL reply cuts messages along
    turns = [[len(c.context), len(c.prompt_ids) - start, len(c.prompt_ids) - start + len(c.sampled_ids)] for c in calls]
    d: dict[str, Any] = {"session_id": session.session_id, "chain_role": role, "calls": [c.call_id for c in calls],
                         "versions": versions, "flags": list(session.flags), "turns": turns}
    if tools != "[]":
        d["tools"] = tools
    if calls[0].break_reason:
        d["chain_reason"] = calls[0].break_reason
    return d


def per_request(session: Session, *, reward: str = "outcome", discount: float = 1.0) -> list[Trajectory]:
    """Every finished call as one trajectory: its prompt ids, then its sampled ids (all trainable).

    Args:
        session: the session (calls that failed or are still running are left out).
        reward: ``"outcome"`` (default) or ``"discount"`` (:func:`call_rewards`).
        discount: the turn discount of ``reward="discount"``.

    Returns:
        One :class:`~envhub.rollout.trajectory.Trajectory` per finished call, in call order (``num_turns=1``,
        ``details["chain_role"] == "request"``); each is ``finish_reason="error"`` when a call was aborted or the
        session's last call failed. ``[]`` when no call finished.

    Raises:
        ValueError: an unknown ``reward`` mode.
    """
    rewards = call_rewards(session, reward, discount)
    out = []
    for c in (c for c in session.calls if c.ok):
        finish, error = _finish(session, c)
        out.append(Trajectory(**_base(session), prompt_ids=list(c.prompt_ids), response_ids=list(c.sampled_ids),
                              response_mask=[1] * len(c.sampled_ids), response_logprobs=list(c.logprobs),
                              reward=rewards[c.call_id], step_rewards=[rewards[c.call_id]], num_turns=1,
                              finish_reason=finish, error=error, truncated=c.finish_reason == "length",
                              policy_version=c.policy_version, messages=c.context + [c.reply],
                              response_versions=_versions(c),
                              details=_details(session, [c], "request", _versions(c))))
    return out


def chains(session: Session) -> list[list[CallRecord]]:
    """Root-to-leaf paths of finished calls (a call's parent is the call it extends), main chain first.

    Args:
        session: the session.

    Returns:
        Each path as its calls, root first. Order: the most calls with tools first, then the longest, then the
        earliest root, then the earliest leaf.
    """
    done = {c.call_id: c for c in session.calls if c.ok}
    children: dict[str, list[CallRecord]] = {}
    for c in done.values():
        if c.parent in done:
            children.setdefault(c.parent, []).append(c)
    paths = []
    for c in done.values():
        if c.call_id in children:
            continue
        path = [c]
        while path[0].parent in done:
            path.insert(0, done[path[0].parent])
        paths.append(path)
    order = {c.call_id: i for i, c in enumerate(session.calls)}
    paths.sort(key=lambda p: (-sum(c.has_tools for c in p), -len(p), order[p[0].call_id], order[p[-1].call_id]))
    return paths


def _abandoned(leaf: CallRecord, session: Session) -> bool:
    """A retried call the harness did not go on with: nobody echoed its reply, and the harness asked the same prompt
    again later (it re-asks only when it did not get or did not take the answer)."""
    if leaf.echoed:
        return False
    later = session.calls[session.calls.index(leaf) + 1:]
    return any(c.ok and c.prompt_ids == leaf.prompt_ids for c in later)


def prefix_merging(session: Session, *, reward: str = "outcome", discount: float = 1.0) -> list[Trajectory]:
    """Each root-to-leaf chain of calls (:func:`chains`) as one trajectory (see the module docstring).

    A trajectory holds its root's prompt, then every call's sampled ids (mask 1, their logprobs and versions) with
    the rendered new messages between them (mask 0, version -1). A call shared by several chains is trained only in
    the first that holds it; a retried call the harness abandoned is built with ``finish_reason="cancelled"``
    (unless the session failed) and trains nothing. Its reward is its leaf call's.

    Args:
        session: the session (calls that failed or are still running are left out).
        reward: ``"outcome"`` (default) or ``"discount"`` (:func:`call_rewards`).
        discount: the turn discount of ``reward="discount"``.

    Returns:
        One :class:`~envhub.rollout.trajectory.Trajectory` per chain, main chain first (``details["chain_role"]``:
        ``"main"``, ``"aux"`` or ``"sub"``); ``[]`` when no call finished.

    Raises:
        ValueError: an unknown ``reward`` mode.
        AssertionError: a call's sampled ids are not where its chain puts them (the splice invariant broken: a bug
            of the gateway's, not a client's doing).
    """
    rewards = call_rewards(session, reward, discount)
    trained: set[str] = set()
    out = []
    for n, path in enumerate(chains(session)):
        root, leaf = path[0], path[-1]
        role = "main" if n == 0 else ("aux" if not any(c.has_tools for c in path) else "sub")
        ids = list(leaf.prompt_ids) + list(leaf.sampled_ids)
        start = len(root.prompt_ids)
        mask, lps, versions = [0] * (len(ids) - start), [0.0] * (len(ids) - start), [-1] * (len(ids) - start)
        abandoned = _abandoned(leaf, session)
        for c in path:
            at = len(c.prompt_ids) - start
            if ids[start + at: start + at + len(c.sampled_ids)] != c.sampled_ids:  # the splice invariant
                raise AssertionError(f"call {c.call_id}: its sampled ids are not where its chain puts them")
            tags = _versions(c)  # on this trajectory's own tokens only: what it does not train is context (-1)
            for j, lp in enumerate(c.logprobs):
                if c.call_id not in trained and not abandoned:
                    mask[at + j], lps[at + j], versions[at + j] = 1, lp, tags[j]
            if not abandoned:
                trained.add(c.call_id)
        finish, error = _finish(session, leaf)
        if abandoned and finish != "error":
            finish, error = "cancelled", "a retried call the harness did not continue: recorded, not trained"
        versions_used = {v for c in path for v in _versions(c)}
        out.append(Trajectory(**_base(session), prompt_ids=list(root.prompt_ids), response_ids=ids[start:],
                              response_mask=mask, response_logprobs=lps, reward=rewards[leaf.call_id],
                              step_rewards=[rewards[c.call_id] for c in path], num_turns=len(path),
                              finish_reason=finish, error=error, truncated=leaf.finish_reason == "length",
                              policy_version=next(iter(versions_used)) if len(versions_used) == 1 else None,
                              messages=leaf.context + [leaf.reply], response_versions=list(versions),
                              details=_details(session, path, role, versions)))
    return out


def _versions(c: CallRecord) -> list[int]:
    """The version of each sampled token (a record from before per-token versions: its call's version)."""
    return list(c.versions) if len(c.versions) == len(c.sampled_ids) else [c.policy_version] * len(c.sampled_ids)


def build(session: Session, builder: str = "prefix_merging", **kw: Any) -> list[Trajectory]:
    """A session's trajectories by the builder named.

    Args:
        session: the session (calls that failed or are still running are left out).
        builder: ``"prefix_merging"`` (default, :func:`prefix_merging`) or ``"per_request"`` (:func:`per_request`).
        **kw: ``reward=`` and ``discount=``, passed to the builder.

    Returns:
        The builder's trajectories.

    Raises:
        ValueError: an unknown ``builder`` or ``reward`` mode.
    """
    if builder == "per_request":
        return per_request(session, **kw)
    if builder == "prefix_merging":
        return prefix_merging(session, **kw)
    raise ValueError(f"builder must be one of {BUILDERS}, got {builder!r}")


def summary(session: Session) -> dict[str, Any]:
    """What a person checks first: calls, chains and why each one started, flags.

    Args:
        session: the session.

    Returns:
        ``{"session_id", "calls", "chains", "roots", "flags", "tools"}``: the number of calls (all, failed ones too)
        and of chains; every call that opened a chain with its ``break_reason``; the session's flags; the main
        chain's tools (``[]`` when no call finished).
    """
    paths = chains(session)
    return {"session_id": session.session_id, "calls": len(session.calls), "chains": len(paths),
            "roots": [{"call": c.call_id, "reason": c.break_reason} for c in session.calls if c.parent is None],
            "flags": session.flags, "tools": json.loads(paths[0][0].tools_key) if paths else []}
