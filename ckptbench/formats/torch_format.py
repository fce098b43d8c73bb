"""torch.save per-rank shards: model and optimizer state of each rank, loaded with weights_only=True."""

from __future__ import annotations

import io
import os
import pickle

import torch

from ckptbench.formats import CheckpointState, FormatError, MemoryFile


def shard_names(rank: int) -> tuple[str, str]:
    return f"model_rank{rank:03d}.pt", f"optim_rank{rank:03d}.pt"


def write(directory: str, state: CheckpointState, assignment: list[list[str]]) -> list[tuple[str, str, int | None]]:
    written = []
    for rank, names in enumerate(assignment):
        model_file, optim_file = shard_names(rank)
        torch.save({n: state.model[n] for n in names}, os.path.join(directory, model_file))
        optim = {"state": {n: state.optim[n] for n in names}, "step": state.step, "hparams": state.hparams}
        torch.save(optim, os.path.join(directory, optim_file))
        written += [(model_file, "model", rank), (optim_file, "optimizer", rank)]
    return written


def _from_obj(obj, where: str) -> CheckpointState:
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: holds a {type(obj).__name__}, not a state dict")
    if "state" in obj and isinstance(obj["state"], dict) and all(isinstance(v, dict) for v in obj["state"].values()):
        return CheckpointState({}, optim=obj["state"], step=int(obj.get("step", 0)), hparams=obj.get("hparams", {}))
    model = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
    if not model:
        raise FormatError(f"{where}: holds no tensors")
    return CheckpointState(model)


def _materialize(state: CheckpointState) -> CheckpointState:
    """mmap=True loads are lazy: copy into owned memory now so the cost is counted in the load."""
    state.model = {k: v.clone() for k, v in state.model.items()}
    state.optim = {n: {k: v.clone() for k, v in parts.items()} for n, parts in state.optim.items()}
    return state


def _safe_load(load, where: str):
    """Runs `load()` (a weights_only torch load) and turns its failures into one FormatError line."""
    try:
        return load()
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "disallowed object"
        raise FormatError(f"{where}: refused — it holds objects beyond tensors and plain data, and "
                          f"unpickling them could run code ({first[:160]}); re-save it as a plain state dict "
                          "or safetensors") from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise FormatError(f"{where}: not a readable torch file ({str(exc).splitlines()[0][:160]}); "
                          "the shard is corrupt or truncated") from None


def load_file(path: str) -> CheckpointState:
    obj = _safe_load(lambda: torch.load(path, weights_only=True, map_location="cpu", mmap=True), path)
    return _materialize(_from_obj(obj, path))


def _load_in_place(buf):
    """torch.load's own mmap path, with the read buffer standing in for the mapped file: every storage is a
    slice of `buf`, so the tensors are views of the bytes already read (no second copy). Still the
    weights_only unpickler. Uses torch.serialization's internals, hence the fallback in load_buffer."""
    from torch import serialization as ts

    storage = torch.frombuffer(buf, dtype=torch.uint8).untyped_storage()
    with ts._open_zipfile_reader(MemoryFile(buf)) as zf:
        return ts._load(zf, "cpu", ts._weights_only_unpickler, overall_storage=storage, encoding="utf-8")


def _has_load_internals() -> bool:
    from torch import serialization as ts

    return all(hasattr(ts, n) for n in ("_open_zipfile_reader", "_load", "_weights_only_unpickler"))


def load_buffer(buf, name: str) -> CheckpointState:
    view = memoryview(buf)
    # a zip archive (torch.save's format since 1.6) in writable memory loads in place; anything else is copied
    if not view.readonly and view.nbytes >= 4 and bytes(view[:4]) == b"PK\x03\x04" and _has_load_internals():
        obj = _safe_load(lambda: _load_in_place(buf), name)
    else:
        obj = _safe_load(lambda: torch.load(io.BytesIO(view), weights_only=True, map_location="cpu"), name)
    return _from_obj(obj, name)
