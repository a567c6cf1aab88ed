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
"""
from __future__ import annotations

import base64
from typing import Any

import numpy as np

from envhub.gateway.builders import call_rewards, per_request, prefix_merging
from envhub.gateway.records import Session

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
