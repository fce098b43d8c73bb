"""A torch.save pickle whose dict key is a tuple nesting the same tuple twice at each level costs 2**levels to hash:
1.2 KB at 40 levels held inspect, run and load for hours, first in ckptbench's dry run of the pickle and again in
torch's weights_only unpickler, before any check of what it holds. The dry run now costs each key's hash from the
tuples it holds (each tuple once) and refuses a pickle whose keys would take more steps than its bytes allow; a DCP
byte entry or chunk read into memory gets the same dry run before torch.load (it had none): such an entry is kept
as its raw bytes, never unpickled."""

from __future__ import annotations

import io
import pickle
import struct
import zipfile

import pytest
import torch
from clirun import run_cli

from ckptbench.checkpoint.formats.state import RawBytes

P = pickle


def _dag_key_pickle(levels: int) -> bytes:
    """{'j': None, t: None}, t = (t', t') nested `levels` deep, in the opcodes torch's weights_only unpickler
    takes (no MEMOIZE, no POP): the tuples are built in a list under 'j', which is then replaced."""
    def put(i):
        return P.LONG_BINPUT + struct.pack("<I", i)

    def get(i):
        return P.LONG_BINGET + struct.pack("<I", i)

    j = P.BINUNICODE + struct.pack("<I", 1) + b"j"
    out = P.PROTO + b"\x02" + P.EMPTY_DICT + j + P.EMPTY_LIST + P.EMPTY_TUPLE + put(0) + P.APPEND
    for i in range(levels):
        out += get(i) + get(i) + P.TUPLE2 + put(i + 1) + P.APPEND
    return out + P.SETITEM + j + P.NONE + P.SETITEM + get(levels) + P.NONE + P.SETITEM + P.STOP


def _torch_bytes(pkl: bytes) -> bytes:
    """A torch.save archive of {'a': 1} with its data.pkl replaced by `pkl`."""
    buf = io.BytesIO()
    torch.save({"a": 1}, buf)
    src, out = zipfile.ZipFile(io.BytesIO(buf.getvalue())), io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            z.writestr(info.filename, pkl if info.filename.endswith("data.pkl") else src.read(info.filename))
    return out.getvalue()


def test_the_pickles_own_keys_hash_within_its_size_and_torch_reads_it():
    """The same opcodes with a flat key load: what is refused below is the nesting, not the way it is written."""
    raw = _torch_bytes(_dag_key_pickle(3))
    assert len(torch.load(io.BytesIO(raw), weights_only=True)) == 2


def test_a_shard_whose_key_nests_one_tuple_twice_per_level_is_one_line(tmp_path):
    (tmp_path / "pytorch_model.bin").write_bytes(_torch_bytes(_dag_key_pickle(22)))
    for cmd in (("inspect",), ("load",)):
        r = run_cli(*cmd, tmp_path)
        assert r.rc != 0 and "Traceback" not in r.err, r.err
        errors = [ln for ln in r.err_lines if ln.startswith("ckptbench: error:")]
        assert len(errors) == 1 and "keys would take more steps to hash" in errors[0], r.err


def test_a_dcp_byte_entry_of_such_a_pickle_is_kept_as_its_bytes():
    from ckptbench.checkpoint.formats.dcp_format import load_byte_entry

    raw = _torch_bytes(_dag_key_pickle(22))
    assert isinstance(load_byte_entry(raw), RawBytes)
    assert load_byte_entry(_torch_bytes(_dag_key_pickle(3))) == {"j": None, ((((), ()), ((), ())),) * 2: None}


def test_a_dcp_chunk_located_for_a_ranged_read_refuses_such_a_key(tmp_path):
    """The ranged reads' own recorder of a chunk's pickle (dcp_items.locate) hashed the key too."""
    import os

    from ckptbench.checkpoint.formats.dcp_items import locate
    from ckptbench.checkpoint.formats.state import FormatError

    raw = _torch_bytes(_dag_key_pickle(22))
    (tmp_path / "__0_0.distcp").write_bytes(raw)
    fd = os.open(tmp_path / "__0_0.distcp", os.O_RDONLY)
    try:
        with pytest.raises(FormatError, match="x: a DCP chunk's pickle has a key that is a tuple, not a plain"):
            locate(fd, 0, len(raw), torch.float32, (1,), "x")
    finally:
        os.close(fd)


def _dag_call_pickle(levels: int, module: str, name: str, pairs: bool) -> bytes:
    """{'j': module.name([t]) or module.name([(t, None)])}: the call torch's unpickler makes hashes t."""
    def put(i):
        return P.LONG_BINPUT + struct.pack("<I", i)

    def get(i):
        return P.LONG_BINGET + struct.pack("<I", i)

    j = P.BINUNICODE + struct.pack("<I", 1) + b"j"
    out = P.PROTO + b"\x02" + P.EMPTY_DICT + j + P.EMPTY_LIST + P.EMPTY_TUPLE + put(0) + P.APPEND
    for i in range(levels):
        out += get(i) + get(i) + P.TUPLE2 + put(i + 1) + P.APPEND
    item = get(levels) + P.NONE + P.TUPLE2 if pairs else get(levels)
    call = P.GLOBAL + f"{module}\n{name}\n".encode() + P.EMPTY_LIST + item + P.APPEND + P.TUPLE1 + P.REDUCE
    return out + P.SETITEM + j + call + P.SETITEM + P.STOP


@pytest.mark.parametrize("module, name, pairs", [("builtins", "set", False), ("collections", "Counter", False),
                                                 ("collections", "OrderedDict", True)])
def test_a_set_or_ordered_dict_built_of_such_tuples_is_one_line(tmp_path, module, name, pairs):
    """torch's unpickler builds them by calling the class on a list: each item (each pair's key) hashed whole."""
    assert len(torch.load(io.BytesIO(_torch_bytes(_dag_call_pickle(2, module, name, pairs))), weights_only=True)) == 1
    (tmp_path / "pytorch_model.bin").write_bytes(_torch_bytes(_dag_call_pickle(22, module, name, pairs)))
    r = run_cli("inspect", tmp_path)
    errors = [ln for ln in r.err_lines if ln.startswith("ckptbench: error:")]
    assert r.rc != 0 and len(errors) == 1 and "keys would take more steps to hash" in errors[0], r.err


def test_a_long_int_key_given_again_and_again_is_one_line(tmp_path):
    """An int's hash reads every digit and is not cached: a key of 10**5 digits given again by a 5-byte GET costs
    10**5 steps a time, 10**12 from a few MB."""
    big = 10 ** 100_000
    raw = big.to_bytes((big.bit_length() + 8) // 8, "little", signed=True)
    get = P.LONG_BINGET + struct.pack("<I", 0)
    pkl = (P.PROTO + b"\x02" + P.EMPTY_DICT + P.LONG4 + struct.pack("<I", len(raw)) + raw + P.LONG_BINPUT
           + struct.pack("<I", 0) + P.NONE + P.SETITEM + P.MARK + (get + P.NONE) * 400 + P.SETITEMS + P.STOP)
    (tmp_path / "pytorch_model.bin").write_bytes(_torch_bytes(pkl))
    r = run_cli("inspect", tmp_path)
    errors = [ln for ln in r.err_lines if ln.startswith("ckptbench: error:")]
    assert r.rc != 0 and len(errors) == 1 and "keys would take more steps to hash" in errors[0], r.err


def test_a_dcp_chunk_with_a_long_int_key_is_refused_by_the_recorder(tmp_path):
    import os

    from ckptbench.checkpoint.formats.dcp_items import locate
    from ckptbench.checkpoint.formats.state import FormatError

    big = 10 ** 1000
    raw = big.to_bytes((big.bit_length() + 8) // 8, "little", signed=True)
    pkl = P.PROTO + b"\x02" + P.EMPTY_DICT + P.LONG4 + struct.pack("<I", len(raw)) + raw + P.NONE + P.SETITEM + P.STOP
    (tmp_path / "__0_0.distcp").write_bytes(_torch_bytes(pkl))
    fd = os.open(tmp_path / "__0_0.distcp", os.O_RDONLY)
    try:
        with pytest.raises(FormatError, match="x: a DCP chunk's pickle has a key that is a int, not a plain"):
            locate(fd, 0, os.fstat(fd).st_size, torch.float32, (1,), "x")
    finally:
        os.close(fd)
