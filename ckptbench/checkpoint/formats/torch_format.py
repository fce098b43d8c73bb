"""torch.save files, loaded with weights_only=True: ckptbench's per-rank model and optimizer shards, and any
other trainer's nesting of tensors and plain values (DeepSpeed, Hugging Face .bin, a training loop's dict, a
Trainer's optimizer.pt/scheduler.pt/rng_state.pth, whose numpy RNG state is the one thing beyond torch's own
allowlist that is unpickled: numeric numpy arrays, through their reconstruction globals only).

A shard's structure is checked before torch parses it (torch_file: the zip archive's members, the legacy magic, the
pickle dry-run against the bytes); tensors loaded in place must each lie inside their own member's bytes.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import threading

import torch

from ckptbench.checkpoint import layouts
from ckptbench.checkpoint.formats.state import (MAX_DEPTH, SCALARS, CheckpointState, FormatError, MemoryFile,
                                               check_walk, flatten, group_of, json_plain, read_regular,
                                               walk_limit)
from ckptbench.checkpoint.quote import quote
from ckptbench.checkpoint.formats import inert
from ckptbench.checkpoint.formats.torch_file import CRAFTED as _CRAFTED
from ckptbench.checkpoint.formats.torch_file import DAMAGED as _DAMAGED
from ckptbench.checkpoint.formats.torch_file import (check_start, open_regular, prescan, prescan_legacy, why as _why,
                                                     zip_records)


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




def _whole(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 1 << 63


def _parts(name, parts, where: str) -> dict:
    if not isinstance(name, str) or not isinstance(parts, dict) or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in dict.items(parts)):
        raise FormatError(f"{where}: optimizer state {quote(name, 60)} is not a map of tensors; {_CRAFTED}")
    return parts


_OWN_OPTIM = {"state", "step", "hparams", "trainer_state"}
_WRAPPERS = ("module", "state_dict", "model", "model_state_dict")  # DeepSpeed, Lightning/HF, training loops
_ZERO_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_(?:optim|model)_states\.pt$")


def _own_optimizer(obj: dict) -> bool:
    """ckptbench's optimizer shard: nothing but state/step/hparams, the state a map of maps (a torch optimizer's
    own state_dict has param_groups too, and is a foreign file)."""
    return ("state" in obj and set(obj) <= _OWN_OPTIM and isinstance(obj["state"], dict)
            and all(isinstance(v, dict) for v in dict.values(obj["state"])))


def _own_optimizer_state(obj: dict, where: str) -> CheckpointState:
    # dict.items, dict.get: a pickle can shadow the methods with instance attributes on an OrderedDict
    optim = {name: _parts(name, parts, where) for name, parts in dict.items(obj["state"])}
    step, hparams, trainer = dict.get(obj, "step", 0), dict.get(obj, "hparams", {}), dict.get(obj, "trainer_state", {})
    if isinstance(step, torch.Tensor) and step.numel() == 1:
        step = step.item()
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if not _whole(step) or not all(isinstance(d, dict) and json_plain(d, rng=True) for d in (hparams, trainer)):
        raise FormatError(f"{where}: optimizer step {quote(step, 40)}, trainer_state or hparams is not what a "
                          f"trainer writes (a whole number, and numbers and names nested at most {MAX_DEPTH} deep); "
                          f"{_CRAFTED}")
    return CheckpointState({}, optim=optim, step=step, hparams=hparams, trainer=trainer)


def _rank_tag(where: str) -> str | None:
    """DeepSpeed's per-rank ZeRO partitions hold the same names with different values, so their keys are kept
    apart under the file's rank: zero_pp_rank_1 (zero_pp_rank_1_mp_rank_01 under tensor parallelism)."""
    m = _ZERO_FILE.match(os.path.basename(where))
    if m is None:
        return None
    return f"zero_pp_rank_{int(m.group(1))}" + (f"_mp_rank_{m.group(2)}" if int(m.group(2)) else "")


def _wrapper(obj: dict) -> str | None:
    """The top-level key whose dict holds the weights (DeepSpeed's `module`, `state_dict`, `model`), if any."""
    for key in _WRAPPERS:
        v = dict.get(obj, key)
        if isinstance(v, dict) and any(isinstance(leaf, torch.Tensor) for _, leaf in flatten(v, key)):
            return key
    return None


def _mp_tag(where: str) -> str | None:
    """Megatron's model-parallel ranks (mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt) hold the same names over different
    slices of each weight: every key of such a file is kept apart under its rank directory's name."""
    parent = os.path.basename(os.path.dirname(where))
    return parent if layouts.MP_DIR.match(parent) else None


def _foreign(obj: dict, where: str) -> CheckpointState:
    """Any other nesting, by flat key: the weights in `model` (a wrapper's prefix dropped), everything else
    (optimizer state, scheduler, config, steps, bytes) in `extra`."""
    tag = _rank_tag(where)
    mp = _mp_tag(where)
    optimizer_only = tag is not None or "param_groups" in obj  # a partition, or a torch optimizer's state_dict
    wrapper = None if optimizer_only else _wrapper(obj)
    state = CheckpointState({})
    model, extra = state.model, state.extra
    lead = f"{mp}." if mp else ""
    extra_lead = lead + (f"{tag}." if tag else "")
    wrapped = wrapper + "." if wrapper is not None else None
    tuples: set[str] = set()
    for key, leaf in flatten(obj, tuples=tuples):
        if type(leaf) in SCALARS:  # the bulk of a large file (ids, steps, flags): one lookup, no isinstance
            dest, name = extra, extra_lead + key
        elif not isinstance(leaf, torch.Tensor):
            _check_leaf(key, leaf, where)
            dest, name = extra, extra_lead + key
        elif wrapped is not None and key.startswith(wrapped):
            dest, name = model, lead + key[len(wrapped):]
        elif wrapper is None and not optimizer_only and group_of(key) == "model":
            dest, name = model, lead + key
        else:
            dest, name = extra, extra_lead + key
        if name in dest:
            raise FormatError(f"{where}: key {name[:80]!r} appears twice once the nesting is flattened; {_CRAFTED}")
        dest[name] = leaf
    state.tuples = {extra_lead + k for k in tuples}
    return state


def _trainer_state(obj: dict, stem: str, where: str) -> CheckpointState:
    """A Trainer's optimizer.pt, scheduler.pt, scaler.pt or rng_state*.pth: everything in `extra` under the file's
    stem (optimizer.state.0.exp_avg, scheduler.last_epoch, rng_state.cpu), none of it a weight."""
    state = CheckpointState({})
    for key, leaf in flatten(obj, stem, tuples=state.tuples):
        if type(leaf) not in SCALARS:
            _check_leaf(key, leaf, where)
        if key in state.extra:  # {"a.b": 1, "a": {"b": 2}}: two values a resume loads, one kept (as _foreign says)
            raise FormatError(f"{where}: key {key[:80]!r} appears twice once the nesting is flattened; {_CRAFTED}")
        state.extra[key] = leaf
    return state


def _from_obj(obj, where: str) -> CheckpointState:
    """The state an unpickled file holds: ckptbench's optimizer shard ({"state": {name: {part: tensor}}, "step",
    "hparams"}) or model shard (names to tensors) as they are, a Trainer's state file under its stem, any other
    dict by flat key; every field's type checked, since the pickle is the file's, not ours."""
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: holds a {type(obj).__name__}, not a state dict")
    stem, prefix = layouts.state_stem(os.path.basename(where)), layouts.model_prefix(os.path.basename(where))
    if prefix and all(isinstance(k, str) for k in dict.keys(obj)):
        obj = {prefix + k: v for k, v in dict.items(obj)}
    if stem is not None:
        return _named(_trainer_state, obj, stem, where)
    if _own_optimizer(obj):
        return _own_optimizer_state(obj, where)
    if obj and _rank_tag(where) is None and all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in dict.items(obj)):
        # a flat state dict saved with a loop's cpu_rng_state beside the weights: that one is not a weight
        state = CheckpointState({})
        for k, v in dict.items(obj):
            (state.model if group_of(k) == "model" else state.extra)[k] = v
        return state
    return _named(_foreign, obj, where)


def _named(build, obj, *args) -> CheckpointState:
    """`build(obj, *args)`, its nesting errors (flatten knows the key, not the file) naming the file too."""
    where = args[-1]
    try:
        return build(obj, *args)
    except FormatError as exc:
        if str(exc).startswith(where):
            raise
        raise FormatError(f"{where}: {exc}") from None


def _numpy_globals() -> list:
    """What a numeric numpy array (numpy's RNG state) pickles as, and nothing more: the reconstruction function
    (under numpy 2's name and numpy 1's), ndarray, dtype, and the classes of numeric dtypes (a dtype's BUILD needs
    its class allowed). No object, string or structured dtype: those could hold arbitrary Python objects."""
    try:
        import numpy as np
    except ImportError:  # without numpy no checkpoint of it can be unpickled anyway
        return []
    reconstruct = np.ndarray((0,)).__reduce__()[0]
    found = [reconstruct, np.ndarray, np.dtype]
    found += [(reconstruct, f"numpy.{core}.multiarray._reconstruct") for core in ("core", "_core")
              if f"{reconstruct.__module__}.{reconstruct.__qualname__}" != f"numpy.{core}.multiarray._reconstruct"]
    found += [type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDG"]
    return found


_NUMPY_LOCK = threading.Lock()
_numpy_users = 0
_numpy_scope = None


@contextlib.contextmanager
def numpy_allowed():
    """torch's weights_only unpickler with numeric numpy arrays allowed, for as long as any load in this process
    needs it (torch keeps its allowlist process-wide: entered and left once, not per thread)."""
    global _numpy_users, _numpy_scope
    with _NUMPY_LOCK:
        if _numpy_users == 0:
            from torch import serialization as ts

            already = set(map(repr, ts.get_safe_globals()))  # a caller's own entries are not ours to remove
            _numpy_scope = ts.safe_globals([g for g in _numpy_globals() if repr(g) not in already])
            _numpy_scope.__enter__()
        _numpy_users += 1
    try:
        yield
    finally:
        with _NUMPY_LOCK:
            _numpy_users -= 1
            if _numpy_users == 0:
                _numpy_scope.__exit__(None, None, None)
                _numpy_scope = None


def _check_leaf(key: str, leaf, where: str) -> None:
    """A numpy array unpickled must hold numbers (bool, int, float, complex), whatever its pickle claims."""
    if type(leaf).__module__ != "numpy":
        return
    kind = getattr(getattr(leaf, "dtype", None), "kind", None)
    if kind not in ("b", "i", "u", "f", "c"):
        raise FormatError(f"{where}: {key[:80]!r} is a numpy {type(leaf).__name__} of kind {kind!r}, not numbers; "
                          f"{_CRAFTED}")


# what torch's weights_only unpickler says when it refuses an object (a global, a build, a call) it does not allow
_REFUSALS = ("GLOBAL", "Can only build", "Trying to call reduce")


def _safe_load(load, where: str, source=None, limit: int = 0):
    """Runs `load()` (a weights_only torch load, numeric numpy arrays allowed) and turns its failures into one
    FormatError line. When the pickle names classes beyond torch's allowlist and `source` (the zip file: a path
    or a file object) is given, it is loaded again with an inert stand-in for each (formats/inert.py). The
    object is walked only once `check_walk` has bounded it by `limit`. Returns (object, the names stood in for)."""
    try:
        with numpy_allowed():
            obj = load()
        check_walk(obj, limit, where)
        return obj, []
    except FormatError:
        raise
    except pickle.UnpicklingError as exc:
        if not any(r in str(exc) for r in _REFUSALS):
            raise FormatError(f"{where}: not a readable torch file ({_why(exc)}); {_DAMAGED}") from None
        if source is None:  # torch's legacy format: its pickle cannot be read without running it
            raise FormatError(f"{where}: refused — it holds objects beyond tensors and plain data, and "
                              f"unpickling them could run code ({_why(exc)}); re-save it as a plain state dict "
                              "or safetensors") from None
    except Exception as exc:  # torch's readers fail on bad bytes with whatever they provoke (IndexError, struct.error...)
        raise FormatError(f"{where}: not a readable torch file ({type(exc).__name__}: {_why(exc)}); "
                          f"{_DAMAGED}") from None
    try:  # the happy path above costs nothing extra; only a refused file pays for reading its pickle's names
        with numpy_allowed():
            names = inert.names_in(source)
            with inert.stand_ins(names, where):
                obj = load()
            check_walk(obj, limit, where)
            return inert.plain(obj, where), names
    except FormatError:
        raise
    except Exception as exc:  # what stand-ins do not cover (items appended to a list subclass, slot state), or
        # damage past the point where the first load stopped
        raise FormatError(f"{where}: refused — it holds objects beyond tensors and plain data that ckptbench "
                          f"cannot keep as data, or is damaged ({type(exc).__name__}: {_why(exc)}); re-save it as a "
                          "plain state dict or safetensors") from None


def _check_tensors(state: CheckpointState, where: str) -> CheckpointState:
    """What the scan and the clone may touch: CPU tensors with their data, each no larger than its storage (a
    stride-0 view claims more than the file holds: copying it would allocate the claim)."""
    for _, name, t in state.tensors():
        if t.layout != torch.strided or t.is_nested or t.device.type != "cpu":
            # a nested tensor's layout reads torch.strided: 'is torch.strided on cpu, not a CPU tensor' said nothing
            kind = "a nested tensor" if t.is_nested else f"{t.layout} on {t.device}"
            raise FormatError(f"{where}: tensor {name[:80]!r} is {kind}, not a plain CPU tensor with its data in the "
                              "file; re-save it as a plain state dict")
        need = t.numel() * t.element_size()
        if need and need > t.untyped_storage().nbytes() - t.storage_offset() * t.element_size():
            raise FormatError(f"{where}: tensor {name[:80]!r} claims {need} bytes from a storage of "
                              f"{t.untyped_storage().nbytes()} (a stride-0 or overlapping view); {_CRAFTED}")
    return state


def _same_file(f, path: str) -> str:
    """A name for the file `f` holds open (/proc/self/fd/N): torch opens what it loads by name, and the file at
    `path` may have been replaced since it was checked. `path` itself where /proc is not mounted."""
    own = f"/proc/self/fd/{f.fileno()}"
    return own if os.path.exists(own) else path


def peek_file(path: str) -> CheckpointState:
    """The state a file holds with its tensors still mapped (mmap), not copied: names, dtypes and sizes cost a
    read of the pickle, not of the data (what inspect needs). torch loads the very file the checks read."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        is_zip = check_start(f.read(32), path)
        limit = walk_limit(prescan(f, zip_records(f, size, path), path) if is_zip else prescan_legacy(f, size, path))
        same = _same_file(f, path)
        # mmap needs the zip layout; the legacy format is read whole, as torch.load does
        obj, names = _safe_load(lambda: torch.load(same, weights_only=True, map_location="cpu", mmap=is_zip), path,
                                same if is_zip else None, limit)
    return _check_tensors(_with_inert(_from_obj(obj, path), names), path)


def load_file(path: str) -> CheckpointState:
    """The file read whole into memory, then loaded as a read buffer is (read_regular): a mapping (torch.load's
    mmap) let a file truncated while in use kill the process on the copy, and torch opened by name a file that
    may have been replaced since it was checked."""
    return load_buffer(read_regular(path, "a torch shard"), path)


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
    for _, name, t in state.tensors():
        s = t.untyped_storage()
        if s.nbytes() == 0:
            continue
        start = s.data_ptr() - base
        if room.get(start, -1) < s.nbytes():
            raise FormatError(f"{where}: tensor {name[:80]!r} claims {s.nbytes()} bytes at {start}, beyond its zip "
                              f"member; {_CRAFTED}")


def tensor_in_place(view, where: str):
    """The object a torch.save archive in the writable bytes `view` holds (a DCP chunk: one tensor), its storages
    views of those bytes, checked as load_buffer checks a shard (the members, the pickle's dry run, each storage
    inside its member); None where it cannot be loaded in place (read-only bytes, not a zip archive, a torch
    without the internals): the caller loads a copy. A DCP load through torch.load copied every chunk twice into
    fresh memory (the bytes, then torch's storage) before copying it into place: 72 % of a 2.1 GiB restore."""
    view = memoryview(view).cast("B")
    if view.readonly or view.nbytes < 32 or not _has_load_internals() or not check_start(bytes(view[:32]), where):
        return None
    records = zip_records(MemoryFile(view), view.nbytes, where)
    limit = walk_limit(prescan(MemoryFile(view), records, where))
    obj, _ = _safe_load(lambda: _load_in_place(view), where, None, limit)
    if isinstance(obj, torch.Tensor):
        _check_in_place(_check_tensors(CheckpointState({"chunk": obj}), where), view, records, where)
    return obj


def prescanned(data, where: str) -> None:
    """The bytes of a torch.save stream held in memory (a DCP byte entry or chunk read whole) checked as a shard is
    before torch.load reads them: its start, its zip members, its pickle's dry run (torch_prescan)."""
    view = memoryview(data).cast("B")
    if check_start(bytes(view[:32]), where):
        prescan(MemoryFile(view), zip_records(MemoryFile(view), view.nbytes, where), where)
    else:
        prescan_legacy(MemoryFile(view), view.nbytes, where)


def load_buffer(buf, name: str) -> CheckpointState:
    view = memoryview(buf).cast("B")
    is_zip = check_start(bytes(view[:32]), name)
    if not is_zip:
        limit = walk_limit(prescan_legacy(MemoryFile(view), view.nbytes, name))
        obj, _ = _safe_load(lambda: torch.load(io.BytesIO(view), weights_only=True, map_location="cpu"), name,
                            limit=limit)
        return _check_tensors(_from_obj(obj, name), name)
    records = zip_records(MemoryFile(view), view.nbytes, name)
    limit = walk_limit(prescan(MemoryFile(view), records, name))
    if not _has_load_internals():
        obj, names = _safe_load(lambda: torch.load(io.BytesIO(view), weights_only=True, map_location="cpu"), name,
                                MemoryFile(view), limit)
        return _check_tensors(_with_inert(_from_obj(obj, name), names), name)
    # read-only bytes cannot back a tensor: one copy (as io.BytesIO would make), then the same in-place path
    target = bytearray(view) if view.readonly else buf
    obj, names = _safe_load(lambda: _load_in_place(target), name, MemoryFile(view), limit)
    state = _check_tensors(_with_inert(_from_obj(obj, name), names), name)
    _check_in_place(state, target, records, name)
    return state


def _with_inert(state: CheckpointState, names: list[str]) -> CheckpointState:
    state.inert.update(names)
    return state
