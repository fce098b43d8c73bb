"""torch.distributed.checkpoint directories (.metadata plus .distcp shards), loaded without a process group.

The .metadata pickle is the checkpoint's, not ours: it is unpickled through an allow-list of DCP's own classes,
then checked whole (types, whole-number offsets and lengths inside their files, chunks inside their tensors,
tensor bytes no more than the shards hold) before anything is allocated or read; every file DCP opens goes
through `confine`, so a storage path cannot reach outside the checkpoint directory.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import pickle
import warnings
from pathlib import PurePath

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem, _StorageInfo
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)

from ckptbench import confine
from ckptbench.errors import CkptbenchError
from ckptbench.formats import OPTIM_KEYS, CheckpointState, FormatError, MemoryFile, RawBytes, group_of

_DCP_META = "torch.distributed.checkpoint.metadata"
# What a DCP .metadata pickle legitimately names; anything else could run code when unpickled.
_ALLOWED = {
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("collections", "OrderedDict"),
    *((_DCP_META, n) for n in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata",
                                "_MEM_FORMAT_ENCODING")),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (module, name) not in _ALLOWED:
            raise FormatError(f".metadata names {module}.{name}, which is not DCP metadata: refused, since "
                              "unpickling it could run code; the checkpoint is not trustworthy")
        return super().find_class(module, name)


_CRAFTED = "the checkpoint is corrupt or crafted"
MAX_DIMS = 64


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63


def _dims(v) -> bool:
    return isinstance(v, tuple) and len(v) <= MAX_DIMS and all(_whole(d) for d in v)


class _ConfinedFS(FileSystem):
    """DCP's file access, read-only: a file the metadata names is served from the fused read's buffers (by name,
    for files at the top of the directory) or opened through `confine` (inside the directory, regular, no
    blocking open)."""

    def __init__(self, root, buffers: dict | None = None):
        super().__init__()
        self.root = root
        self.buffers = buffers or {}

    def _rel(self, path) -> str:
        try:
            return PurePath(str(path)).relative_to(PurePath(str(self.root))).as_posix()
        except ValueError:
            raise FormatError(f"{self.root}: DCP asked for {str(path)!r}, outside the checkpoint; {_CRAFTED}") from None

    def size_of(self, rel: str, where: str) -> int:
        """The size of a file the metadata (`where`) names, confined first; one line naming `where` otherwise."""
        if "/" not in rel and rel in self.buffers:
            return memoryview(self.buffers[rel]).nbytes
        try:
            real = confine.resolve(str(self.root), rel)
        except CkptbenchError as exc:
            why = str(exc).removeprefix(f"{self.root}: ")
            raise CkptbenchError(f"{where}: {why}", exit_code=exc.exit_code) from None
        try:
            return os.stat(real).st_size
        except OSError as exc:
            raise FormatError(f"{where}: names shard {rel!r}, which cannot be read ({exc.strerror}); "
                              "a shard is missing") from None

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        if "r" not in mode:
            raise FormatError(f"{self.root}: a DCP load tried to write {str(path)!r}; loads only read")
        rel = self._rel(path)
        buf = self.buffers.get(rel) if "/" not in rel else None
        if buf is not None:
            yield io.BufferedReader(MemoryFile(buf))
            return
        with os.fdopen(confine.open_member(str(self.root), rel), "rb") as stream:
            yield stream


def _storage_files(meta: Metadata, where: str, fs: _ConfinedFS) -> dict[str, int]:
    """rel path -> size of every shard the storage index names, each entry checked to lie inside its file."""
    storage = getattr(meta, "storage_data", None)
    if not isinstance(storage, dict):
        raise FormatError(f"{where}: storage_data is a {type(storage).__name__}, not DCP's storage index; {_CRAFTED}")
    files: dict[str, int] = {}
    for key, info in storage.items():
        if not isinstance(key, MetadataIndex) or not isinstance(info, _StorageInfo) \
                or not isinstance(getattr(key, "fqn", None), str) \
                or not (getattr(key, "offset", None) is None or _dims(key.offset)):
            raise FormatError(f"{where}: storage_data holds a {type(info).__name__}, not a storage entry; {_CRAFTED}")
        name = key.fqn[:80]
        rel = getattr(info, "relative_path", None)
        rel = str(rel) if isinstance(rel, PurePath) else rel
        off, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not isinstance(rel, str) or not _whole(off) or not _whole(length):
            raise FormatError(f"{where}: storage entry {name!r} has path {str(rel)[:80]!r}, offset "
                              f"{str(off)[:20]} and length {str(length)[:20]}; {_CRAFTED}")
        if getattr(info, "transform_descriptors", None):
            raise FormatError(f"{where}: storage entry {name!r} is stored through transforms "
                              f"({str(info.transform_descriptors)[:60]}), which ckptbench does not load")
        if rel not in files:
            files[rel] = fs.size_of(rel, where)
        if off + length > files[rel]:
            raise FormatError(f"{where}: storage entry {name!r} lies at {off}+{length}, past the "
                              f"{files[rel]} bytes of {rel!r}; {_CRAFTED}")
    return files


def _no_overlap(chunks: list, what: str) -> None:
    """No two chunks share an element: with the coverage count equal to the size, chunks that overlapped would
    leave a region no chunk writes (memory handed back as it was allocated). Swept in order of the first
    offset, so a tensor sharded along one dimension costs a sort, not a comparison of every pair."""
    boxes = sorted((tuple(c.offsets), tuple(c.sizes)) for c in chunks if all(c.sizes))
    for i, (off, sz) in enumerate(boxes):
        for off2, sz2 in boxes[i + 1:]:
            if off2[0] >= off[0] + sz[0] if off else True:
                break
            if all(o2 < o + n and o < o2 + n2 for o, n, o2, n2 in zip(off, sz, off2, sz2)):
                raise FormatError(f"{what} has chunks at {off[:8]} and {off2[:8]} that overlap; {_CRAFTED}")


def _tensor_bytes(fqn: str, md, storage: dict, where: str) -> int:
    """The bytes one tensor entry will allocate, its chunks checked to lie inside it, cover it, and be stored."""
    what = f"{where}: entry {fqn[:80]!r}"
    props = getattr(md, "properties", None)
    dtype, size, chunks = getattr(props, "dtype", None), getattr(md, "size", None), getattr(md, "chunks", None)
    if not isinstance(props, TensorProperties) or not isinstance(dtype, torch.dtype) or not _dims(size) \
            or not isinstance(chunks, list):
        raise FormatError(f"{what} has dtype {str(dtype)[:30]}, size {str(size)[:60]}, not a tensor's; {_CRAFTED}")
    covered = 0
    for c in chunks:
        offsets, sizes = getattr(c, "offsets", None), getattr(c, "sizes", None)
        if not isinstance(c, ChunkStorageMetadata) or not _dims(offsets) or not _dims(sizes) \
                or len(offsets) != len(size) or len(sizes) != len(size) \
                or any(o + n > d for o, n, d in zip(offsets, sizes, size)):
            raise FormatError(f"{what} has a chunk at {str(offsets)[:60]} of {str(sizes)[:60]}, not inside its "
                              f"size {tuple(size)}; {_CRAFTED}")
        if MetadataIndex(fqn, offsets) not in storage:
            raise FormatError(f"{what} has a chunk at {tuple(offsets)} that no shard stores; {_CRAFTED}")
        covered += math.prod(sizes)
    numel = math.prod(size)
    _no_overlap(chunks, what)
    if covered != numel:
        raise FormatError(f"{what} has chunks covering {covered} of its {numel} elements; {_CRAFTED}")
    return numel * dtype.itemsize


def _check_metadata(meta, where: str, fs: _ConfinedFS) -> Metadata:
    """The unpickled .metadata checked whole before anything is allocated or read (see the module docstring)."""
    if not isinstance(meta, Metadata):
        raise FormatError(f"{where}: holds a {type(meta).__name__}, not DCP metadata; {_CRAFTED}")
    entries = getattr(meta, "state_dict_metadata", None)
    storage_meta = getattr(meta, "storage_meta", None)
    if not isinstance(entries, dict) or (storage_meta is not None and not isinstance(storage_meta, StorageMeta)):
        raise FormatError(f"{where}: state_dict_metadata or storage_meta is not DCP's; {_CRAFTED}")
    files = _storage_files(meta, where, fs)
    total = 0
    for fqn, md in entries.items():
        if not isinstance(fqn, str) or not isinstance(md, (TensorStorageMetadata, BytesStorageMetadata)):
            raise FormatError(f"{where}: entry {str(fqn)[:80]!r} is a {type(md).__name__}, not a tensor or bytes "
                              f"entry; {_CRAFTED}")
        if isinstance(md, TensorStorageMetadata):
            total += _tensor_bytes(fqn, md, meta.storage_data, where)
    if total > sum(files.values()):
        raise FormatError(f"{where}: declares {total} bytes of tensors, its shards hold {sum(files.values())}; "
                          f"{_CRAFTED}")
    return meta


class SafeReader(FileSystemReader):
    """torch's reader unpickles .metadata with plain pickle and opens any path it names; this one admits only
    DCP's own metadata classes, checks what they hold, and opens files only inside the directory."""

    def __init__(self, path, buffers: dict | None = None):
        super().__init__(path)
        self.fs = _ConfinedFS(self.path, buffers)

    def read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            try:
                metadata = _MetadataUnpickler(f).load()
            except FormatError:
                raise
            except Exception as exc:  # a damaged pickle raises many kinds
                raise FormatError(f"{path}: unreadable DCP metadata ({type(exc).__name__}); not a DCP checkpoint") from None
        metadata = _check_metadata(metadata, str(path), self.fs)
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


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


def _is_own(fqns) -> bool:
    """ckptbench's own layout (model.*, optim.<name>.<part>, step), which restores into its GPT."""
    return all(f == "step" or f.startswith("model.") or (f.startswith("optim.") and f.rsplit(".", 1)[-1] in _OWN_PARTS)
               for f in fqns)


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


def _byte_entry(data: bytes):
    """A byte entry's value, unpickled only by torch's weights_only unpickler (DCP's own loader runs any pickle),
    which here also admits io.BytesIO (trainers save buffers; rebuilding one runs no code): plain data, tensors
    and buffers come back as values; anything else stays the bytes it was saved as, marked RawBytes."""
    try:
        with torch.serialization.safe_globals([io.BytesIO]):
            value = torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except Exception:  # refused (a global beyond plain data) or not a torch.save stream: keep the bytes
        return RawBytes(data)
    return value.getvalue() if isinstance(value, io.BytesIO) else value


def _chunk(stream, fqn: str, rel: str, info, sizes) -> torch.Tensor:
    """One stored chunk (a torch.save of the chunk tensor), loaded weights_only and checked against its extent."""
    stream.seek(info.offset)
    raw = stream.read(info.length)
    where = f"{rel}: entry {fqn[:80]!r} at {info.offset}+{info.length}"
    if len(raw) != info.length:
        raise FormatError(f"{where}: the shard ends after {len(raw)} of those bytes; the shard is truncated")
    try:
        t = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
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
        with reader.fs.create_stream(os.path.join(str(reader.path), rel), "rb") as stream:
            for _, key, info in sorted(items, key=lambda i: i[0]):
                md = meta.state_dict_metadata.get(key.fqn)
                if isinstance(md, BytesStorageMetadata):
                    stream.seek(info.offset)
                    values[key.fqn] = _byte_entry(stream.read(info.length))
                    continue
                sizes = chunks.get((key.fqn, tuple(key.offset or ())))
                if md is None or sizes is None:
                    continue  # stored but not declared: nothing to restore it into (checked: declared ones are stored)
                t = _chunk(stream, key.fqn, rel, info, sizes)
                view = tensors[key.fqn]
                for dim, (off, n) in enumerate(zip(key.offset, sizes)):
                    view = view.narrow(dim, off, n)
                if t.dtype != view.dtype:
                    raise FormatError(f"{rel}: entry {key.fqn[:80]!r} holds {t.dtype}, the metadata says "
                                      f"{view.dtype}; {_CRAFTED}")
                view.copy_(t)
    return values


def _tree(meta: Metadata, flat: dict[str, object]) -> dict | None:
    """The checkpoint's own nesting, from the paths DCP records per key (planner_data); None when it records
    none or records something that is not a path (a crafted metadata is not trusted to nest)."""
    paths = getattr(meta, "planner_data", None)
    if not isinstance(paths, dict) or not paths:
        return None
    root: dict = {}
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
                    node.extend([None] * (k + 1 - len(node)))
                node[k] = child
            if not isinstance(child, (dict, list)) or isinstance(child, list) != isinstance(nxt, int):
                return None
            node = child
        if isinstance(node, list):
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
            values = _fill(reader, meta, tensors, directory)
    except CkptbenchError:
        raise
    except OSError as exc:
        raise FormatError(f"{directory}: unreadable ({exc.strerror}); check that its files are whole") from None
    flat = {**tensors, **values}
    if _is_own(flat):
        state = CheckpointState({})
        for fqn, t in tensors.items():
            parts = fqn.split(".")
            if parts[0] == "model":
                state.model[".".join(parts[1:])] = t
            elif parts[0] == "optim":
                state.optim.setdefault(".".join(parts[1:-1]), {})[parts[-1]] = t
        step = flat.get("step")
        state.step = int(step) if isinstance(step, torch.Tensor) and step.numel() == 1 else 0
        return state
    state = CheckpointState({}, tree=_tree(meta, flat))
    for fqn, v in flat.items():
        if isinstance(v, torch.Tensor) and group_of(fqn) == "model":
            state.model[fqn.removeprefix("model.")] = v
        else:
            state.extra[fqn] = v
    return state
