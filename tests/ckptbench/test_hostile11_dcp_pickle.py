"""A DCP .metadata pickle naming only the classes it may (DCP's own, the planner's Megatron keeps) could still, through
them, change torch's own objects for the rest of the process (a BUILD on a class or function it names: pathlib's
PosixPath, torch.serialization._get_layout and its cache of layouts), hash a key for hours (a tuple nesting the same
tuple twice at each of 40 levels: 500 bytes), or have an error line's str() of such a list run as long. Each is now
refused in one line, at once; the real checkpoints of Megatron, torchtitan and Accelerate still read."""

from __future__ import annotations

import glob
import os
import pathlib
import pickle
import shutil
import struct

import pytest
import torch.serialization
from clirun import run_cli

from ckptbench.core.errors import CkptbenchError

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "compat", "fixtures")
TITAN = os.path.join(FIXTURES, "torchtitan_dump", "checkpoint", "step-5")
P = pickle


def _get(i: int) -> bytes:
    return P.LONG_BINGET + struct.pack("<I", i)


def _global(module: str, name: str) -> bytes:
    return b"".join(P.SHORT_BINUNICODE + bytes([len(s)]) + s.encode() for s in (module, name)) + P.STACK_GLOBAL


def _tuple_dag(levels: int) -> bytes:
    """Memo 0..levels: t0 = (), t(i+1) = (ti, ti): a hash of t(levels) costs 2**levels."""
    out = P.EMPTY_TUPLE + P.MEMOIZE
    for i in range(levels):
        out += _get(i) + _get(i) + P.TUPLE2 + P.MEMOIZE
    return out


def _read(tmp_path, raw: bytes):
    from ckptbench.checkpoint.formats.dcp_metadata import SafeReader

    d = tmp_path / "ck"
    shutil.copytree(TITAN, d)
    (d / ".metadata").write_bytes(P.PROTO + b"\x04" + raw)
    return SafeReader(str(d)).read_metadata()


@pytest.mark.parametrize("target, name", [(("pathlib", "PosixPath"), "PosixPath"),
                                          (("torch.serialization", "_get_layout"), "_get_layout")])
def test_a_build_on_a_class_or_function_it_names_is_refused(tmp_path, target, name):
    owner = {"PosixPath": pathlib.PosixPath, "_get_layout": torch.serialization._get_layout}[name]
    state = P.NONE + P.EMPTY_DICT + P.SHORT_BINUNICODE + b"\x13ckptbench_hostile11" + P.NEWTRUE + P.SETITEM + P.TUPLE2
    try:
        with pytest.raises(CkptbenchError, match=f"sets the state of {name}, which DCP metadata never does"):
            _read(tmp_path, _global(*target) + state + P.BUILD + P.POP + P.NONE + P.STOP)
        assert not hasattr(owner, "ckptbench_hostile11")
    finally:
        if "ckptbench_hostile11" in vars(owner):
            delattr(owner, "ckptbench_hostile11")


@pytest.mark.parametrize("build", [
    lambda dag: P.EMPTY_DICT + dag + P.NONE + P.SETITEM,
    lambda dag: P.EMPTY_DICT + P.MARK + dag + P.NONE + P.SETITEMS,
    lambda dag: P.MARK + dag + P.NONE + P.DICT,
])
def test_a_key_of_nested_tuples_is_refused_before_it_is_hashed(tmp_path, build):
    with pytest.raises(CkptbenchError, match="has a key that is a tuple holding more than names and numbers"):
        _read(tmp_path, _tuple_dag(20) + P.POP + build(_get(20)) + P.STOP)


def test_an_enum_built_from_nested_tuples_is_refused(tmp_path):
    raw = _tuple_dag(20) + P.POP + _global("torch.distributed.checkpoint.planner", "WriteItemType") + _get(20)
    with pytest.raises(CkptbenchError, match="builds WriteItemType from more than names and numbers"):
        _read(tmp_path, raw + P.TUPLE1 + P.REDUCE + P.STOP)


@pytest.mark.parametrize("field", ["relative_path", "offset", "transform_descriptors"])
def test_a_storage_field_of_nested_lists_is_named_by_its_type(tmp_path, field):
    """str() of it, for the error line, was 2**levels of work."""
    d = tmp_path / "ck"
    shutil.copytree(TITAN, d)
    with open(d / ".metadata", "rb") as f:
        meta = pickle.load(f)  # the fixture, ours: plain pickle only to craft the hostile copy
    nested: list = []
    for _ in range(20):
        nested = [nested, nested]
    setattr(next(iter(meta.storage_data.values())), field, nested)
    (d / ".metadata").write_bytes(pickle.dumps(meta))
    r = run_cli("inspect", d)
    assert r.rc != 0 and "Traceback" not in r.err
    assert "a list" in r.err and "[[" not in r.err, r.err


def test_real_dcp_metadata_still_reads():
    from ckptbench.checkpoint.formats.dcp_metadata import SafeReader

    found = glob.glob(os.path.join(FIXTURES, "**", ".metadata"), recursive=True)
    assert len(found) >= 4
    for path in found:
        assert SafeReader(os.path.dirname(path)).read_metadata().state_dict_metadata


@pytest.mark.parametrize("call", [
    lambda dag: dag + P.TUPLE1 + P.NEWOBJ,
    lambda dag: dag + P.TUPLE1 + P.EMPTY_DICT + P.NEWOBJ_EX,
    lambda dag: P.EMPTY_TUPLE + P.EMPTY_DICT + P.SHORT_BINUNICODE + b"\x05value" + dag + P.SETITEM + P.NEWOBJ_EX,
])
def test_an_enum_made_by_newobj_from_nested_tuples_is_refused(tmp_path, call):
    """Enum.__new__ looks its value up (a hash) and, not finding it, repr()s it: 2**levels either way."""
    raw = _tuple_dag(20) + P.POP + _global("torch.distributed.checkpoint.planner", "WriteItemType")
    with pytest.raises(CkptbenchError, match="builds WriteItemType from more than names and numbers"):
        _read(tmp_path, raw + call(_get(20)) + P.STOP)


@pytest.mark.parametrize("item", [P.BININT1 + b"\x01", P.LONG1 + b"\x10" + b"\x7f" * 16])
def test_a_long_key_given_again_and_again_is_refused(tmp_path, item):
    """A tuple's hash (and a long int's) is not cached: one of 10**5 items behind 10**5 keys is 10**10 steps."""
    n = 100 if item.startswith(P.LONG1) else 100_000
    key = (P.MARK + item * n + P.TUPLE if n > 100 else item) + P.MEMOIZE
    raw = key + P.POP + P.EMPTY_DICT + P.MARK + (_get(0) + P.NONE) * 2 + P.SETITEMS + P.STOP
    with pytest.raises(CkptbenchError, match="has a key that is a (tuple|int) holding more than names and numbers"):
        _read(tmp_path, raw)
