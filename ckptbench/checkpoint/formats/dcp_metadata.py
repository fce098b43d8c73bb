"""Reading a torch.distributed.checkpoint's .metadata safely: an allow-list unpickler of DCP's own classes, then
the whole index checked (types, whole-number offsets and lengths inside their files, chunks inside their tensors
and not overlapping, tensor bytes no more than the shards hold) before anything is allocated or read; every file
goes through `confine`, so a storage path cannot reach outside the checkpoint directory."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import os
import pickle
import stat
from pathlib import PurePath

import torch
from torch.distributed.checkpoint import FileSystemReader, planner
from torch.distributed.checkpoint.filesystem import FileSystem, _StorageInfo
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)

from ckptbench.checkpoint import confine
from ckptbench.checkpoint.quote import quote
from ckptbench.core.errors import CkptbenchError
from ckptbench.checkpoint.formats.state import FormatError, MemoryFile, holds_shape

_DCP_META = "torch.distributed.checkpoint.metadata"
_DCP_PLAN = "torch.distributed.checkpoint.planner"
# What a DCP .metadata pickle legitimately names; anything else could run code when unpickled. The planner's plain
# dataclasses and its enum are there because Megatron-core keeps every rank's save plan in the metadata
# (`all_local_plans`, to reuse plans across saves): every torch_dist checkpoint Megatron writes names them.
_ALLOWED = {
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("collections", "OrderedDict"),
    *((_DCP_META, n) for n in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties",
                                "TensorStorageMetadata", "ChunkStorageMetadata", "BytesStorageMetadata",
                                "_MEM_FORMAT_ENCODING")),
    *((_DCP_PLAN, n) for n in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData")),
}


# looked up in torch's own namespace, never through getattr: torch imports _dynamo/_inductor on first getattr
DTYPES = {n: v for n, v in vars(torch).items() if isinstance(v, torch.dtype)}
# dtypes DCP records but a chunk cannot be restored in: a quantized tensor's scale and zero point are not in the
# metadata (an empty one has no quantizer: torch's internal assert on the first narrow), sub-byte ones have no copy
_UNRESTORABLE = {d for n in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4", *(f"{u}int{i}" for u in ("", "u")
                                                                                  for i in range(1, 8)))
                 if isinstance(d := DTYPES.get(n), torch.dtype)}


# the classes whose objects a .metadata pickle fills in (BUILD): never a class, function or enum member it names,
# which are torch's own and live on after the load (a BUILD on torch.serialization._get_layout replaced its cache of
# layouts for every later torch.load of the process, one on pathlib.PosixPath set attributes of the class)
_BUILDABLE = frozenset((MetadataIndex, _StorageInfo, ChunkStorageMetadata, TensorProperties, TensorStorageMetadata,
                        BytesStorageMetadata, StorageMeta, Metadata, *(getattr(planner, n) for n in (
                            "SavePlan", "WriteItem", "TensorWriteData", "BytesIOWriteData"))))
MAX_NAME = 4096  # characters of a key's name (a tensor's fqn): `save --format dcp` writes none longer


def _scalar(x) -> bool:
    """A name or number whose hash, text or use costs little however often the pickle hands it out again (a GET of
    a few bytes): the hash of a long int or a tuple is not cached, and one of 10**5 digits behind 10**5 keys is
    10**10 steps."""
    if type(x) is int:
        return x.bit_length() <= 64
    if isinstance(x, (str, bytes)):
        return len(x) <= MAX_NAME
    return isinstance(x, (float, bool, type(None)))


def _flat(v) -> bool:
    """A small scalar, or a tuple or list of at most MAX_DIMS of them (a torch.Size, a path's parts)."""
    return _scalar(v) or isinstance(v, (tuple, list)) and len(v) <= MAX_DIMS and all(_scalar(x) for x in v)


def _dims_shown(v) -> str:
    return quote(tuple(v) if _dims(v) else v, 60)


def _key(k) -> bool:
    """A key a .metadata dict holds (a name, a MetadataIndex of a name and an offset), flat: a key of tuples
    nesting the same tuple twice at each of 40 levels, 500 bytes of pickle, took hours to hash."""
    if type(k) is MetadataIndex:
        return isinstance(vars(k).get("fqn"), str) and _flat(vars(k).get("offset")) and _flat(vars(k).get("index"))
    return _flat(k)


class _MetadataUnpickler(pickle._Unpickler):  # the pure-Python unpickler: a crafted memo index costs it nothing
    dispatch = dict(pickle._Unpickler.dispatch)

    def find_class(self, module: str, name: str):
        if module == "torch" and name in DTYPES:
            return DTYPES[name]
        if (module, name) not in _ALLOWED:
            raise FormatError(f"names {f'{module}.{name}'[:80]}, which is not DCP metadata: refused, since "
                              "unpickling it could run code; the checkpoint is not trustworthy")
        return super().find_class(module, name)

    def _keys(self, keys) -> None:
        for k in keys:
            if not _key(k):
                raise FormatError(f"has a key that is a {type(k).__name__} holding more than names and numbers, "
                                  f"which DCP metadata never has; {_CRAFTED}")

    def _args(self, func, args) -> None:
        if not isinstance(args, tuple) or not all(_flat(a) for a in args):
            raise FormatError(f"builds {getattr(func, '__name__', type(func).__name__)[:60]} from more than names and "
                              f"numbers, which DCP metadata never does; {_CRAFTED}")

    def load_build(self):
        inst = self.stack[-2]
        if type(inst) not in _BUILDABLE:
            raise FormatError(f"sets the state of {getattr(inst, '__name__', type(inst).__name__)[:60]}, which DCP "
                              f"metadata never does: refused, since it would change torch's own objects; {_CRAFTED}")
        super().load_build()
    dispatch[pickle.BUILD[0]] = load_build

    def load_reduce(self):
        self._args(self.stack[-2], self.stack[-1])
        super().load_reduce()
    dispatch[pickle.REDUCE[0]] = load_reduce

    def load_newobj(self):  # cls.__new__(cls, *args): an enum's looks its argument up (a hash) or repr()s it
        self._args(self.stack[-2], self.stack[-1])
        super().load_newobj()
    dispatch[pickle.NEWOBJ[0]] = load_newobj

    def load_newobj_ex(self):
        cls, args, kwargs = self.stack[-3:]
        self._args(cls, args)
        self._args(cls, tuple(kwargs.values()) if isinstance(kwargs, dict) else kwargs)
        super().load_newobj_ex()
    dispatch[pickle.NEWOBJ_EX[0]] = load_newobj_ex

    def _instantiate(self, klass, args):
        self._args(klass, tuple(args))
        super()._instantiate(klass, args)

    def load_setitem(self):
        self._keys(self.stack[-2:-1])
        super().load_setitem()
    dispatch[pickle.SETITEM[0]] = load_setitem

    def load_setitems(self):
        self._keys(self.stack[::2])  # since the MARK, the stack holds only the items
        super().load_setitems()
    dispatch[pickle.SETITEMS[0]] = load_setitems

    def load_dict(self):
        self._keys(self.stack[::2])
        super().load_dict()
    dispatch[pickle.DICT[0]] = load_dict

    def load_additems(self):
        self._keys(self.stack)
        super().load_additems()
    dispatch[pickle.ADDITEMS[0]] = load_additems

    def load_frozenset(self):
        self._keys(self.stack)
        super().load_frozenset()
    dispatch[pickle.FROZENSET[0]] = load_frozenset


_CRAFTED = "the checkpoint is corrupt or crafted"
MAX_DIMS = 64
MAX_METADATA = 1 << 30  # a 405B model's .metadata is tens of MB; a GiB of it is crafted


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
        try:  # a symlink, even to a shard inside, is refused: links to one shard made its bytes count N times
            real = confine.resolve(str(self.root), rel, links=False)
        except CkptbenchError as exc:
            why = str(exc).removeprefix(f"{self.root}: ")
            raise CkptbenchError(f"{where}: {why}", exit_code=exc.exit_code) from None
        try:
            st = os.stat(real)
        except OSError as exc:
            raise FormatError(f"{where}: names shard {quote(rel)}, which cannot be read ({exc.strerror}); "
                              "a shard is missing") from None
        if not stat.S_ISREG(st.st_mode):
            raise FormatError(f"{where}: names shard {quote(rel)}, which is not a regular file; {_CRAFTED}")
        return st.st_size

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        if "r" not in mode:
            raise FormatError(f"{self.root}: a DCP load tried to write {str(path)!r}; loads only read")
        rel = self._rel(path)
        buf = self.buffers.get(rel) if "/" not in rel else None
        if buf is not None:
            yield io.BufferedReader(MemoryFile(buf))
            return
        with os.fdopen(confine.open_member(str(self.root), rel, links=False), "rb") as stream:
            yield stream


def _storage_files(meta: Metadata, where: str, fs: _ConfinedFS) -> dict[str, int]:
    """rel path -> size of every shard the storage index names, each entry checked to lie inside its file."""
    storage = getattr(meta, "storage_data", None)
    if not isinstance(storage, dict):
        raise FormatError(f"{where}: storage_data is a {type(storage).__name__}, not DCP's storage index; {_CRAFTED}")
    files: dict[str, int] = {}
    spans: dict[str, list] = {}
    for key, info in dict.items(storage):
        if not isinstance(key, MetadataIndex) or not isinstance(info, _StorageInfo) \
                or not isinstance(getattr(key, "fqn", None), str) \
                or not (getattr(key, "offset", None) is None or _dims(key.offset)):
            raise FormatError(f"{where}: storage_data holds a {type(info).__name__}, not a storage entry; {_CRAFTED}")
        name = key.fqn[:80]
        rel = getattr(info, "relative_path", None)
        rel = str(rel) if isinstance(rel, PurePath) else rel
        off, length = getattr(info, "offset", None), getattr(info, "length", None)
        if not isinstance(rel, str) or not _whole(off) or not _whole(length):
            raise FormatError(f"{where}: storage entry {name!r} has path {quote(rel, 80)}, offset "
                              f"{quote(off, 20)} and length {quote(length, 20)}; {_CRAFTED}")
        if getattr(info, "transform_descriptors", None):
            raise FormatError(f"{where}: storage entry {name!r} is stored through transforms "
                              f"({quote(info.transform_descriptors, 60)}), which ckptbench does not load")
        if rel not in files:
            files[rel] = fs.size_of(rel, where)
        if off + length > files[rel]:
            raise FormatError(f"{where}: storage entry {name!r} lies at {off}+{length}, past the "
                              f"{files[rel]} bytes of {quote(rel)}; {_CRAFTED}")
        if length:
            spans.setdefault(rel, []).append((off, length, name))
    # DCP writes each item once: entries sharing bytes would have a shard read (and held) once per entry, a
    # metadata of N entries over one S-byte span costing N*S
    for rel, items in spans.items():
        end, prev = 0, None
        for off, length, name in sorted(items):
            if off < end:
                raise FormatError(f"{where}: storage entries {prev!r} and {name!r} share bytes of {quote(rel)}; "
                                  f"{_CRAFTED}")
            end, prev = off + length, name
    return files


def _no_overlap(chunks: list, what: str) -> None:
    """No two chunks share an element: with the coverage count equal to the size, chunks that overlapped would
    leave a region no chunk writes (memory handed back as it was allocated). Swept along the dimension the chunks
    split most, comparing each chunk only with those still open there: a sort, then near-linear for any real
    sharding (rows, columns, grids); chunks arranged to keep thousands open at once are refused as crafted."""
    boxes = [(tuple(c.offsets), tuple(c.sizes)) for c in chunks if all(c.sizes)]
    if len(boxes) < 2 or not boxes[0][0]:
        return  # a scalar's chunks are counted by the coverage check
    d = max(range(len(boxes[0][0])), key=lambda i: len({off[i] for off, _ in boxes}))
    boxes.sort(key=lambda b: b[0][d])
    budget = 64 * len(boxes) + (1 << 16)
    open_: list = []
    for off, sz in boxes:
        open_ = [b for b in open_ if b[0][d] + b[1][d] > off[d]]
        budget -= len(open_) + 1
        if budget < 0:
            raise FormatError(f"{what} has {len(boxes)} chunks laid out so that checking them for overlap would "
                              f"compare most pairs; {_CRAFTED}")
        for off2, sz2 in open_:
            if all(o2 < o + n and o < o2 + n2 for o, n, o2, n2 in zip(off, sz, off2, sz2)):
                raise FormatError(f"{what} has chunks at {off2[:8]} and {off[:8]} that overlap; {_CRAFTED}")
        open_.append((off, sz))


def _tensor_bytes(fqn: str, md, storage: dict, where: str) -> int:
    """The bytes one tensor entry will allocate, its chunks checked to lie inside it, cover it, and be stored."""
    what = f"{where}: entry {fqn[:80]!r}"
    props = getattr(md, "properties", None)
    dtype, size, chunks = getattr(props, "dtype", None), getattr(md, "size", None), getattr(md, "chunks", None)
    if not isinstance(props, TensorProperties) or not isinstance(dtype, torch.dtype) or not _dims(size) \
            or not isinstance(chunks, list):
        raise FormatError(f"{what} has dtype {dtype if isinstance(dtype, torch.dtype) else quote(dtype, 30)}, size {quote(size, 60)}, not a tensor's; {_CRAFTED}")
    if not holds_shape(size):
        raise FormatError(f"{what} has size {tuple(size)[:8]}: more elements than a tensor can hold; {_CRAFTED}")
    if dtype in _UNRESTORABLE:
        raise FormatError(f"{what} is a {dtype} tensor, which ckptbench cannot restore from DCP (a quantized one's "
                          "scale and zero point are not in the metadata; a sub-byte one cannot be copied): save it "
                          "dequantized, or as its raw bytes in uint8")
    covered = 0
    for c in chunks:
        offsets, sizes = getattr(c, "offsets", None), getattr(c, "sizes", None)
        if not isinstance(c, ChunkStorageMetadata) or not _dims(offsets) or not _dims(sizes) \
                or len(offsets) != len(size) or len(sizes) != len(size) \
                or any(o + n > d for o, n, d in zip(offsets, sizes, size)):
            raise FormatError(f"{what} has a chunk at {_dims_shown(offsets)} of {_dims_shown(sizes)}, not inside its "
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
    # only the fields torch declares go on: what a writer added beside them (Megatron's saved plans) is never read
    for extra in set(vars(meta)) - {f.name for f in dataclasses.fields(Metadata)}:
        delattr(meta, extra)
    # plain dicts from here on: an OrderedDict can carry instance attributes that shadow its methods
    meta.state_dict_metadata, meta.storage_data = dict(dict.items(entries)), dict(dict.items(meta.storage_data))
    if isinstance(getattr(meta, "planner_data", None), dict):
        meta.planner_data = dict(dict.items(meta.planner_data))
    total = 0
    for fqn, md in dict.items(entries):
        if not isinstance(fqn, str) or not isinstance(md, (TensorStorageMetadata, BytesStorageMetadata)):
            raise FormatError(f"{where}: entry {quote(fqn, 80)} is a {type(md).__name__}, not a tensor or bytes "
                              f"entry; {_CRAFTED}")
        if isinstance(md, TensorStorageMetadata):
            total += _tensor_bytes(fqn, md, meta.storage_data, where)
        elif MetadataIndex(fqn) not in meta.storage_data:  # where DCP (and a ranged plan) looks a byte entry up
            raise FormatError(f"{where}: byte entry {fqn[:80]!r} is stored in no shard; {_CRAFTED}")
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
            size = f.seek(0, os.SEEK_END)
            f.seek(0)
            if size > MAX_METADATA:
                raise FormatError(f"{path}: {size} bytes, more than DCP metadata holds (at most {MAX_METADATA}); "
                                  f"{_CRAFTED}")
            try:
                metadata = _MetadataUnpickler(f).load()
                if f.read(1):  # torch writes the pickle alone: anything after it was put there
                    raise FormatError(f"{path}: bytes after the metadata's pickle; {_CRAFTED}")
                metadata = _check_metadata(metadata, str(path), self.fs)
            except CkptbenchError as exc:
                if str(exc).startswith(str(path)):
                    raise
                raise type(exc)(f"{path}: {exc}", exit_code=exc.exit_code) from None
            except RecursionError:
                raise FormatError(f"{path}: DCP metadata nested too deep to read; {_CRAFTED}") from None
            except Exception as exc:  # a damaged pickle, or objects of DCP's classes holding what they never hold
                raise FormatError(f"{path}: unreadable DCP metadata ({type(exc).__name__}); not a DCP checkpoint") from None
        if metadata.storage_meta is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata
