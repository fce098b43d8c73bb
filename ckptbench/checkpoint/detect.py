"""A checkpoint's format from its file names alone: cheap, and free of torch (headless commands stay light)."""

from __future__ import annotations

import os

from ckptbench.core.errors import CkptbenchError, printable
from ckptbench.checkpoint.layouts import DS_MODEL, DS_OPTIM, TORCH_EXT
from ckptbench.checkpoint.tree import files


def detect(directory: str) -> str:
    """The format of a checkpoint directory, whoever wrote it, from the files the listing holds (tree.files: no
    recursion, so a tree nested thousands deep is walked, not a RecursionError)."""
    return detect_names([os.path.basename(p) for p in files(directory)], directory)


def detect_names(names: list[str], where: str) -> str:
    """The format from file names alone (a directory's, or an S3 prefix's)."""
    names = [n.rsplit("/", 1)[-1] for n in names]
    if ".metadata" in names:
        return "dcp"
    if any(DS_MODEL.match(n) or DS_OPTIM.match(n) for n in names):  # DeepSpeed resumes from these, whatever is beside
        return "torch"
    if any(n.endswith(".safetensors") for n in names):
        return "safetensors"
    if any(n.endswith(TORCH_EXT) for n in names):
        return "torch"
    raise not_a_checkpoint(where)


_FORMAT_NAMES = {"dcp": "torch.distributed.checkpoint", "safetensors": "safetensors", "torch": "torch.save"}


def not_a_checkpoint(where: str, passed=()) -> CkptbenchError:
    """Every command's line for a folder whose files tell no format; where an entry that would tell one is there but
    passed over (`passed`: a `.metadata` that is a FIFO or a link beside DCP's shards), it is named, never read."""
    for path, why in passed:
        name = os.path.basename(path)
        try:
            telling = detect_names([name], where)
        except CkptbenchError:
            continue
        return CkptbenchError(f"{printable(where)}: {printable(os.path.relpath(path, where))} would make it a "
                              f"{_FORMAT_NAMES[telling]} checkpoint but is {why.split(',')[0]}, never read; put the "
                              "regular file there (a copy made with `cp -rL` for a link)")
    return CkptbenchError(f"{printable(where)}: no safetensors, torch or torch.distributed.checkpoint files found; "
                          "point at a checkpoint directory")


def format_of(manifest, names: list[str], where: str) -> str:
    """The manifest's format when it names one, else the names'; "unknown" when neither tells."""
    if manifest is not None and manifest.format != "unknown":
        return manifest.format
    try:
        return detect_names(names, where)
    except CkptbenchError:
        return "unknown"
