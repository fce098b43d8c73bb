"""What every format loads into (CheckpointState), reads through (MemoryFile) and fails with (FormatError); the
key grouping, and the bounded walk every loader uses."""

from __future__ import annotations

import contextlib
import errno
import io
import os
import re
import stat
from dataclasses import dataclass, field

import torch

from ckptbench.checkpoint.confine import open_listed
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
                   "pytorch-lightning_version", "native_amp_scaling_state", "mixedprecision",
                   # a loop's counter beside the state dicts ({"model": …, "optim": …, "step": torch.tensor(7)} in a
                   # dcp.save, Megatron's iteration): counted as a model weight, one parameter more, and written into
                   # the model by `save`, where a resume's load_state_dict(strict=True) refuses it
                   "step", "iteration")
# an RNG state by the names loops save it under (cpu_rng_state, cuda_rng_state, rng_states, numpy_random_state,
# rng_state_3): `rng` or `random_state` a whole word of the key's first component, as no weight's module name has it
_RNG_HEAD = re.compile(r"(?:^|_)(?:rng|random_state)s?(?:_|$)", re.ASCII)
# keys kept apart by rank: DeepSpeed's partitions (zero_pp_rank_N[_mp_rank_M]), Megatron's model-parallel ranks
RANK_TAG = re.compile(r"zero_pp_rank_\d+(?:_mp_rank_\d+)?|mp_rank_\d{2}(?:_\d{3}){0,2}")


def rng_state_of(fqn: str) -> str | None:
    """The RNG state a flat key lies in (Python's 625-int tuple, numpy's key array and counters: rng_state_0.python,
    numpy_random_state), or None: the key of the one state its elements make, as a resume sets it whole."""
    parts = fqn.split(".")
    for i, part in enumerate(parts):
        if _RNG_HEAD.search(part):
            # a Trainer's rng_state_N holds one state per generator (python, numpy, cpu); a loop's key holds one
            mine = i + 2 if i + 1 < len(parts) and not parts[i + 1].isdigit() else i + 1
            return ".".join(parts[:mine])
    return None


def group_of(fqn: str) -> str:
    """model, optimizer or other, for a flat key a foreign checkpoint uses (its first component says: torchtitan's
    `optimizer.state.…`, DeepSpeed's `module.…`, after a partition's rank tag); a key with no known group prefix is
    a weight (a flat state dict)."""
    head, _, rest = fqn.partition(".")
    if rest and RANK_TAG.fullmatch(head):
        head = rest.partition(".")[0]
    head = head.lower()
    if head in _OPTIM_PREFIXES or head.startswith("optim"):
        return "optimizer"
    # scheduler_1, sampler_1: Accelerate's, one per registered object
    if head in _OTHER_PREFIXES or head.startswith(("scaler", "scheduler", "sampler")) or _RNG_HEAD.search(head):
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
    # the training loop's plain values beside the tensors (a scheduler's state_dict, epoch, global_step), nested as
    # JSON holds them: what a resume needs that is neither weights nor optimizer state (ckptbench's layout keeps it)
    trainer: dict = field(default_factory=dict)
    tuples: set[str] = field(default_factory=set)  # flat keys of `extra` that were tuples (flatten's `tuples`)
    # every key as its format saved it, where the format records them (DCP: its .metadata's, before `model.` is
    # dropped from a weight's): two DCP folders are held apart on these (load.dcp_state)
    saved_keys: set[str] = field(default_factory=set)

    def merge(self, other: "CheckpointState") -> None:
        self.model.update(other.model)
        for name, parts in other.optim.items():
            self.optim.setdefault(name, {}).update(parts)
        self.extra.update(other.extra)
        self.step = max(self.step, other.step)
        self.hparams = self.hparams or other.hparams
        self.trainer = self.trainer or other.trainer
        self.inert |= other.inert
        self.tuples |= other.tuples
        self.saved_keys |= other.saved_keys

    def tensors(self):
        """(group, flat name, tensor) of every tensor the state holds."""
        for name, t in self.model.items():
            yield "model", name, t
        for name, parts in self.optim.items():
            for k, t in parts.items():
                yield "optimizer", f"{name}.{k}", t
        for name, v in self.extra.items():
            if type(v) not in SCALARS and isinstance(v, torch.Tensor):
                yield group_of(name), name, v


def cannot_open(path: str, exc: OSError) -> "FormatError":
    if exc.errno == errno.ELOOP:
        return FormatError(f"{path}: it, or a folder it lies in, is a symbolic link now, swapped in since the "
                           "checkpoint was listed: never followed; restore a copy nothing else writes to")
    return FormatError(f"{path}: cannot open ({exc.strerror}); check the path and its permissions")


@contextlib.contextmanager
def open_regular(path: str, what: str):
    """(file, its stat) of `path` opened without blocking on a FIFO and kept only if a regular file: one descriptor,
    so what is checked is what is read. `what` completes "not a regular file; ... must be one". A symlink is refused
    (O_NOFOLLOW), and so is a folder on its way below the checkpoint being loaded (confine.beneath): the listing
    holds none, so one there now was swapped in since."""
    try:
        fd = open_listed(path)
    except OSError as exc:
        raise cannot_open(path, exc) from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{path}: not a regular file; {what} must be one")
        yield f, st


def read_regular(path: str, what: str) -> bytearray:
    """A whole regular file through one descriptor (open_regular): loaders parse these bytes, so what they check is
    what they load, and a file truncated meanwhile is a short read, not a SIGBUS on a mapping."""
    with open_regular(path, what) as (f, st):
        buf = bytearray(st.st_size)
        try:
            got = f.readinto(buf)
        except OSError as exc:
            raise FormatError(f"{path}: cannot read ({exc.strerror or exc}); the file or its storage is failing") \
                from None
    if got != st.st_size:
        raise FormatError(f"{path}: {got} of its {st.st_size} bytes could be read; it changed while being read")
    return buf


class RawBytes(bytes):
    """A byte entry kept as it was saved: its pickle names something beyond plain data, so it is not run."""


MAX_DEPTH = 32  # nesting a trainer's state dict never reaches; a deeper pickle is crafted
# flat keys average well under this many characters (a Lightning callback's key is ~150): a long prefix over many
# leaves (a 1 MB dict key over a list of a million Nones, 3 MB of pickle) would otherwise build a terabyte of keys
KEY_CHARS_PER_LEAF, KEY_CHARS_SLACK = 128, 1 << 20  # per key built, leaf or container
SCALARS = frozenset((int, float, str, bytes, bool, complex, type(None)))  # leaves, told apart without isinstance
_CONTAINERS = (dict, list, tuple, set, frozenset)


def _items(obj):
    """The (key, value) pairs of a container flatten descends into, None for a leaf."""
    if isinstance(obj, dict):
        return dict.items(obj)  # not obj.items: a pickle can set an instance attribute `items` on an OrderedDict
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        return enumerate(obj)
    return None


def _too_deep(key: str) -> FormatError:
    return FormatError(f"{key[:80]!r}: nested deeper than {MAX_DEPTH} levels; the file is corrupt or crafted")


def _dtype_key(k) -> str | None:
    """A key that is a dtype, or a few: Megatron's distributed optimizer (distrib_optim.pt) keys each grad buffer's
    state by its (param dtype, grad dtype), older ones by one dtype. Named by the dtypes (`bfloat16,float32`)."""
    dtypes = k if type(k) is tuple and 0 < len(k) <= 4 else (k,)
    if not all(isinstance(d, torch.dtype) for d in dtypes):
        return None
    return ",".join(str(d).removeprefix("torch.") for d in dtypes)


def flatten(obj, prefix: str = "", depth: int = 0, tuples: set[str] | None = None):
    """(flat key, leaf) of a nested state dict, depth first: dict keys and list/tuple indices joined with dots (a
    list of a million ids is a million keys, as torch.save'd optimizers are read everywhere). Raises FormatError
    past MAX_DEPTH, on a key that is neither a str nor an int, or when the keys it builds run past KEY_CHARS_PER_LEAF
    a key on average. One frame and one dict lookup per leaf, so a wide list costs what its pickle did. `tuples`,
    where given, gets the key of every tuple below `obj`: nest gives them back as tuples, not lists."""
    if depth > MAX_DEPTH:
        raise _too_deep(prefix)
    top = _items(obj)
    if top is None:
        yield prefix, obj
        return
    chars, keys, budget = 0, 0, KEY_CHARS_SLACK
    stack = [(prefix, depth + 1, iter(top))]
    while stack:
        base, child_depth, it = stack[-1]
        for k, v in it:
            if type(k) is not str and type(k) is not int and (not isinstance(k, (str, int)) or isinstance(k, bool)):
                named = _dtype_key(k)
                if named is None:
                    raise FormatError(f"{base[:80]!r}: has a key of type {type(k).__name__}, not a name or an index; "
                                      "the file is corrupt or crafted")
                k = named
            key = f"{base}.{k}" if base else str(k)
            if child_depth > MAX_DEPTH:
                raise _too_deep(key)
            chars += len(key)  # every key built counts, a container's too (a million {} under one long key)
            keys += 1
            if chars > budget:
                budget = KEY_CHARS_SLACK + KEY_CHARS_PER_LEAF * keys
                if chars > budget:
                    raise FormatError(f"{key[:80]!r}: its {keys} flat keys run to {chars} characters, more than "
                                      f"{KEY_CHARS_PER_LEAF} a key on average; the file is corrupt or crafted")
            sub = None if type(v) in SCALARS else _items(v)
            if sub is not None and len(v):  # an empty one is a leaf: it has no key below it to come back from
                # (LambdaLR's lr_lambdas [{}, {}], which its load_state_dict pops, were dropped from the restore)
                if tuples is not None and type(v) is tuple:
                    tuples.add(key)
                stack.append((key, child_depth + 1, iter(sub)))
                break
            yield key, v
        else:
            stack.pop()


def _listed(node, path: str = "", tuples=frozenset()):
    """`node` with every dict keyed "0".."n-1" turned back into the list the flat keys came from (a tuple where its
    path is in `tuples`)."""
    if not isinstance(node, dict):
        return node
    out = {k: _listed(v, f"{path}.{k}" if path else k, tuples) for k, v in node.items()}
    if out and sorted(out) == sorted(map(str, range(len(out)))):
        items = [out[str(i)] for i in range(len(out))]
        return tuple(items) if path in tuples else items
    return out


def nest(flat: dict[str, object], tuples=frozenset()) -> tuple[dict, list[str]]:
    """Flat dotted keys as the nesting they were flattened from (list indices back as lists, or as tuples where
    their key is in `tuples`: Adam's betas, Python's RNG state, which random.setstate takes only as a tuple); and
    the keys that clash with another (one a value, the other below it: crafted), left out."""
    root: dict = {}
    clashes = []
    for key, value in flat.items():
        parts = key.split(".")
        node = root
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                break
        if not isinstance(node, dict) or parts[-1] in node:
            clashes.append(key)
            continue
        node[parts[-1]] = value
    return _listed(root, "", tuples), clashes


_JSON_LEAVES = frozenset((str, int, float, bool, type(None)))


def rng_tensor(value) -> bool:
    """A torch RNG state as torch.get_rng_state() and torch.cuda.get_rng_state() give it: a CPU uint8 vector."""
    return (isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1
            and value.layout == torch.strided and value.device.type == "cpu")


def json_plain(value, rng: bool = False) -> bool:
    """True when `value` is what JSON holds (dicts keyed by strings, lists, tuples, strings, numbers, None) nested at
    most MAX_DEPTH deep: a trainer's hyper-parameters, which ckptbench writes back as JSON when it saves them.
    `rng`: torch RNG states (rng_tensor) too, which the torch and DCP formats keep beside the plain values."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if type(v) in _JSON_LEAVES or (rng and rng_tensor(v)):
            continue
        if depth >= MAX_DEPTH:
            return False
        if isinstance(v, dict):
            if not all(type(k) is str for k in dict.keys(v)):
                return False
            stack.extend((c, depth + 1) for c in dict.values(v))
        elif type(v) in (list, tuple):
            stack.extend((c, depth + 1) for c in v)
        else:
            return False
    return True


def walk_limit(pickle_bytes: int) -> int:
    """How many containers and items a walk of an unpickled object may visit: each costs the pickle at least one
    opcode byte unless shared through its memo, so a tree fits; a shared graph (a list holding one list twice,
    24 levels deep: 2**24 paths from 1.7 KiB) does not."""
    return (1 << 16) + 2 * pickle_bytes


def check_walk(obj, limit: int, where: str) -> None:
    """Refuses `obj` when walking it (as flatten does, shared references visited each time) visits more than
    `limit` nodes; stops at the limit, so the check itself is bounded. A container's items are counted in one go
    and only the containers among them are stacked: a list of a million ids is one step, not a million."""
    stack, seen = [obj], 1
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            children = dict.values(node)
            attrs = getattr(node, "__dict__", None)  # an OrderedDict's BUILD state (the stand-ins' attributes)
            if attrs:
                children = [*children, *attrs.values()]
        elif isinstance(node, _CONTAINERS):
            children = node
        else:
            continue
        seen += len(children)
        if seen > limit:
            raise FormatError(f"{where}: its pickle refers to the same containers so often that reading it would "
                              f"visit more than {limit} values; the file is corrupt or crafted")
        stack.extend([c for c in children if type(c) not in SCALARS and isinstance(c, _CONTAINERS)])


def holds_shape(shape) -> bool:
    """Whether torch can make a tensor of these whole-number dimensions: a zero-element one spans no bytes, so only
    this bounds its other dimensions (torch and safetensors refuse [2**62, 2**62, 0] on its element count or strides)."""
    n = 1
    for d in shape:
        n *= max(d, 1)
        if n >= 1 << 63:
            return False
    return True


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class FormatError(CkptbenchError):
    """A checkpoint file that cannot be read as its format says.

    The message stays one line whatever a crafted file puts in it: control characters (a tensor name with a
    newline, say) are written as escapes."""

    def __init__(self, message: str, *, exit_code: int | None = None):
        super().__init__(_CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", message), exit_code=exit_code)
