"""Where a DCP chunk's raw elements lie inside its shard file, so a rank reads only the rows it needs.

DCP stores each chunk as a torch.save archive (a zip) at an offset of a .distcp file. torch's own zip reader,
given a window onto that range, finds the archive's records with a few small reads of its directory; the
chunk's pickle (data.pkl) is then read by an allow-list unpickler that only records which storage, offset, shape
and strides the tensor has — nothing it names is called. A chunk whose elements are not one contiguous
row-major run of the record (a non-contiguous save) is refused for ranged reads, never guessed at.
"""

from __future__ import annotations

import io
import math
import os
from dataclasses import dataclass

import torch

from ckptbench.checkpoint.formats import FormatError
from ckptbench.checkpoint.formats.dcp_metadata import DTYPES
from ckptbench.checkpoint.formats.torch_prescan import KeyedUnpickler
from ckptbench.checkpoint.quote import quote

_CRAFTED = "the checkpoint is corrupt or crafted"
_STORAGES = {v: k for k, v in torch.storage._dtype_to_storage_type_map().items()}  # "FloatStorage" -> float32


@dataclass(frozen=True)
class ChunkData:
    """A stored chunk's elements: `offset` bytes into the shard file, row-major, `nbytes` long."""

    offset: int
    nbytes: int
    index_bytes: int  # bytes the probe itself read (the archive's directory and pickle)


class _Window(io.RawIOBase):
    """[base, base+length) of an open file, as a file of its own; counts the bytes read through it."""

    def __init__(self, fd: int, base: int, length: int):
        super().__init__()
        self.fd, self.base, self.length, self.pos, self.read_bytes = fd, base, length, 0, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        start = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.length}[whence]
        self.pos = max(0, start + offset)
        return self.pos

    def readinto(self, b) -> int:
        n = max(0, min(len(b), self.length - self.pos))
        data = os.pread(self.fd, n, self.base + self.pos) if n else b""
        memoryview(b)[:len(data)] = data
        self.pos += len(data)
        self.read_bytes += len(data)
        return len(data)


_UNTYPED = object()  # torch.storage.UntypedStorage: bytes, typed by the rebuild call (float8 and newer dtypes)


class _Tensor:
    def __init__(self, storage, storage_offset, size, stride, dtype=None):
        self.storage, self.storage_offset, self.size, self.stride = storage, storage_offset, size, stride
        if isinstance(storage, tuple) and storage[0] is _UNTYPED and isinstance(dtype, torch.dtype):
            _, key, nbytes = storage  # an untyped storage counts bytes: in elements of the rebuilt dtype here
            self.storage = (dtype, key, nbytes // dtype.itemsize)


def _rebuild(storage, storage_offset, size, stride, *_rest):
    return _Tensor(storage, storage_offset, tuple(size), tuple(stride))


def _rebuild_v3(storage, storage_offset, size, stride, _grad, _hooks, dtype, *_rest):
    return _Tensor(storage, storage_offset, tuple(size), tuple(stride), dtype)


class _Recorder(KeyedUnpickler):
    """Admits the names a saved plain tensor uses and records what they describe; calls nothing of torch's."""

    def find_class(self, module: str, name: str):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("torch._utils", "_rebuild_tensor_v3"):
            return _rebuild_v3
        if (module, name) == ("torch.storage", "UntypedStorage"):
            return _UNTYPED
        if module == "torch" and name in DTYPES:
            return DTYPES[name]
        if (module, name) == ("collections", "OrderedDict"):
            return dict
        if module == "torch" and name in _STORAGES:
            return _STORAGES[name]
        raise FormatError(f"a DCP chunk's pickle names {module}.{name}, not a plain tensor; {_CRAFTED}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and (isinstance(pid[1], torch.dtype) or pid[1] is _UNTYPED)
                and isinstance(pid[2], str) and isinstance(pid[4], int)):
            raise FormatError(f"a DCP chunk names storage {quote(pid, 60)}, not a plain one; {_CRAFTED}")
        return pid[1], pid[2], pid[4]  # dtype, record key, elements

    def _keys(self, keys) -> None:
        """A plain tensor's pickle keys its (empty) hooks dict by names or numbers: a key of nested tuples is hashed
        whole, and one nesting a tuple twice at each of 40 levels took hours."""
        for k in keys:
            if not (isinstance(k, str) or type(k) is int and k.bit_length() <= 64):  # a long int's hash is not cached
                raise FormatError(f"a DCP chunk's pickle has a key that is a {type(k).__name__}, not a plain "
                                  f"tensor's; {_CRAFTED}")





def _row_major(size: tuple, stride: tuple) -> bool:
    if 0 in size:  # no elements: any strides describe them
        return True
    expect = 1
    for n, s in zip(reversed(size), reversed(stride)):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


def locate(fd: int, item_offset: int, item_length: int, dtype: torch.dtype, sizes: tuple, where: str) -> ChunkData:
    """The chunk stored at [item_offset, +item_length) of the open shard `fd`: where its elements start and how
    long they are, checked against the metadata's dtype and sizes."""
    win = _Window(fd, item_offset, item_length)
    try:
        reader = torch._C.PyTorchFileReader(win)
        records = set(reader.get_all_records())
        pkl = bytes(reader.get_record("data.pkl")) if "data.pkl" in records else None
    # UnicodeDecodeError: a record name that is not UTF-8 (or torch's message quoting one), as pybind11 decodes it
    except (RuntimeError, OSError, UnicodeDecodeError) as exc:
        raise FormatError(f"{where}: not a torch.save archive ({str(exc).splitlines()[0][:100]}); the shard is "
                          "corrupt or truncated") from None
    if pkl is None:
        raise FormatError(f"{where}: the chunk has no data.pkl; {_CRAFTED}")
    try:
        t = _Recorder(io.BytesIO(pkl)).load()
    except FormatError as exc:
        raise FormatError(f"{where}: {exc}") from None
    except Exception as exc:  # a malformed pickle provokes whatever it provokes
        raise FormatError(f"{where}: the chunk's pickle is unreadable ({type(exc).__name__}); {_CRAFTED}") from None
    if not isinstance(t, _Tensor) or not isinstance(t.storage, tuple):
        raise FormatError(f"{where}: the chunk holds a {type(t).__name__}, not a tensor; {_CRAFTED}")
    st_dtype, key, elements = t.storage
    if st_dtype != dtype or t.size != tuple(sizes) or not all(isinstance(v, int) for v in t.size + t.stride) \
            or not isinstance(t.storage_offset, int) or t.storage_offset < 0:
        raise FormatError(f"{where}: the chunk holds {st_dtype} {t.size}, the metadata says {dtype} "
                          f"{tuple(sizes)}; {_CRAFTED}")
    numel = math.prod(t.size)
    if not _row_major(t.size, t.stride) or t.storage_offset + numel > elements:
        raise FormatError(f"{where}: the chunk is not stored row-major in one run (strides {t.stride[:8]}); "
                          "ranged reads need it so")
    record = f"data/{key}"
    if record not in records:
        raise FormatError(f"{where}: the chunk's storage {record} is missing; {_CRAFTED}")
    try:
        start = reader.get_record_offset(record) + t.storage_offset * dtype.itemsize
    except (RuntimeError, OSError, UnicodeDecodeError) as exc:  # the archive's own record table is damaged
        raise FormatError(f"{where}: the chunk's storage {record} cannot be located ({str(exc).splitlines()[0][:80]}"
                          f"); {_CRAFTED}") from None
    nbytes = numel * dtype.itemsize
    if start + nbytes > item_length:
        raise FormatError(f"{where}: the chunk's elements end past its {item_length} bytes; {_CRAFTED}")
    return ChunkData(item_offset + start, nbytes, win.read_bytes)
