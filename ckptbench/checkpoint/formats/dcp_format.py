"""torch.distributed.checkpoint directories (.metadata plus .distcp shards), loaded without a process group.

Any layout loads: the state dict is built from the checkpoint's own metadata (read and checked whole by
dcp_metadata before anything is allocated), each tensor allocated whole and its chunks, saved by any number of
ranks, copied into place; byte entries go through the weights_only unpickler and are never run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import warnings

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata

from ckptbench.core.errors import CkptbenchError
from ckptbench.checkpoint.formats.state import (OPTIM_KEYS, CheckpointState, FormatError, RawBytes,
                                               check_walk, group_of, json_plain, nest, walk_limit)
from ckptbench.checkpoint.formats.dcp_metadata import _CRAFTED, MAX_DIMS, SafeReader, _whole
from ckptbench.checkpoint.formats.torch_format import numpy_allowed, prescanned, tensor_in_place
from ckptbench.checkpoint.layouts import MEGATRON_COMMON, MEGATRON_META
from ckptbench.core import jsontext

class _DeterministicWriter(FileSystemWriter):
    """Same seed, same bytes: torch's .metadata records the temporary path, a random save id, and its
    storage index in the order the writer threads happened to finish."""

    def storage_meta(self):
        return None

    def finish(self, metadata, results):
        def key(w):
            return (w.index.fqn, tuple(w.index.offset or ()), w.index.index or 0)

        return super().finish(metadata, [sorted(r, key=key) for r in results])


@contextlib.contextmanager
def _quiet():
    """Single-process DCP warns that torch.distributed is uninitialized: expected here, and noise on stderr."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def write(directory: str, state: CheckpointState, assignment: list[list[str]]) -> list[tuple[str, str, int | None]]:
    """One .distcp file per writer thread: with N ranks' worth of threads the layout has N shards."""
    sd = {"model": state.model, "optim": state.optim, "step": torch.tensor(state.step)}
    before = set(os.listdir(directory))
    with _quiet():
        dcp.save(sd, storage_writer=_DeterministicWriter(directory, thread_count=len(assignment)), no_dist=True)
    new = sorted(set(os.listdir(directory)) - before)
    written = []
    for i, name in enumerate(n for n in new if n.endswith(".distcp")):
        written.append((name, "model", i))
    written += [(n, "meta", None) for n in new if not n.endswith(".distcp")]
    return written


_OWN_PARTS = set(OPTIM_KEYS)


_OWN_PLAIN = ("hparams", "trainer_state")  # non-tensor values `save` writes beside them, as byte entries


def _plain_of(fqn: str) -> bool:
    return fqn.split(".", 1)[0] in _OWN_PLAIN


def _is_own(fqns) -> bool:
    """ckptbench's own layout (model.*, optim.<name>.<part>, step; hparams and trainer_state), which restores into
    its GPT."""
    return all(f == "step" or f.startswith("model.") or _plain_of(f)
               or (f.startswith("optim.") and f.rsplit(".", 1)[-1] in _OWN_PARTS) for f in fqns)


def _own_plain(meta: Metadata, flat: dict[str, object]) -> tuple[dict, dict] | None:
    """hparams and trainer_state as `save` wrote them: nested by the paths DCP recorded, else by their dotted keys;
    None where they are not plain data (another program's `hparams`: the checkpoint is not ckptbench's layout)."""
    plain = {k: v for k, v in flat.items() if _plain_of(k)}
    tree = _tree(meta, plain) if plain else {}
    tree = tree if tree is not None else nest(plain)[0]
    out = tuple(tree.get(k, {}) if isinstance(tree, dict) else None for k in _OWN_PLAIN)
    return out if all(isinstance(d, dict) and json_plain(d, rng=True) for d in out) else None


def _allocate(meta: Metadata, where: str) -> dict[str, torch.Tensor]:
    """An empty tensor, shaped by the (already checked) metadata, for every tensor entry."""
    out = {}
    for fqn, md in meta.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            try:
                out[fqn] = torch.empty(tuple(md.size), dtype=md.properties.dtype)
            except (RuntimeError, TypeError) as exc:
                raise FormatError(f"{where}: entry {fqn[:80]!r} cannot be allocated as {md.properties.dtype} "
                                  f"({str(exc).splitlines()[0][:100] if str(exc) else ''}); {_CRAFTED}") from None
    return out


def _why(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return f"{type(exc).__name__}: {lines[0][:120]}" if lines else type(exc).__name__


def _with_data(value) -> bool:
    """Every tensor in `value` (already bounded by check_walk) a CPU tensor with its data, no larger than its
    storage: a meta or sparse tensor, or a stride-0 view claiming 2**31 elements of 4 bytes, would reach the scan
    and the clone (a traceback, or an allocation of the claim)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            if v.layout != torch.strided or v.is_nested or v.device.type != "cpu":
                return False
            need = v.numel() * v.element_size()
            if need and need > v.untyped_storage().nbytes() - v.storage_offset() * v.element_size():
                return False
        elif type(v).__module__ == "numpy" and getattr(getattr(v, "dtype", None), "kind", None) not in NUMBERS:
            return False  # a numpy array that is not numbers, whatever its pickle claims
        elif isinstance(v, dict):
            stack.extend(dict.values(v))
        elif isinstance(v, (list, tuple, set, frozenset)):
            stack.extend(v)
    return True


NUMBERS = ("b", "i", "u", "f", "c")  # the numpy kinds a byte entry's arrays may hold


def load_byte_entry(data: bytes):
    """A byte entry's value, unpickled only by torch's weights_only unpickler (DCP's own loader runs any pickle),
    which here also admits io.BytesIO (trainers save buffers; rebuilding one runs no code) and numeric numpy arrays
    (Megatron keeps numpy's RNG state in one): plain data, tensors with their data, buffers and numbers come back as
    values; anything else stays the bytes it was saved as, marked RawBytes."""
    try:
        prescanned(data, "a byte entry")  # torch's unpickler hashed a key of 1.2 KB of nested tuples for hours
        with torch.serialization.safe_globals([io.BytesIO]), numpy_allowed():
            value = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        check_walk(value, walk_limit(len(data)), "a byte entry")  # a shared graph (2**40 paths from 4 KiB) is kept
    except Exception:  # refused (a global beyond plain data) or not a torch.save stream: keep the bytes
        return RawBytes(data)
    if not _with_data(value):
        return RawBytes(data)
    return value.getvalue() if isinstance(value, io.BytesIO) else value


def _chunk(stream, buf, fqn: str, rel: str, info, sizes) -> torch.Tensor:
    """One stored chunk (a torch.save of the chunk tensor), loaded weights_only and checked against its extent:
    in place from `buf` (the shard's read buffer, when the fused read has it) as a view of its bytes, which the
    caller copies into place once; else read out of `stream` and loaded."""
    where = f"{rel}: entry {fqn[:80]!r} at {info.offset}+{info.length}"
    raw = memoryview(buf).cast("B")[info.offset:info.offset + info.length] if buf is not None else None
    if raw is None:
        stream.seek(info.offset)
        raw = stream.read(info.length)
    if len(raw) != info.length:
        raise FormatError(f"{where}: the shard ends after {len(raw)} of those bytes; the shard is truncated")
    t = tensor_in_place(raw, where) if buf is not None else None
    try:
        if t is None:
            prescanned(raw, where)
            t = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
    except FormatError:  # the prescan's own line, whole: wrapped, it was cut mid-word inside another
        raise
    except Exception as exc:  # torch's reader fails on bad bytes with whatever they provoke
        raise FormatError(f"{where}: not a readable tensor ({_why(exc)}); the shard is corrupt") from None
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != tuple(sizes):
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise FormatError(f"{where}: holds {got}, the metadata says a chunk of {tuple(sizes)}; {_CRAFTED}")
    return t


def _fill(reader: "SafeReader", meta: Metadata, tensors: dict[str, torch.Tensor], directory: str) -> dict[str, object]:
    """Every stored chunk copied into its place in the full tensor (chunks from any number of ranks reassembled),
    and every byte entry loaded safely; file by file, in offset order. Returns the byte entries' values."""
    chunks = {}
    for fqn, md in meta.state_dict_metadata.items():
        if isinstance(md, TensorStorageMetadata):
            for c in md.chunks:
                chunks[(fqn, tuple(c.offsets))] = c.sizes
    per_file: dict[str, list] = {}
    for key, info in meta.storage_data.items():
        per_file.setdefault(str(info.relative_path), []).append((info.offset, key, info))
    values: dict[str, object] = {}
    for rel, items in sorted(per_file.items()):
        buf = reader.fs.buffers.get(rel) if "/" not in rel else None  # the shard as the fused read landed it
        with reader.fs.create_stream(os.path.join(str(reader.path), rel), "rb") as stream:
            for _, key, info in sorted(items, key=lambda i: i[0]):
                md = meta.state_dict_metadata.get(key.fqn)
                if isinstance(md, BytesStorageMetadata):
                    stream.seek(info.offset)
                    values[key.fqn] = load_byte_entry(stream.read(info.length))
                    continue
                sizes = chunks.get((key.fqn, tuple(key.offset or ())))
                if md is None or sizes is None:
                    continue  # stored but not declared: nothing to restore it into (checked: declared ones are stored)
                t = _chunk(stream, buf, key.fqn, rel, info, sizes)
                view = tensors[key.fqn]
                for dim, (off, n) in enumerate(zip(key.offset, sizes)):
                    view = view.narrow(dim, off, n)
                if t.dtype != view.dtype:
                    raise FormatError(f"{rel}: entry {key.fqn[:80]!r} holds {t.dtype}, the metadata says "
                                      f"{view.dtype}; {_CRAFTED}")
                view.copy_(t)
    return values


MEGATRON_META_MAX = 1 << 16  # metadata.json names a backend and its version: a hundred bytes


# megatron-core's ShardedObject.unique_key: its key, then /shard_<global offset>_<global shape>, each '.'-joined
_SHARDED_OBJECT = re.compile(r"/shard_[0-9]+(?:\.[0-9]+)*_[0-9]+(?:\.[0-9]+)*$", re.ASCII)


def _megatron(reader: SafeReader) -> bool:
    """Whether megatron-core's dist_checkpointing wrote this DCP checkpoint: its metadata.json names the torch_dist
    backend and its common.pt lies beside (as layouts.is_megatron_dist has it; a metadata.json alone is anyone's). It
    saves each ShardedObject as a torch.save of a list, one item per object sharing that key on the rank, and its
    load hands the resume the item, not the list."""
    path = os.path.join(str(reader.path), MEGATRON_META)
    try:
        reader.fs.size_of(MEGATRON_COMMON, f"{reader.path}/{MEGATRON_COMMON}")
        with reader.fs.create_stream(path, "rb") as f:
            raw = f.read(MEGATRON_META_MAX + 1)
    except (CkptbenchError, OSError):  # absent, not a regular file: not it
        return False
    if len(raw) > MEGATRON_META_MAX:
        return False
    try:
        doc = jsontext.loads(raw)  # UTF-8 text without a byte order mark, as megatron-core's json.load(open()) reads
    except (ValueError, RecursionError):
        try:  # what json.loads takes of bytes besides (a BOM, UTF-16) and Megatron's load fails on: not restored ok
            lenient = json.loads(raw)
        except (ValueError, RecursionError):
            return False  # no JSON to anyone: not it
        if isinstance(lenient, dict) and lenient.get("sharded_backend") == "torch_dist":
            raise FormatError(f"{path}: names the torch_dist backend behind a byte order mark or in UTF-16/32, "
                              "which megatron-core's load (json.load of UTF-8 text) fails on; rewrite it as UTF-8")
        return False
    return isinstance(doc, dict) and doc.get("sharded_backend") == "torch_dist"


def _objects(reader: SafeReader, values: dict[str, object]) -> dict[str, object]:
    """The byte entries as the checkpoint's writer loads them: a Megatron ShardedObject (keyed as megatron-core keys
    one) saved as a torch.save of a list, one item per object sharing that key on the rank, is handed to the resume
    as its one item; any other byte entry, and any other DCP's, as it is (a one-item list a user saved stays one)."""
    if not values or not _megatron(reader):
        return values
    return {k: v[0] if type(v) is list and len(v) == 1 and _SHARDED_OBJECT.search(k) else v
            for k, v in values.items()}


def _tree(meta: Metadata, flat: dict[str, object]) -> dict | None:
    """The checkpoint's own nesting, from the paths DCP records per key (planner_data); None when it records
    none or records something that is not a path (a crafted metadata is not trusted to nest)."""
    paths = getattr(meta, "planner_data", None)
    if not isinstance(paths, dict) or not paths:
        return None
    root: dict = {}
    # list slots the nesting may fill: a list index names an entry below it, so a real nesting needs few more
    # slots than entries; crafted indices up to 2**20 at every level would otherwise allocate gigabytes
    slots = 2 * len(flat) + 1024
    for fqn, value in flat.items():
        path = paths.get(fqn)
        if not isinstance(path, tuple) or not path or len(path) > MAX_DIMS \
                or not all(isinstance(k, str) or (_whole(k) and k < 1 << 20) for k in path):
            return None
        node = root
        for k, nxt in zip(path, path[1:]):
            child = node[k] if (isinstance(node, dict) and k in node) or (isinstance(node, list) and k < len(node)) \
                else None
            if child is None:
                child = [] if isinstance(nxt, int) else {}
                if isinstance(node, list):
                    slots -= max(0, k + 1 - len(node))
                    if slots < 0:
                        return None
                    node.extend([None] * (k + 1 - len(node)))
                node[k] = child
            if not isinstance(child, (dict, list)) or isinstance(child, list) != isinstance(nxt, int):
                return None
            node = child
        if isinstance(node, list):
            slots -= max(0, path[-1] + 1 - len(node))
            if slots < 0:
                return None
            node.extend([None] * (path[-1] + 1 - len(node)))
        node[path[-1]] = value
    return root


def load_dir(directory: str, buffers: dict | None = None) -> CheckpointState:
    """Any DCP checkpoint, built from its own metadata: every tensor at its key, allocated whole, its chunks
    (from however many ranks saved it) copied in place; byte entries loaded without running code.

    ckptbench's own layout fills `model`/`optim`/`step`; any other puts model tensors (a `model.` prefix
    dropped) in `model` and everything else in `extra` by key, with the nesting in `tree`. `buffers` (file name →
    bytes already read) serves the shards and .metadata from memory."""
    reader = SafeReader(directory, buffers)
    try:
        meta = reader.read_metadata()
        tensors = _allocate(meta, f"{directory}/.metadata")
        with _quiet():
            values = _objects(reader, _fill(reader, meta, tensors, directory))
    except CkptbenchError:
        raise
    except OSError as exc:
        raise FormatError(f"{directory}: unreadable ({exc.strerror}); check that its files are whole") from None
    return _state_of(meta, tensors, values)


def from_pieces(directory: str, tensors: dict[str, torch.Tensor], values: dict[str, object],
                buffers: dict | None = None, *, part: bool = False) -> CheckpointState:
    """The state of a DCP checkpoint whose chunks were read by byte range (checkpoint/shares.tensors_of: every
    tensor by key, each a view of the range its elements landed in or assembled from its chunks) and whose byte
    entries are loaded: laid out as load_dir lays out a whole-file read, from the same metadata (`buffers`: file
    name → bytes already read, .metadata among them). `part`: `tensors` and `values` hold other folders' keys too
    (FSDP's model and optimizer folders, read as one: tiles.plan refuses keys two folders share); this folder's
    are the ones its metadata declares."""
    reader = SafeReader(directory, buffers)
    meta = reader.read_metadata()
    declared = {fqn for fqn, md in meta.state_dict_metadata.items() if isinstance(md, TensorStorageMetadata)}
    if part:
        tensors = {k: tensors[k] for k in declared if k in tensors}
        values = {k: values[k] for k, md in meta.state_dict_metadata.items()
                  if isinstance(md, BytesStorageMetadata) and k in values}
    values = _objects(reader, values)
    if set(tensors) != declared:  # the plan and the metadata are one; a file changed between the two reads
        raise FormatError(f"{directory}/.metadata: changed while it was read (its tensors differ from the plan's); "
                          "run the restore again once nothing writes the checkpoint")
    return _state_of(meta, tensors, values)


def _state_of(meta: Metadata, tensors: dict[str, torch.Tensor], values: dict[str, object]) -> CheckpointState:
    """ckptbench's own layout into model/optim/step; any other's model tensors (a `model.` prefix dropped) into
    `model`, everything else into `extra` by key, with the nesting in `tree`."""
    flat = {**tensors, **values}
    plain = _own_plain(meta, flat) if _is_own(flat) else None
    if plain is not None:
        state = CheckpointState({})
        for fqn, t in tensors.items():
            parts = fqn.split(".")
            if parts[0] == "model":
                state.model[".".join(parts[1:])] = t
            elif parts[0] == "optim":
                state.optim.setdefault(".".join(parts[1:-1]), {})[parts[-1]] = t
        step = flat.get("step")
        state.step = int(step) if isinstance(step, torch.Tensor) and step.numel() == 1 else 0
        state.hparams, state.trainer = plain
        state.saved_keys = set(flat)
        return state
    state = CheckpointState({}, tree=_tree(meta, flat), saved_keys=set(flat))
    for fqn, v in flat.items():
        if isinstance(v, torch.Tensor) and group_of(fqn) == "model":
            state.model[fqn.removeprefix("model.")] = v
        else:
            state.extra[fqn] = v
    return state
