"""Checkpoint formats: one module each (safetensors, torch, dcp) that writes rank shards and reads them back.

Every loader returns a CheckpointState whose tensors sit in memory already filled: their own, or the
read buffers in fused mode (a lazily mapped tensor is materialized before the loader returns, so its
cost lands in the load stage, not in a later step).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

import torch

from ckptbench.detect import detect, detect_names  # noqa: F401  (re-exported: the formats' own entry point)
from ckptbench.errors import CkptbenchError

OPTIM_KEYS = ("master", "exp_avg", "exp_avg_sq")


class MemoryFile(io.RawIOBase):
    """A seekable, read-only file over bytes already in memory, without copying them (io.BytesIO copies
    anything but bytes): loaders parse a read buffer through it."""

    def __init__(self, buf) -> None:
        super().__init__()
        self.buf = memoryview(buf).cast("B")
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: len(self.buf)}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b) -> int:
        n = max(0, min(len(b), len(self.buf) - self.pos))
        memoryview(b).cast("B")[:n] = self.buf[self.pos:self.pos + n]
        self.pos += n
        return n


@dataclass
class CheckpointState:
    model: dict[str, torch.Tensor]
    optim: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # name -> master/exp_avg/exp_avg_sq
    step: int = 0
    hparams: dict = field(default_factory=dict)

    def merge(self, other: "CheckpointState") -> None:
        self.model.update(other.model)
        for name, parts in other.optim.items():
            self.optim.setdefault(name, {}).update(parts)
        self.step = max(self.step, other.step)
        self.hparams = self.hparams or other.hparams


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class FormatError(CkptbenchError):
    """A checkpoint file that cannot be read as its format says.

    The message stays one line whatever a crafted file puts in it: control characters (a tensor name with a
    newline, say) are written as escapes."""

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", message), exit_code=exit_code)


def module_for(fmt: str):
    if fmt == "safetensors":
        from ckptbench.formats import safetensors_format as mod
    elif fmt == "torch":
        from ckptbench.formats import torch_format as mod
    elif fmt == "dcp":
        from ckptbench.formats import dcp_format as mod
    else:
        raise CkptbenchError(f"unknown format {fmt!r}: choose safetensors, torch or dcp")
    return mod
