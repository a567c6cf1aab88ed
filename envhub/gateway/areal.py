"""``/export_trajectories`` in AReaL's exact wire format, so AReaL's ``deserialize_interactions`` reads it unchanged.

AReaL (``areal/experimental/openai/proxy/server.py`` ``serialize_interactions``, ``types.py`` ``to_tensor_dict``,
``areal/infra/rpc/serialization.py`` ``SerializedTensor``) answers::

    {"interactions": {<interaction id>: {"tensor_dict": {name: <tensor>}, "reward": r, "interaction_id": id}}}

with each tensor as ``{"type": "tensor", "data": <base64 of the raw little-endian buffer>, "shape": [...],
"dtype": "torch.int64"}`` and the tensor dict ``input_ids`` ``[1, L]`` int64, ``loss_mask`` ``[1, L]`` int64,
``logprobs`` ``[1, L]`` float32 (0.0 on prompt tokens), ``versions`` ``[1, L]`` int64 (-1 on prompt tokens),
``attention_mask`` ``[1, L]`` bool, ``rewards`` ``[1]`` float32.

``style="individual"``: every finished call is one interaction (its prompt masked). ``style="concat"``: only
leaves, each carrying its whole chain (AReaL's ``concat`` mode): here from envhub's ``prefix_merging`` builder, so the
chain is exact by construction and a prefix shared by two leaves is trained once (AReaL trains it once per leaf).
Rewards are AReaL's discount (``r[i] += r[i+1] * discount`` in call order). Built with numpy only (no torch import).

**What the gateway sends** is :func:`export_json`: the bytes ``json.dumps({"interactions": export(...)},
ensure_ascii=False, separators=(",", ":"))`` would give (the test compares them byte for byte), built without
encoding any token twice. In an agent loop every call's prompt is its parent's prompt + sampled ids + a few new
tokens, and ``individual`` sends each call's whole ``[1, L]`` tensors: an 8-call session on a 64 KB context is ~6 MB
of base64 in which every shared prefix appears once per interaction. Base64 maps each 3 input bytes to 4 output
characters independently, so the encoding of ``prefix + new`` is the encoding of the prefix's first ``3k`` bytes
followed by the encoding of the rest: :class:`_B64Stream` keeps that split per call and extends its parent's instead
of starting over (a child's ``input_ids`` cost its new tokens, not its length); the constant runs (prompt mask 0,
logprob 0.0, version -1, attention 1) are one pre-encoded 3-element block repeated; and the JSON is assembled from
the encoded pieces (base64 needs no escaping), not scanned again by ``json.dumps``. :func:`export` stays the
reference: plain, and what ``concat`` uses.
"""
from __future__ import annotations

import base64
import json
import struct
from typing import Any

import numpy as np

from envhub.gateway.builders import _finish, _versions, call_rewards, per_request, prefix_merging
from envhub.gateway.records import CallRecord, Session
from envhub.rollout.trajectory import Trajectory

STYLES = ("individual", "concat")  # the first is the default
_DTYPES = {"torch.int64": np.dtype("<i8"), "torch.float32": np.dtype("<f4"), "torch.bool": np.dtype("bool")}


def tensor(values: Any, dtype: str, shape: list[int]) -> dict[str, Any]:
    array = np.asarray(values, dtype=_DTYPES[dtype]).reshape(shape)
    return {"type": "tensor", "data": base64.b64encode(array.tobytes()).decode("ascii"), "shape": shape,
            "dtype": dtype}


def decode_tensor(t: dict[str, Any]) -> np.ndarray:
    """The inverse of :func:`tensor` (what AReaL's ``SerializedTensor.to_tensor`` does, into numpy)."""
    return np.frombuffer(base64.b64decode(t["data"]), dtype=_DTYPES[t["dtype"]]).reshape(t["shape"])


def tensor_dict(prompt_ids: list[int], response_ids: list[int], mask: list[int], logprobs: list[float],
                versions: list[int], reward: float) -> dict[str, Any]:
    ids = list(prompt_ids) + list(response_ids)
    n, p = len(ids), len(prompt_ids)
    return {"input_ids": tensor(ids, "torch.int64", [1, n]),
            "loss_mask": tensor([0] * p + list(mask), "torch.int64", [1, n]),
            "logprobs": tensor([0.0] * p + list(logprobs), "torch.float32", [1, n]),
            "versions": tensor([-1] * p + list(versions), "torch.int64", [1, n]),
            "attention_mask": tensor([True] * n, "torch.bool", [1, n]),
            "rewards": tensor([float(reward)], "torch.float32", [1])}


def export(session: Session, *, discount: float = 1.0, style: str = "individual") -> dict[str, Any]:
    if style not in STYLES:
        raise ValueError(f"style must be 'individual' or 'concat', got {style!r}")
    rewards = call_rewards(session, "discount", discount)
    trajs = per_request(session, reward="discount", discount=discount) if style == "individual" else \
        prefix_merging(session, reward="discount", discount=discount)
    out = {}
    for t in trajs:
        cid = t.details["calls"][-1]
        out[cid] = {"tensor_dict": tensor_dict(t.prompt_ids, t.response_ids, t.loss_mask, t.response_logprobs,
                                               t.details["versions"], rewards[cid]),
                    "reward": rewards[cid], "interaction_id": cid}
    return out


# ---- the wire bytes, each token encoded once --------------------------------------------------------------------
_INT64, _FLOAT32 = np.dtype("<i8"), np.dtype("<f4")


def _b64(raw: bytes) -> bytes:
    return base64.b64encode(raw)  # through the module attribute: the tests count what is encoded


def _fill(unit: bytes, count: int, tail: bytes = b"") -> list[bytes | memoryview]:
    """base64 of ``unit * count + tail``, as pieces: the constant run as one pre-encoded 3-unit block repeated (3
    units are a multiple of 3 bytes, so the block's encoding repeats exactly), then only the remainder and ``tail``
    encoded. The run is a view into one repeated block kept per unit (:func:`_run`): nothing is written for it until
    the body is joined."""
    whole, rest = divmod(count, 3)
    return [_run(unit, whole), _b64(unit * rest + tail)]


_RUNS: dict[bytes, bytes] = {}
_MAX_RUN = 8 << 20  # bytes of one kept run (a 1.5M-token context's int64 run); longer ones are built per use


def _run(unit: bytes, whole: int) -> bytes | memoryview:
    """``whole`` repetitions of ``unit``'s pre-encoded block, as a view into a run kept per unit and grown (doubling)
    to the longest asked for, up to ``_MAX_RUN``."""
    block = _block(unit)
    size = whole * len(block)
    if size > _MAX_RUN:
        return block * whole
    run = _RUNS.get(unit, b"")
    if len(run) < size:
        run = _RUNS[unit] = block * min(max(whole, 2 * len(run) // len(block)), _MAX_RUN // len(block))
    return memoryview(run)[:size]


_BLOCKS: dict[bytes, bytes] = {}


def _block(unit: bytes) -> bytes:
    if unit not in _BLOCKS:
        _BLOCKS[unit] = base64.b64encode(unit * 3)
    return _BLOCKS[unit]


class _B64Stream:
    """The base64 of a growing int64 buffer: the encodings of its first ``3k`` bytes as the chunks each extension
    added (shared with the stream it extends, never copied), and the 0-2 bytes left over."""

    __slots__ = ("chunks", "rest", "n")

    def __init__(self, chunks: tuple[bytes, ...] = (), rest: bytes = b"", n: int = 0):
        self.chunks, self.rest, self.n = chunks, rest, n

    def extended(self, ids: list[int], more: list[int]) -> _B64Stream:
        """The stream of this buffer + ``ids`` + ``more`` (two lists: a call's prompt and sampled ids, not
        concatenated into a third)."""
        raw = b"".join((self.rest, _int64(ids), _int64(more)))
        cut = len(raw) - len(raw) % 3
        return _B64Stream(self.chunks + (_b64(raw[:cut]),), raw[cut:], self.n + len(ids) + len(more))

    def pieces(self) -> list[bytes | memoryview]:
        return [*self.chunks, _b64(self.rest)]


def _int64(ids: list[int]) -> bytes:
    """Little-endian int64 bytes of ``ids`` (what ``np.asarray(ids, "<i8").tobytes()`` gives, in ~60 % of its time
    for a list of Python ints: a chain's first 16k-token prompt is converted once per session)."""
    return struct.pack(f"<{len(ids)}q", *ids)


def _extends(call: CallRecord, parent: CallRecord | None) -> bool:
    """``call``'s prompt starts with ``parent``'s prompt + sampled ids. A record the gateway's splice built says so:
    ``CallRecord.spliced_from`` holds the very lists its prompt was made from (set where the prompt is made,
    ``calls.CallServing.complete``; the gateway never changes a record's lists afterwards), and when they are still
    the parent's, that is read instead of comparing the 16k-token prefix again per interaction (a slice and a
    comparison each were ~3 % of the gateway's CPU under the throughput benchmark). A record put together any other
    way, or whose parent's lists were replaced, is compared element by element, and encoded from scratch unless it
    extends."""
    if parent is None:
        return False
    p, s = len(parent.prompt_ids), len(parent.sampled_ids)
    made = call.spliced_from
    if made is not None and made[0] is parent.prompt_ids and made[1] is parent.sampled_ids:
        return len(call.prompt_ids) >= p + s
    return (len(call.prompt_ids) >= p + s and call.prompt_ids[:p] == parent.prompt_ids
            and call.prompt_ids[p:p + s] == parent.sampled_ids)


def _tensor(out: list[bytes | memoryview], name: str, data: list[bytes | memoryview], dtype: str,
            shape: str) -> None:
    out.append(b'"%s":{"type":"tensor","data":"' % name.encode())
    out.extend(data)
    out.append(b'","shape":%s,"dtype":"%s"}' % (shape.encode(), dtype.encode()))


def export_json(session: Session, *, discount: float = 1.0, style: str = "individual") -> bytes:
    """The body of ``/export_trajectories``: exactly ``json.dumps({"interactions": export(session, ...)},
    ensure_ascii=False, separators=(",", ":")).encode()``, with ``individual`` built in time linear in the session's
    distinct tokens (see the module docstring); ``concat`` goes through :func:`export`.

    Args:
        session: the session (finished calls are exported).
        discount: AReaL's turn discount.
        style: ``"individual"`` or ``"concat"``.

    Returns:
        The UTF-8 JSON bytes.

    Raises:
        ValueError: an unknown ``style``.
    """
    return b"".join(export_pieces(session, discount=discount, style=style))


def export_pieces(session: Session, *, discount: float = 1.0, style: str = "individual") -> list[bytes | memoryview]:
    """:func:`export_json`'s bytes as the pieces they are the concatenation of, not joined: what the gateway sends
    (``asgi.Pieces``). An 8-call session on a 64 KB context is ~6.3 MB, three quarters of it views into the kept
    constant runs; joining it cost a 6.3 MB copy into freshly grown heap pages per export (the page faults and the
    copy were ~8 % of the gateway's CPU under the throughput benchmark, #28 item 10). Same arguments and errors as
    :func:`export_json`; the pieces are ``bytes`` and byte-format ``memoryview`` objects."""
    if style not in STYLES:
        raise ValueError(f"style must be 'individual' or 'concat', got {style!r}")
    if style != "individual":
        return [json.dumps({"interactions": export(session, discount=discount, style=style)}, ensure_ascii=False,
                           separators=(",", ":")).encode()]
    rewards = call_rewards(session, "discount", discount)
    streams: dict[str, _B64Stream] = {}
    out: list[bytes | memoryview] = [b'{"interactions":{']
    for c in (c for c in session.calls if c.ok):
        parent = session.by_id.get(c.parent) if c.parent else None
        base = streams.get(parent.call_id) if parent is not None and _extends(c, parent) else None
        if base is None:
            ids = streams[c.call_id] = _B64Stream().extended(c.prompt_ids, c.sampled_ids)
        else:
            ids = streams[c.call_id] = base.extended(c.prompt_ids[base.n:], c.sampled_ids)
        finish, error = _finish(session, c)
        trained = Trajectory(env_id="", task_id="", finish_reason=finish, error=error).ok  # per_request's rule
        p, s = len(c.prompt_ids), len(c.sampled_ids)
        shape, cid = f"[1,{p + s}]", json.dumps(c.call_id, ensure_ascii=False).encode()
        if len(out) > 1:
            out.append(b",")
        out.append(b'%s:{"tensor_dict":{' % cid)
        _tensor(out, "input_ids", ids.pieces(), "torch.int64", shape)
        out.append(b",")
        _tensor(out, "loss_mask", _fill(b"\0" * 8, p + (0 if trained else s),
                                        np.ones(s if trained else 0, _INT64).tobytes()), "torch.int64", shape)
        out.append(b",")
        _tensor(out, "logprobs", _fill(b"\0" * 4, p, np.asarray(c.logprobs, _FLOAT32).tobytes()), "torch.float32",
                shape)
        out.append(b",")
        _tensor(out, "versions", _fill(b"\xff" * 8, p, np.asarray(_versions(c), _INT64).tobytes()), "torch.int64",
                shape)
        out.append(b",")
        _tensor(out, "attention_mask", _fill(b"\x01", p + s), "torch.bool", shape)
        out.append(b",")
        _tensor(out, "rewards", [_b64(np.asarray([rewards[c.call_id]], _FLOAT32).tobytes())], "torch.float32", "[1]")
        out.append(b'},"reward":%s,"interaction_id":%s}' % (json.dumps(rewards[c.call_id]).encode(), cid))
    out.append(b"}}")
    return out
