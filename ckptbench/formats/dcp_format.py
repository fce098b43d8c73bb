"""torch.distributed.checkpoint directories (.metadata plus .distcp shards), loaded without a process group."""

from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

from ckptbench.formats import OPTIM_KEYS, CheckpointState, FormatError


def write(directory: str, state: CheckpointState, assignment: list[list[str]]) -> list[tuple[str, str, int | None]]:
    """One .distcp file per writer thread: with N ranks' worth of threads the layout has N shards."""
    sd = {"model": state.model, "optim": state.optim, "step": torch.tensor(state.step)}
    before = set(os.listdir(directory))
    dcp.save(sd, storage_writer=FileSystemWriter(directory, thread_count=len(assignment)), no_dist=True)
    new = sorted(set(os.listdir(directory)) - before)
    written = []
    for i, name in enumerate(n for n in new if n.endswith(".distcp")):
        written.append((name, "model", i))
    written += [(n, "meta", None) for n in new if not n.endswith(".distcp")]
    return written


def load_dir(directory: str, like: CheckpointState | None = None) -> CheckpointState:
    """Reads into freshly allocated tensors shaped from the metadata (DCP loads in place)."""
    reader = FileSystemReader(directory)
    try:
        meta = reader.read_metadata()
    except Exception as exc:  # DCP raises bare exceptions of many kinds for a bad .metadata
        raise FormatError(f"{directory}/.metadata: unreadable ({type(exc).__name__}); not a DCP checkpoint") from None
    sd: dict = {"model": {}, "optim": {}, "step": torch.tensor(0)}
    for fqn, md in meta.state_dict_metadata.items():
        if not hasattr(md, "size"):
            continue
        parts = fqn.split(".")
        tensor = torch.empty(tuple(md.size), dtype=md.properties.dtype)
        if parts[0] == "model":
            sd["model"][".".join(parts[1:])] = tensor
        elif parts[0] == "optim" and parts[-1] in OPTIM_KEYS:
            sd["optim"].setdefault(".".join(parts[1:-1]), {})[parts[-1]] = tensor
    try:
        dcp.load(sd, storage_reader=reader, no_dist=True)
    except Exception as exc:
        raise FormatError(f"{directory}: DCP load failed ({type(exc).__name__}: {str(exc)[:160]}); "
                          "a shard is missing or truncated") from None
    return CheckpointState(sd["model"], sd["optim"], int(sd["step"]), {})
