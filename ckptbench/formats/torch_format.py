"""torch.save per-rank shards: model and optimizer state of each rank, loaded with weights_only=True.

A shard is checked before torch parses it: a zip archive (torch.save since 1.6) must hold stored, uncompressed
members that lie whole inside the file and do not overlap; anything else must open with torch's legacy magic
number. Tensors loaded in place must each lie inside their own member's bytes.
"""

from __future__ import annotations

import io
import os
import pickle
import stat
import struct
import zipfile

import torch

from ckptbench.formats import CheckpointState, FormatError, MemoryFile


def shard_names(rank: int) -> tuple[str, str]:
    return f"model_rank{rank:03d}.pt", f"optim_rank{rank:03d}.pt"


def write(directory: str, state: CheckpointState, assignment: list[list[str]]) -> list[tuple[str, str, int | None]]:
    written = []
    for rank, names in enumerate(assignment):
        model_file, optim_file = shard_names(rank)
        torch.save({n: state.model[n] for n in names}, os.path.join(directory, model_file))
        optim = {"state": {n: state.optim[n] for n in names}, "step": state.step, "hparams": state.hparams}
        torch.save(optim, os.path.join(directory, optim_file))
        written += [(model_file, "model", rank), (optim_file, "optimizer", rank)]
    return written


_ZIP_MAGIC = b"PK\x03\x04"
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C  # what torch.save's pre-zip format pickles first
_LEGACY_PREFIXES = tuple(pickle.dumps(_LEGACY_MAGIC, protocol=p) for p in range(2, pickle.HIGHEST_PROTOCOL + 1))
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then file name and extra field lengths at 26 and 28
MAX_MEMBERS = 1 << 20
_CRAFTED = "the shard is corrupt or crafted"
_DAMAGED = "the shard is corrupt or truncated"


def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63


def _parts(name, parts, where: str) -> dict:
    if not isinstance(name, str) or not isinstance(parts, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in parts.items()):
        raise FormatError(f"{where}: optimizer state {str(name)[:60]!r} is not a map of tensors; {_CRAFTED}")
    return parts


def _from_obj(obj, where: str) -> CheckpointState:
    """The state an unpickled shard holds: an optimizer file ({"state": {name: {part: tensor}}, "step", "hparams"})
    or a model state dict; every field's type checked, since the pickle is the file's, not ours."""
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: holds a {type(obj).__name__}, not a state dict")
    if "state" in obj and isinstance(obj["state"], dict) and all(isinstance(v, dict) for v in obj["state"].values()):
        optim = {name: _parts(name, parts, where) for name, parts in obj["state"].items()}
        step, hparams = obj.get("step", 0), obj.get("hparams", {})
        if isinstance(step, torch.Tensor) and step.numel() == 1:
            step = step.item()
        if isinstance(step, float) and step.is_integer():
            step = int(step)
        if not _whole(step) or not isinstance(hparams, dict):
            raise FormatError(f"{where}: optimizer step {str(step)[:40]} or hparams is not what a trainer writes; "
                              f"{_CRAFTED}")
        return CheckpointState({}, optim=optim, step=step, hparams=hparams)
    model = {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}
    if not model:
        raise FormatError(f"{where}: holds no tensors")
    return CheckpointState(model)


def _materialize(state: CheckpointState) -> CheckpointState:
    """mmap=True loads are lazy: copy into owned memory now so the cost is counted in the load."""
    state.model = {k: v.clone() for k, v in state.model.items()}
    state.optim = {n: {k: v.clone() for k, v in parts.items()} for n, parts in state.optim.items()}
    return state


def _why(exc: BaseException) -> str:
    """The informative line of a torch load failure (weights_only errors bury it under a paragraph of advice)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in lines:
        if "GLOBAL" in ln or ln.startswith(("Unsupported", "Trying to load")):
            return ln[:160]
    return lines[0][:160] if lines else type(exc).__name__


def _safe_load(load, where: str):
    """Runs `load()` (a weights_only torch load) and turns its failures into one FormatError line."""
    try:
        return load()
    except pickle.UnpicklingError as exc:
        if "GLOBAL" not in str(exc):
            raise FormatError(f"{where}: not a readable torch file ({_why(exc)}); {_DAMAGED}") from None
        raise FormatError(f"{where}: refused — it holds objects beyond tensors and plain data, and "
                          f"unpickling them could run code ({_why(exc)}); re-save it as a plain state dict "
                          "or safetensors") from None
    except Exception as exc:  # torch's readers fail on bad bytes with whatever they provoke (IndexError, struct.error...)
        raise FormatError(f"{where}: not a readable torch file ({type(exc).__name__}: {_why(exc)}); "
                          f"{_DAMAGED}") from None


def _zip_records(f, size: int, where: str) -> dict[str, tuple[int, int]]:
    """member name -> (data offset, length) of a torch.save archive in the seekable file `f` of `size` bytes,
    checked: stored (torch never compresses, and an in-place load slices the raw bytes), not encrypted, each
    member's local header and data whole inside the file, no name twice, no two members' data overlapping."""
    try:
        with zipfile.ZipFile(f) as zf:
            infos = zf.infolist()
    except Exception as exc:  # zipfile fails on a crafted directory in many ways (BadZipFile, ValueError, EOFError...)
        raise FormatError(f"{where}: not a readable zip archive ({type(exc).__name__}: {_why(exc)}); "
                          f"{_DAMAGED}") from None
    if len(infos) > MAX_MEMBERS:
        raise FormatError(f"{where}: {len(infos)} zip members, more than a torch.save archive has; {_CRAFTED}")
    records: dict[str, tuple[int, int]] = {}
    for info in infos:
        what = f"{where}: zip member {info.filename[:80]!r}"
        if info.filename in records:
            raise FormatError(f"{what} appears twice; {_CRAFTED}")
        if info.compress_type != zipfile.ZIP_STORED or info.flag_bits & 0x1 or info.compress_size != info.file_size:
            raise FormatError(f"{what} is compressed or encrypted, which torch.save never writes; {_CRAFTED}")
        if not 0 <= info.header_offset <= size - _LOCAL_HEADER.size:
            raise FormatError(f"{what} has its header outside the file; {_DAMAGED}")
        f.seek(info.header_offset)
        local = f.read(_LOCAL_HEADER.size)
        if len(local) != _LOCAL_HEADER.size:
            raise FormatError(f"{what} has its header past the end of the file; {_DAMAGED}")
        magic, name_len, extra_len = _LOCAL_HEADER.unpack(local)
        start = info.header_offset + _LOCAL_HEADER.size + name_len + extra_len
        if magic != _ZIP_MAGIC or start + info.file_size > size:
            raise FormatError(f"{what} lies outside the file ({start}+{info.file_size} of {size} bytes); "
                              f"{_DAMAGED}")
        records[info.filename] = (start, info.file_size)
    end, prev = 0, None
    for name, (start, length) in sorted(records.items(), key=lambda kv: kv[1]):
        if length and start < end:
            raise FormatError(f"{where}: zip members {prev[:80]!r} and {name[:80]!r} overlap; {_CRAFTED}")
        if length:
            end, prev = start + length, name
    return records


def _check_start(head: bytes, where: str) -> bool:
    """True for a zip archive, False for torch's legacy format; anything else is not a torch.save file."""
    if head.startswith(_ZIP_MAGIC):
        return True
    if any(head.startswith(p) for p in _LEGACY_PREFIXES):
        return False
    raise FormatError(f"{where}: not a torch.save file (it starts with neither a zip archive nor torch's legacy "
                      f"magic number); {_DAMAGED}")


def _open_regular(path: str):
    """The shard opened for reading without blocking on a FIFO, refused unless a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise FormatError(f"{path}: cannot open ({exc.strerror}); check the path and its permissions") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FormatError(f"{path}: not a regular file; a torch shard must be one")
    return os.fdopen(fd, "rb")


def load_file(path: str) -> CheckpointState:
    with _open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        is_zip = _check_start(f.read(32), path)
        if is_zip:
            _zip_records(f, size, path)
    # mmap needs the zip layout; the legacy format is read whole, as torch.load does
    obj = _safe_load(lambda: torch.load(path, weights_only=True, map_location="cpu", mmap=is_zip), path)
    return _materialize(_from_obj(obj, path))


def _load_in_place(buf):
    """torch.load's own mmap path, with the read buffer standing in for the mapped file: every storage is a
    slice of `buf`, so the tensors are views of the bytes already read (no second copy). Still the
    weights_only unpickler. Uses torch.serialization's internals, hence the fallback in load_buffer."""
    from torch import serialization as ts

    storage = torch.frombuffer(buf, dtype=torch.uint8).untyped_storage()
    with ts._open_zipfile_reader(MemoryFile(buf)) as zf:
        return ts._load(zf, "cpu", ts._weights_only_unpickler, overall_storage=storage, encoding="utf-8")


def _has_load_internals() -> bool:
    from torch import serialization as ts

    return all(hasattr(ts, n) for n in ("_open_zipfile_reader", "_load", "_weights_only_unpickler"))


def _check_in_place(state: CheckpointState, buf, records: dict[str, tuple[int, int]], where: str) -> None:
    """Every tensor loaded in place lies inside one member's bytes: a pickle that declares a storage larger than
    its member would otherwise alias the bytes after it (the next member, or the zip directory)."""
    base = torch.frombuffer(buf, dtype=torch.uint8).data_ptr() if memoryview(buf).nbytes else 0
    room = {start: length for start, length in records.values()}
    tensors = list(state.model.items())
    tensors += [(f"{n}.{k}", t) for n, parts in state.optim.items() for k, t in parts.items()]
    for name, t in tensors:
        s = t.untyped_storage()
        if s.nbytes() == 0:
            continue
        start = s.data_ptr() - base
        if room.get(start, -1) < s.nbytes():
            raise FormatError(f"{where}: tensor {name[:80]!r} claims {s.nbytes()} bytes at {start}, beyond its zip "
                              f"member; {_CRAFTED}")


def load_buffer(buf, name: str) -> CheckpointState:
    view = memoryview(buf).cast("B")
    is_zip = _check_start(bytes(view[:32]), name)
    if not is_zip:
        obj = _safe_load(lambda: torch.load(io.BytesIO(view), weights_only=True, map_location="cpu"), name)
        return _from_obj(obj, name)
    records = _zip_records(MemoryFile(view), view.nbytes, name)
    if not _has_load_internals():
        obj = _safe_load(lambda: torch.load(io.BytesIO(view), weights_only=True, map_location="cpu"), name)
        return _from_obj(obj, name)
    # read-only bytes cannot back a tensor: one copy (as io.BytesIO would make), then the same in-place path
    target = bytearray(view) if view.readonly else buf
    state = _from_obj(_safe_load(lambda: _load_in_place(target), name), name)
    _check_in_place(state, target, records, name)
    return state
