"""What every format loads into (CheckpointState), reads through (MemoryFile) and fails with (FormatError); the
key grouping, and the bounded walk every loader uses."""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field

import torch

from ckptbench.core.errors import CkptbenchError

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


GROUPS = ("model", "optimizer", "other")
_OPTIM_PREFIXES = ("optim", "optimizer", "optimizer_state_dict", "optim_state", "base_optimizer_state")
_MODEL_PREFIXES = ("model", "module", "state_dict", "model_state_dict")
_OTHER_PREFIXES = ("lr_scheduler", "scheduler", "dataloader", "train_state", "rng", "rng_state", "extra_state",
                   "args", "config", "ds_config", "trainer_state", "opt_param_scheduler",
                   # Lightning's .ckpt beside state_dict and optimizer_states: callbacks (ModelCheckpoint's
                   # best_model_score, kth_value), loops, schedulers, hyper-parameters, AMP's scaler
                   "callbacks", "loops", "lr_schedulers", "hyper_parameters", "hparams_name", "epoch", "global_step",
                   "pytorch-lightning_version", "native_amp_scaling_state", "mixedprecision")
# keys kept apart by rank: DeepSpeed's partitions (zero_pp_rank_N[_mp_rank_M]), Megatron's model-parallel ranks
_RANK_TAG = re.compile(r"zero_pp_rank_\d+(?:_mp_rank_\d+)?|mp_rank_\d{2}(?:_\d{3})?")


def group_of(fqn: str) -> str:
    """model, optimizer or other, for a flat key a foreign checkpoint uses (its first component says: torchtitan's
    `optimizer.state.…`, DeepSpeed's `module.…`, after a partition's rank tag); a key with no known group prefix is
    a weight (a flat state dict)."""
    head, _, rest = fqn.partition(".")
    if rest and _RANK_TAG.fullmatch(head):
        head = rest.partition(".")[0]
    head = head.lower()
    if head in _OPTIM_PREFIXES or head.startswith("optim"):
        return "optimizer"
    # rng_state_3: one per process; scheduler_1, sampler_1: Accelerate's, one per registered object
    if head in _OTHER_PREFIXES or head.startswith(("rng_state", "scaler", "scheduler", "sampler")):
        return "other"
    return "model"


@dataclass
class CheckpointState:
    """A loaded checkpoint. `model` and `optim` are the layout ckptbench writes and restores into its GPT;
    `extra` holds everything else a foreign checkpoint carries, by flat key (`optimizer.state.w.exp_avg`,
    `lr_scheduler.last_epoch`): tensors, raw bytes (byte entries never unpickled) and plain values."""

    model: dict[str, torch.Tensor]
    optim: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)  # name -> master/exp_avg/exp_avg_sq
    step: int = 0
    hparams: dict = field(default_factory=dict)
    extra: dict[str, object] = field(default_factory=dict)
    tree: dict | None = None  # the nesting a foreign checkpoint was saved with, where its format records it
    inert: set[str] = field(default_factory=set)  # classes its pickles named, kept as plain data (formats/inert.py)

    def merge(self, other: "CheckpointState") -> None:
        self.model.update(other.model)
        for name, parts in other.optim.items():
            self.optim.setdefault(name, {}).update(parts)
        self.extra.update(other.extra)
        self.step = max(self.step, other.step)
        self.hparams = self.hparams or other.hparams
        self.inert |= other.inert

    def tensors(self):
        """(group, flat name, tensor) of every tensor the state holds."""
        for name, t in self.model.items():
            yield "model", name, t
        for name, parts in self.optim.items():
            for k, t in parts.items():
                yield "optimizer", f"{name}.{k}", t
        for name, v in self.extra.items():
            if isinstance(v, torch.Tensor):
                yield group_of(name), name, v


class RawBytes(bytes):
    """A byte entry kept as it was saved: its pickle names something beyond plain data, so it is not run."""


MAX_DEPTH = 32  # nesting a trainer's state dict never reaches; a deeper pickle is crafted


def flatten(obj, prefix: str = "", depth: int = 0):
    """(flat key, leaf) of a nested state dict: dict keys and list/tuple indices joined with dots, as DCP names
    them. Raises FormatError past MAX_DEPTH or on a key that is neither a str nor an int."""
    if depth > MAX_DEPTH:
        raise FormatError(f"{prefix[:80]!r}: nested deeper than {MAX_DEPTH} levels; the file is corrupt or crafted")
    if isinstance(obj, dict):
        items = dict.items(obj)  # not obj.items: a pickle can set an instance attribute `items` on an OrderedDict
    elif isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        items = enumerate(obj)
    else:
        yield prefix, obj
        return
    for k, v in items:
        if not isinstance(k, (str, int)) or isinstance(k, bool):
            raise FormatError(f"{prefix[:80]!r}: has a key of type {type(k).__name__}, not a name or an index; "
                              "the file is corrupt or crafted")
        yield from flatten(v, f"{prefix}.{k}" if prefix else str(k), depth + 1)


def walk_limit(pickle_bytes: int) -> int:
    """How many containers and items a walk of an unpickled object may visit: each costs the pickle at least one
    opcode byte unless shared through its memo, so a tree fits; a shared graph (a list holding one list twice,
    24 levels deep: 2**24 paths from 1.7 KiB) does not."""
    return (1 << 16) + 2 * pickle_bytes


def check_walk(obj, limit: int, where: str) -> None:
    """Refuses `obj` when walking it (as flatten does, shared references visited each time) visits more than
    `limit` nodes; stops at the limit, so the check itself is bounded."""
    stack, seen = [obj], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > limit:
            raise FormatError(f"{where}: its pickle refers to the same containers so often that reading it would "
                              f"visit more than {limit} values; the file is corrupt or crafted")
        if isinstance(node, dict):
            stack.extend(dict.values(node))
            attrs = getattr(node, "__dict__", None)  # an OrderedDict's BUILD state (the stand-ins' attributes)
            if attrs:
                stack.extend(attrs.values())
        elif isinstance(node, (list, tuple, set, frozenset)):
            stack.extend(node)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class FormatError(CkptbenchError):
    """A checkpoint file that cannot be read as its format says.

    The message stays one line whatever a crafted file puts in it: control characters (a tensor name with a
    newline, say) are written as escapes."""

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", message), exit_code=exit_code)
