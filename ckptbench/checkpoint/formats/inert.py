"""Objects of classes a torch.save file names but ckptbench will not import, kept as plain data and never run.

A Lightning checkpoint keeps its hyper_parameters as an AttributeDict (or an argparse.Namespace, an OmegaConf
DictConfig, a pathlib path); training scripts put their own config classes beside the weights. torch's weights_only
unpickler refuses the whole file for one such name, though every tensor in it is plain. Here each name the pickle
asks for beyond torch's allowlist is handed to that same unpickler (torch's safe_globals, for the load alone) as a
stand-in of ours: calling or instantiating it records the arguments and returns an OrderedDict marked with the name,
so the items and attributes the pickle then sets land in it as data. After the load every marked OrderedDict becomes
a plain dict of its items and attributes, and the names are reported. Nothing of the named class is imported or
called: the stand-in is all the pickle ever reaches.

The rule: a name on torch's weights_only allowlist (plus numeric numpy arrays, torch_format) is what torch makes
of it; a name under torch or numpy beyond it is refused (tensor and array types, DTensor, object arrays, whose
meaning a stand-in would silently change); a name in a module torch itself blocks (os, sys, posix, nt) is refused
by torch's unpickler; every other name, whatever it names (eval, subprocess, functools.partial), is a stand-in.
No list of dangerous names is kept: none could be complete, and none is needed, since no named object is reached.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict

from ckptbench.checkpoint.formats.state import MAX_DEPTH, FormatError

_MARK = "\x00ckptbench-inert"  # the key a stand-in's OrderedDict carries its class name under, in its __dict__


def names_in(source) -> list[str]:
    """The globals a zip-format torch.save file's pickle names beyond torch's allowlist (read from its opcodes,
    nothing run); `source` is a path or a seekable file object, left where it was."""
    from torch import serialization as ts

    pos = source.tell() if hasattr(source, "tell") else None
    try:
        return sorted(ts.get_unsafe_globals_in_checkpoint(source))
    finally:
        if pos is not None:
            source.seek(pos)


def describe(names) -> str:
    """The line every output gives for the classes kept as plain data."""
    return "kept as plain data, their classes never imported or run: " + ", ".join(sorted(names))


def _root(name: str) -> str:
    return name.split(".", 1)[0]


class _StandIn:
    """What the pickle gets for one named class or function: any call or instantiation yields a marked
    OrderedDict (the unpickler lets items, and attributes through BUILD, be set on an OrderedDict only)."""

    name = ""

    def __new__(cls, *args):
        od = OrderedDict()
        od.__dict__[_MARK] = cls.name
        if args:
            od.__dict__["args"] = list(args)
        return od


def _stand_in(name: str) -> type:
    return type(f"NotUnpickled[{name}]", (_StandIn,), {"name": name, "__module__": __name__})


@contextlib.contextmanager
def stand_ins(names: list[str], where: str):
    """torch's weights_only unpickler with a stand-in for each of `names`, for the duration of a load; refuses
    (FormatError) torch's and numpy's own names that torch does not allow."""
    own = [n for n in names if _root(n) in ("torch", "numpy")]
    if own:
        raise FormatError(f"{where}: refused — its pickle names {', '.join(own[:3])}, which torch's weights_only "
                          "unpickler does not allow and a stand-in cannot replace faithfully (tensor and array "
                          "types); re-save it as a plain state dict or safetensors")
    if not names:
        yield
        return
    from torch import serialization as ts

    # torch's safe_globals adds these on entry and removes just these on exit (one set swapped whole each time),
    # so loads in other threads keep theirs; each stand-in is a new class, never shared between loads
    with ts.safe_globals([(_stand_in(n), n) for n in names]):
        yield


def plain(obj, where: str, depth: int = 0):
    """`obj` with every stand-in's OrderedDict turned into a plain dict: its items, then its attributes under
    names the items do not use (the arguments it was made with under "args"). Containers are rebuilt in place."""
    if depth > MAX_DEPTH:  # a pickle can nest, or refer to itself, without end
        raise FormatError(f"{where}: nested deeper than {MAX_DEPTH} levels; the file is corrupt or crafted")
    if isinstance(obj, OrderedDict) and _MARK in obj.__dict__:
        out = {k: plain(v, where, depth + 1) for k, v in OrderedDict.items(obj)}
        for k, v in obj.__dict__.items():
            if k != _MARK and isinstance(k, str) and k not in out:
                out[k] = plain(v, where, depth + 1)
        return out
    if type(obj) in (dict, OrderedDict):
        for k, v in list(dict.items(obj)):
            obj[k] = plain(v, where, depth + 1)
    elif type(obj) is list:
        obj[:] = [plain(v, where, depth + 1) for v in obj]
    elif type(obj) is tuple:
        return tuple(plain(v, where, depth + 1) for v in obj)
    return obj
