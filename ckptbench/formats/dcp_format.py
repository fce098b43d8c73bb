"""torch.distributed.checkpoint directories (.metadata plus .distcp shards), loaded without a process group."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import warnings
from pathlib import PurePath

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem

from ckptbench.formats import OPTIM_KEYS, CheckpointState, FormatError, MemoryFile

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


class SafeReader(FileSystemReader):
    """torch's reader unpickles .metadata with plain pickle; this one admits only DCP's own metadata classes."""

    def read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as f:
            try:
                metadata = _MetadataUnpickler(f).load()
            except FormatError:
                raise
            except Exception as exc:  # a damaged pickle raises many kinds
                raise FormatError(f"{path}: unreadable DCP metadata ({type(exc).__name__}); not a DCP checkpoint") from None
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

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


class _MemoryFS(FileSystem):
    """DCP's file access, answered from the fused read's buffers (by file name); other files from disk."""

    def __init__(self, buffers: dict):
        super().__init__()
        self.buffers = buffers

    @contextlib.contextmanager
    def create_stream(self, path, mode):
        buf = self.buffers.get(PurePath(str(path)).name) if "r" in mode else None
        if buf is None:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        yield io.BufferedReader(MemoryFile(buf))


def load_dir(directory: str, buffers: dict | None = None) -> CheckpointState:
    """Reads into freshly allocated tensors shaped from the metadata (DCP loads in place).

    `buffers` (file name → bytes already read) serves the shards and .metadata from memory."""
    reader = SafeReader(directory)
    if buffers:
        reader.fs = _MemoryFS(buffers)
    try:
        meta = reader.read_metadata()
    except FormatError:
        raise
    except OSError as exc:
        raise FormatError(f"{directory}/.metadata: unreadable ({exc.strerror}); not a DCP checkpoint") from None
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
        with _quiet():
            dcp.load(sd, storage_reader=reader, no_dist=True)
    except FormatError:
        raise
    except (Exception, CheckpointException) as exc:  # CheckpointException derives from BaseException
        raise FormatError(f"{directory}: DCP load failed ({type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}); "
                          "a shard is missing or truncated") from None
    return CheckpointState(sd["model"], sd["optim"], int(sd["step"]), {})
