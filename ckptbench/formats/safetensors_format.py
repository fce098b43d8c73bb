"""safetensors shards in the Hugging Face layout (model-0000i-of-0000N + index), optimizer shards beside them."""

from __future__ import annotations

import json
import os
import struct

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from ckptbench.formats import OPTIM_KEYS, CheckpointState, FormatError

INDEX = "model.safetensors.index.json"
_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}
MAX_HEADER = 100 << 20


def shard_name(kind: str, rank: int, world: int) -> str:
    return f"{kind}-{rank + 1:05d}-of-{world:05d}.safetensors"


def write(directory: str, state: CheckpointState, assignment: list[list[str]]) -> list[tuple[str, str, int | None]]:
    world = len(assignment)
    written, weight_map = [], {}
    for rank, names in enumerate(assignment):
        model_file = shard_name("model", rank, world)
        save_file({n: state.model[n].contiguous() for n in names}, os.path.join(directory, model_file),
                  metadata={"format": "pt"})
        weight_map.update({n: model_file for n in names})
        optim_file = shard_name("optimizer", rank, world)
        tensors = {f"{n}.{k}": state.optim[n][k].contiguous() for n in names for k in OPTIM_KEYS}
        # one metadata key: safetensors orders several keys at random, which would break same-seed digests
        meta = {"ckptbench_optimizer": json.dumps({"step": state.step, "hparams": state.hparams}, sort_keys=True)}
        save_file(tensors, os.path.join(directory, optim_file), metadata=meta)
        written += [(model_file, "model", rank), (optim_file, "optimizer", rank)]
    total = sum(t.numel() * t.element_size() for t in state.model.values())
    with open(os.path.join(directory, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    written.append((INDEX, "meta", None))
    return written


def _split(name: str) -> tuple[str, str | None]:
    for k in OPTIM_KEYS:
        if name.endswith("." + k):
            return name[: -len(k) - 1], k
    return name, None


def _add(state: CheckpointState, name: str, tensor: torch.Tensor, optimizer_file: bool) -> None:
    base, part = _split(name) if optimizer_file else (name, None)
    if part:
        state.optim.setdefault(base, {})[part] = tensor
    else:
        state.model[name] = tensor


def load_file(path: str) -> CheckpointState:
    """Reads one shard into owned memory: get_tensor returns a lazy view of safetensors' file mapping, so a load
    without the clone would look free and push the real read into the first forward step."""
    is_optim = os.path.basename(path).startswith("optimizer")
    state = CheckpointState({})
    try:
        with safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
            for name in f.keys():
                _add(state, name, f.get_tensor(name).clone(), is_optim)
    except (SafetensorError, OSError, ValueError) as exc:
        raise FormatError(f"{path}: not a readable safetensors file ({exc}); the shard is corrupt or truncated") from None
    _meta(state, meta, path)
    return state


def _meta(state: CheckpointState, meta: dict, where: str) -> None:
    try:
        doc = json.loads(meta.get("ckptbench_optimizer", "{}"))
        state.step = int(doc.get("step", meta.get("step", 0)))
        state.hparams = doc.get("hparams", {})
    except (ValueError, AttributeError):
        raise FormatError(f"{where}: optimizer metadata is not valid; the shard was not written by a trainer we know")


def parse_header(buf) -> tuple[dict, int]:
    """(header, data offset) of a safetensors buffer, with every bound checked."""
    mv = memoryview(buf)
    if len(mv) < 8:
        raise FormatError("safetensors buffer shorter than its 8-byte header length")
    (n,) = struct.unpack("<Q", mv[:8])
    if n > MAX_HEADER or 8 + n > len(mv):
        raise FormatError(f"safetensors header length {n} does not fit in {len(mv)} bytes; the file is corrupt")
    try:
        header = json.loads(bytes(mv[8 : 8 + n]))
    except ValueError:
        raise FormatError("safetensors header is not valid JSON; the file is corrupt") from None
    return header, 8 + n


def load_buffer(buf, name: str) -> CheckpointState:
    """Tensors straight over an in-memory shard (no copy): the fused pipeline reads each file once."""
    header, base = parse_header(buf)
    mv = memoryview(buf)
    state = CheckpointState({})
    is_optim = os.path.basename(name).startswith("optimizer")
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype = _DTYPES[info["dtype"]]
            start, end = info["data_offsets"]
            shape = info["shape"]
        except (KeyError, TypeError, ValueError):
            raise FormatError(f"{name}: tensor {key!r} has a malformed header entry") from None
        count = 1
        for s in shape:
            count *= s
        itemsize = torch.empty((), dtype=dtype).element_size()
        if not 0 <= start <= end <= len(mv) - base or end - start != count * itemsize:
            raise FormatError(f"{name}: tensor {key!r} lies outside the file or has the wrong size; truncated?")
        flat = torch.frombuffer(mv, dtype=dtype, count=count, offset=base + start) if count else torch.empty(0, dtype=dtype)
        _add(state, key, flat.view(shape), is_optim)
    _meta(state, header.get("__metadata__") or {}, name)
    return state
