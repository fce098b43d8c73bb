"""A dry run of a torch.save archive's pickle before torch unpickles it, so that what the pickle asks torch to
allocate is checked against the file first (the same line in every mode).

Every name the pickle gives resolves to a recorder here; nothing is imported, called or allocated beyond the
pickle's own values, and the memo is a dict (a crafted memo index costs nothing). Refused: calls that allocate
what the pickle says rather than what the file holds (`bytearray(n)`, `torch.FloatTensor(n)`, a storage class
called), a storage that claims more bytes than its zip member holds, a tensor that claims more elements than its
storage holds (a stride-0 or overlapping view: cloning it would allocate the claim), and tensors without data
(meta, wrapper subclasses) or on another device.
"""

from __future__ import annotations

import contextlib
import io
import math
import pickle

import torch

from ckptbench.checkpoint.formats.state import FormatError
from ckptbench.checkpoint.quote import quote

MAX_DIMS = 64  # torch's operators stop at 64 dimensions

_CRAFTED = "the shard is corrupt or crafted"
_STORAGE_DTYPES = {f"torch.{v}": k for k, v in torch.storage._dtype_to_storage_type_map().items()}  # FloatStorage
_UNTYPED = ("torch.storage.UntypedStorage", "torch.UntypedStorage")
_VIEWS = {"torch._utils._rebuild_tensor", "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
          "torch._utils._rebuild_qtensor"}
_NO_DATA = {"torch._utils._rebuild_meta_tensor_no_storage": "a meta tensor (a shape without data)",
            "torch._utils._rebuild_wrapper_subclass": "a tensor subclass without data in the file"}
_TO_DEVICE = {"torch._utils._rebuild_device_tensor_from_cpu_tensor", "torch._utils._rebuild_device_tensor_from_numpy"}


def _allocates(name: str) -> bool:
    """Tensor and storage classes: called with arguments they allocate what the arguments say."""
    mod, _, cls = name.rpartition(".")
    return mod in ("torch", "torch.cuda", "torch.sparse", "torch.cuda.sparse", "torch.storage") \
        and cls.endswith(("Tensor", "Storage"))


class _Storage:
    def __init__(self, key: str, nbytes: int):
        self.key, self.nbytes = key, nbytes


class _Made:
    """What a call returned in the dry run: accepts the items, appends and state the pickle gives it."""

    def __init__(self, name: str):
        self.name = name

    def __setitem__(self, k, v):
        pass

    def append(self, v):
        pass

    def extend(self, v):
        pass

    def __setstate__(self, state):
        if self.name == "torch.Tensor" and isinstance(state, tuple) and state:  # legacy: tensor.set_(*state)
            _check_view(self.name, state, 1, self.where)


# calls that hash what they are given: a set's items, an OrderedDict's or a dict's keys (from pairs)
_HASHES = {"builtins.set": False, "builtins.frozenset": False, "collections.Counter": False,
           "collections.OrderedDict": True, "builtins.dict": True}


class _Global:
    def __init__(self, name: str, where: str, run=None):
        self.name, self.where, self.run = name, where, run

    def __call__(self, *args):
        name, where = self.name, self.where
        if name in _HASHES and args and self.run is not None and isinstance(args[0], (list, tuple, set, frozenset)):
            pairs = _HASHES[name]
            self.run._keys([p[0] if isinstance(p, (tuple, list)) and p else p for p in args[0]] if pairs else args[0])
        if name == "builtins.bytearray" and not (args == () or type(args[0]) in (bytes, bytearray, str) or (
                isinstance(args[0], _Made) and args[0].name == "_codecs.encode")):  # protocol 2's saved bytes
            raise FormatError(f"{where}: its pickle asks for bytearray({quote(args[0], 20)}), which torch.save never "
                              f"writes; {_CRAFTED}")
        if _allocates(name) and args:
            raise FormatError(f"{where}: its pickle calls {name}({quote(args[0], 20)}…), which allocates what it asks "
                              f"and torch.save never writes; {_CRAFTED}")
        if name in _NO_DATA:
            raise FormatError(f"{where}: holds {_NO_DATA[name]}; ckptbench restores tensors whose data is in the "
                              "file: re-save it with its tensors on the CPU")
        if name in _TO_DEVICE and not (len(args) > 2 and str(args[2]) == "cpu"):
            raise FormatError(f"{where}: holds a tensor saved from device {quote(args[2] if len(args) > 2 else '?', 20)}"
                              ", whose data ckptbench cannot place; re-save it with its tensors on the CPU")
        if name in _VIEWS:
            itemsize = 1 if name != "torch._utils._rebuild_tensor_v3" or len(args) < 7 \
                or not isinstance(args[6], torch.dtype) else args[6].itemsize
            _check_view(name, args, itemsize, where)
        if name == "torch.Size" and args and isinstance(args[0], (tuple, list)):
            return tuple(args[0])
        made = _Made(name)
        made.where = where
        return made


def _check_view(name: str, args: tuple, itemsize: int, where: str) -> None:
    """A tensor over `args[0]` (a storage) may not claim more elements than the storage holds after its offset."""
    storage, offset, size = (list(args) + [None, None])[:3]
    if not isinstance(storage, _Storage):
        return  # no storage from the file: torch itself refuses what it cannot rebuild
    if not isinstance(offset, int) or not isinstance(size, tuple) or len(size) > MAX_DIMS or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in size):
        # the product of 400,000 dims of 3 (1.6 MB of pickle) took seconds, growing with the square of the count
        raise FormatError(f"{where}: a tensor over storage {storage.key[:20]!r} has offset {quote(offset, 20)} and "
                          f"size {quote(size, 40)}, not whole numbers in at most {MAX_DIMS} dimensions; {_CRAFTED}")
    itemsize = storage.itemsize or itemsize  # a typed storage counts in its dtype, an untyped one in bytes
    need = math.prod(size) * itemsize
    if need and (offset < 0 or need + offset * itemsize > storage.nbytes):
        raise FormatError(f"{where}: a tensor of size {size[:8]} claims {need} bytes from storage "
                          f"{storage.key[:20]!r}, which holds {storage.nbytes} (a stride-0 or overlapping view); "
                          f"{_CRAFTED}")


class KeyedUnpickler(pickle._Unpickler):  # the pure-Python unpickler: its memo is a dict, a crafted index costs nothing
    """Shows `_keys` every key the load is about to hash (a dict's keys, a set's items) before it hashes them: a
    tuple's hash walks it whole, a tuple held twice twice, so a key of tuples nesting one tuple twice at each of 40
    levels took hours. Subclasses say in `_keys` what they allow."""

    def _keys(self, keys) -> None:
        raise NotImplementedError

    def load_setitem(self):
        self._keys(self.stack[-2:-1])
        super().load_setitem()

    def load_setitems(self):
        self._keys(self.stack[::2])  # since the MARK, the stack holds only the items
        super().load_setitems()

    def load_dict(self):
        self._keys(self.stack[::2])
        super().load_dict()

    def load_sets(self):
        self._keys(self.stack)


KeyedUnpickler.dispatch = dict(pickle._Unpickler.dispatch)
KeyedUnpickler.dispatch[pickle.SETITEM[0]] = KeyedUnpickler.load_setitem
KeyedUnpickler.dispatch[pickle.SETITEMS[0]] = KeyedUnpickler.load_setitems
KeyedUnpickler.dispatch[pickle.DICT[0]] = KeyedUnpickler.load_dict
KeyedUnpickler.dispatch[pickle.ADDITEMS[0]] = lambda self: (self.load_sets(), pickle._Unpickler.load_additems(self))
KeyedUnpickler.dispatch[pickle.FROZENSET[0]] = lambda self: (self.load_sets(),
                                                             pickle._Unpickler.load_frozenset(self))


class _DryRun(KeyedUnpickler):
    def __init__(self, data: bytes, where: str, members: dict[str, int] | None):
        super().__init__(io.BytesIO(data), encoding="utf-8")
        self.where, self.members, self.storages = where, members, {}
        # a key's hash walks its tuples whole, a tuple held twice twice: 1.2 KB of tuples nesting one tuple twice at
        # each of 40 levels took hours to hash, in this dry run and again in torch's load
        self.hash_budget, self.costs = 4 * len(data) + (1 << 20), {}

    def _hash_cost(self, k) -> int:
        """The steps hashing `k` takes (tuples walked whole), each tuple costed once: it cannot change."""
        if type(k) is int:  # an int's hash reads all its digits, and is not cached either
            return 1 + k.bit_length() // 64
        if type(k) not in (tuple, frozenset):
            return 1
        hit = self.costs.get(id(k))
        if hit is None:
            hit = self.costs[id(k)] = (k, 1 + sum(self._hash_cost(c) for c in k))  # k held: its id stays its own
        return hit[1]

    def _keys(self, keys) -> None:
        for k in keys:
            self.hash_budget -= self._hash_cost(k)
            if self.hash_budget < 0:
                raise FormatError(f"{self.where}: its pickle's keys would take more steps to hash than the file has "
                                  "bytes many times over (tuples holding the same tuples, or long numbers, given "
                                  f"again and again); {_CRAFTED}")

    def find_class(self, module: str, name: str):
        module = "builtins" if module == "__builtin__" else module  # protocol 2 writes Python 2's name, as torch maps
        return _Global(f"{module}.{name}", self.where, self)

    def persistent_load(self, pid):
        if not isinstance(pid, tuple) or len(pid) < 5 or pid[0] != "storage" or not isinstance(pid[1], _Global) \
                or not isinstance(pid[2], str) or not isinstance(pid[4], int) or pid[4] < 0:
            raise FormatError(f"{self.where}: its pickle names storage {quote(pid, 60)}, not torch's; {_CRAFTED}")
        kind, key, numel = pid[1].name, pid[2], pid[4]
        dtype = _STORAGE_DTYPES.get(kind)
        if dtype is None and kind not in _UNTYPED:
            raise FormatError(f"{self.where}: its pickle names a storage of {kind[:60]}, not torch's; {_CRAFTED}")
        if dtype is None and self.members is None:
            # torch's legacy format names a storage by its typed class; a dtype with none (float8, uint16..) is
            # written untyped, and torch.load fails on it as well: the file is as torch wrote it, not damaged
            raise FormatError(f"{self.where}: torch's legacy format (torch.save with _use_new_zipfile_serialization="
                              "False) holds a storage of a dtype it has no name for (float8, uint16, uint32, ...), "
                              "which torch.load cannot read back either; save it again in torch.save's default "
                              "format")
        nbytes = numel * (dtype.itemsize if dtype is not None else 1)
        if self.members is not None:
            held = self.members.get(key)
            if held is None:
                raise FormatError(f"{self.where}: storage {key[:20]!r} has no zip member; {_CRAFTED}")
            if nbytes > held:
                raise FormatError(f"{self.where}: storage {key[:20]!r} claims {nbytes} bytes, its zip member holds "
                                  f"{held}; {_CRAFTED}")
        storage = self.storages.setdefault(key, _Storage(key, nbytes))
        storage.itemsize = dtype.itemsize if dtype is not None else 0
        return storage


_DryRun.dispatch = dict(KeyedUnpickler.dispatch)
_DryRun.dispatch[pickle.NEWOBJ[0]] = lambda self: self.stack.append(self.stack.pop(-2)(*self.stack.pop()))


@contextlib.contextmanager
def _as_format_error(where: str):
    """A dry run's failure as one line: a damaged pickle provokes whatever it provokes."""
    try:
        yield
    except FormatError:
        raise
    except RecursionError:
        raise FormatError(f"{where}: its pickle nests too deep to read; {_CRAFTED}") from None
    except Exception as exc:
        raise FormatError(f"{where}: its pickle is unreadable ({type(exc).__name__}); {_CRAFTED}") from None


def check(data: bytes, where: str, members: dict[str, int] | None, budget: int | None = None) -> dict[str, tuple]:
    """Dry-runs the pickle `data` (see the module docstring); `members` maps a storage key to its zip member's
    length (None for the legacy format, whose storages follow the pickle: then all of them together are held to
    `budget`, the bytes of the file after the pickle). Returns storage key -> (bytes, element size) it names."""
    with _as_format_error(where):
        run = _DryRun(data, where, members)
        run.load()
        claimed = sum(s.nbytes for s in run.storages.values())
        if members is None and budget is not None and claimed > budget:
            raise FormatError(f"{where}: its storages claim {claimed} bytes, the file holds {budget} after its "
                              f"pickle; {_CRAFTED}")
        return {k: (s.nbytes, s.itemsize) for k, s in run.storages.items()}


def value(data: bytes, where: str):
    """What the small pickle `data` holds, read by the dry run (nothing imported or called): the storage keys
    torch's legacy format lists after the object's pickle."""
    with _as_format_error(where):
        return _DryRun(data, where, {}).load()
