"""How a restored value is written into expected.json, and compared with it: the one encoding both the generator (in
the training libraries' venv) and the tests (in the project's venv) use. Needs only torch and numpy.

A tensor is {dtype, shape, sha256 of its contiguous CPU bytes}; a numpy array the same under "ndarray"; bytes
their sha256; torch.Size its dims; plain data (None, bool, int, float, str, lists of them) the JSON value."""

from __future__ import annotations

import enum
import hashlib
import math

import numpy as np
import torch


def _tensor_bytes(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    return t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _plain(v) -> bool:
    if v is None or isinstance(v, (bool, int, str)):
        return True
    if isinstance(v, float):
        return True
    if isinstance(v, (list, tuple)) and not isinstance(v, torch.Size):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    return False


def _json_value(v):
    if isinstance(v, (list, tuple)):
        return [_json_value(x) for x in v]
    if isinstance(v, dict):
        return {k: _json_value(x) for k, x in v.items()}
    return v


def encode(v) -> dict:
    """One value as expected.json holds it."""
    if isinstance(v, torch.Tensor):
        return {"tensor": str(v.dtype).removeprefix("torch."), "shape": list(v.shape),
                "sha256": hashlib.sha256(_tensor_bytes(v)).hexdigest()}
    if isinstance(v, np.ndarray):
        a = np.ascontiguousarray(v)
        return {"ndarray": str(a.dtype), "shape": list(a.shape), "sha256": hashlib.sha256(a.tobytes()).hexdigest()}
    if isinstance(v, np.generic):
        return {"value": v.item()}
    if isinstance(v, (bytes, bytearray, memoryview)):
        raw = bytes(v)
        return {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    if isinstance(v, torch.Size):
        return {"size": list(v)}
    if _plain(v):
        return {"value": _json_value(v)}
    return {"object": f"{type(v).__module__}.{type(v).__qualname__}"}


def _has_attributes(obj) -> bool:
    return (hasattr(obj, "__dict__") and not isinstance(obj, (torch.Tensor, np.ndarray, np.generic, type))
            and type(obj).__module__ not in ("builtins", "torch"))


def flatten(obj, prefix: str = ""):
    """(flat key, leaf) in ckptbench's naming: dict keys and list/tuple indices joined with dots (torch.Size is a
    leaf), an object of a library's class by its attributes; an empty container below the top is a leaf of its own
    (an empty dict for an object with no attributes): a scheduler's lr_lambdas [{}, {}] and Lightning's empty loop
    states are what their load_state_dict reads, and yielding nothing for them hid a restore that dropped them."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        items = enumerate(obj)
    elif isinstance(obj, enum.Enum):  # pickled as its class called with its value: ckptbench keeps that call's args
        items = {"args": [obj.value]}.items()
    elif _has_attributes(obj):  # a library's own object (DeepSpeed's LossScaler): its data is its attributes
        items = vars(obj).items()
    else:
        yield prefix, obj
        return
    items = list(items)
    if not items and prefix:
        yield prefix, ([] if isinstance(obj, (list, tuple)) else {})
        return
    for k, v in items:
        yield from flatten(v, f"{prefix}.{k}" if prefix else str(k))


def same(got: dict, want: dict) -> bool:
    """Two encodings agree (a NaN equals a NaN: the same bytes were saved)."""
    if set(got) != set(want):
        return False
    for k in want:
        a, b = got[k], want[k]
        if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
            continue
        if isinstance(a, (list, dict)) or isinstance(b, (list, dict)):
            if not _same_nested(a, b):
                return False
        elif type(a) is not type(b) or a != b:
            return False
    return True


def _same_nested(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return same(a, b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_nested(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b
