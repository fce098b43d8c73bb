"""torch.save per-rank shards: model and optimizer state of each rank, loaded with weights_only=True."""

from __future__ import annotations

import io
import os
import pickle

import torch

from ckptbench.formats import CheckpointState, FormatError


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


def _safe_load(source, where: str, **kw):
    try:
        return torch.load(source, weights_only=True, map_location="cpu", **kw)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else "disallowed object"
        raise FormatError(f"{where}: refused — it holds objects beyond tensors and plain data, and "
                          f"unpickling them could run code ({first[:160]}); re-save it as a plain state dict "
                          "or safetensors") from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise FormatError(f"{where}: not a readable torch file ({str(exc).splitlines()[0][:160]}); "
                          "the shard is corrupt or truncated") from None


def load_file(path: str) -> CheckpointState:
    return _materialize(_from_obj(_safe_load(path, path, mmap=True), path))


def load_buffer(buf, name: str) -> CheckpointState:
    return _from_obj(_safe_load(io.BytesIO(memoryview(buf)), name), name)
