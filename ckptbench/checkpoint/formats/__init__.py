"""Checkpoint formats: one module each (safetensors, torch, dcp) that writes rank shards and reads them back.

Every loader returns a CheckpointState whose tensors sit in memory already filled: their own, or the
read buffers in fused mode (a lazily mapped tensor is materialized before the loader returns, so its
cost lands in the load stage, not in a later step).
"""

from __future__ import annotations

from ckptbench.checkpoint.detect import detect, detect_names  # noqa: F401  (the formats' own entry point)
from ckptbench.core.errors import CkptbenchError
from ckptbench.checkpoint.formats.state import (  # noqa: F401  (the face: what other folders use)
    CheckpointState,
    FormatError,
    GROUPS,
    MAX_DEPTH,
    MemoryFile,
    OPTIM_KEYS,
    RawBytes,
    check_walk,
    flatten,
    group_of,
    walk_limit,
)


def module_for(fmt: str):
    if fmt == "safetensors":
        from ckptbench.checkpoint.formats import safetensors_format as mod
    elif fmt == "torch":
        from ckptbench.checkpoint.formats import torch_format as mod
    elif fmt == "dcp":
        from ckptbench.checkpoint.formats import dcp_format as mod
    else:
        raise CkptbenchError(f"unknown format {fmt!r}: choose safetensors, torch or dcp")
    return mod
