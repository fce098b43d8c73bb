"""Work bounded by the checkpoint's size (issue #25): each crafted file below is a few KiB and must be refused (or
read) in one line within a time and memory budget, whatever it asks the loaders to walk or allocate.

Memory is measured in a child process (its peak RSS after the imports, against its peak after the call), so one
case's allocation cannot hide behind another's."""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
import time
import warnings
import zipfile
from collections import OrderedDict

import pytest
import torch

from ckptbench.core.errors import CkptbenchError
from ckptbench.checkpoint.formats import FormatError

SECONDS, MIB = 2.0, 256


def _in_child(body: str, timeout: float = 120) -> list[dict]:
    """Runs `body` (which defines `cases`: name -> zero-argument callable) in a fresh interpreter; per case, the
    one error line it raised (or None), the seconds it took and the MiB its peak RSS grew by."""
    script = textwrap.dedent("""
        import json, resource, sys, time, warnings
        warnings.simplefilter("ignore")
        import torch
        from ckptbench.checkpoint.formats import torch_format, dcp_format, dcp_metadata
        def peak(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        """) + textwrap.dedent(body) + textwrap.dedent("""
        out = []
        for name, call in cases.items():
            before, t = peak(), time.monotonic()
            try:
                call(); err = None
            except Exception as exc:
                err = f"{type(exc).__name__}: {exc}"
            out.append({"name": name, "err": err, "s": time.monotonic() - t, "mib": peak() - before,
                        "modules": sorted(m for m in sys.modules if m.startswith(("torch._dynamo", "torch._inductor")))})
        print(json.dumps(out))
        """)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _refused_within(results: list[dict], needle: str, seconds: float = SECONDS, mib: float = MIB) -> None:
    for r in results:
        assert r["err"] and r["err"].startswith(("FormatError", "CkptbenchError")), r
        assert "\n" not in r["err"] and needle in r["err"], r
        assert r["s"] <= seconds and r["mib"] <= mib, r


def _modes(path: str) -> str:
    """The three ways a torch file is read: inspect (peek), staged (load_file), fused (load_buffer)."""
    return f"""
        P = {path!r}
        cases = {{"peek": lambda: torch_format.peek_file(P), "file": lambda: torch_format.load_file(P),
                 "buffer": lambda: torch_format.load_buffer(bytearray(open(P, "rb").read()), P)}}
        """


def _save(tmp_path, obj, name: str = "crafted.pt") -> str:
    path = str(tmp_path / name)
    torch.save({"w": torch.zeros(2), "x": obj}, path)
    return path


# ---- 1. shared graphs ---------------------------------------------------------------------------------------------


def test_a_shared_nested_list_is_refused_within_budget(tmp_path):
    shared = [1]
    for _ in range(21):  # each level refers to the one below twice through the pickle memo: 2**21 paths
        shared = [shared, shared]
    path = _save(tmp_path, shared)
    assert os.path.getsize(path) < 4096
    _refused_within(_in_child(_modes(path)), "crafted.pt")


def test_a_small_shared_reference_still_loads(tmp_path):
    from ckptbench.checkpoint.formats import torch_format

    groups = [{"lr": 0.1, "params": list(range(8))}]
    path = _save(tmp_path, {"a": groups, "b": groups})  # a trainer may refer to one object twice
    state = torch_format.load_file(path)
    assert state.extra["x.a.0.lr"] == state.extra["x.b.0.lr"] == 0.1


# ---- 2. allocations asked for by the pickle -----------------------------------------------------------------------


class _Calls:
    def __init__(self, func, *args):
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize("case", ["bytearray", "FloatTensor", "Storage", "stride0", "meta"])
def test_allocations_the_pickle_asks_for_are_checked_first(tmp_path, case):
    obj = {"bytearray": lambda: _Calls(bytearray, 1 << 30),
           "FloatTensor": lambda: _Calls(torch.FloatTensor, 1 << 28),
           "Storage": lambda: _Calls(torch.FloatStorage, 1 << 28),
           "stride0": lambda: torch.zeros(1).expand(1 << 28),
           "meta": lambda: torch.empty(4, device="meta")}[case]()
    path = _save(tmp_path, obj)
    _refused_within(_in_child(_modes(path)), "crafted.pt")


def test_a_bytearray_of_saved_bytes_and_an_expanded_row_still_load(tmp_path):
    from ckptbench.checkpoint.formats import torch_format

    ids = torch.arange(16).expand((1, -1))  # how Hugging Face keeps position_ids: stride 0 on a size-1 dimension
    path = _save(tmp_path, {"raw": bytearray(b"abc"), "ids": ids})
    for state in (torch_format.load_file(path), torch_format.load_buffer(bytearray(open(path, "rb").read()), path)):
        assert state.extra["x.raw"] == bytearray(b"abc")
        assert torch.equal({**state.model, **state.extra}["x.ids"], ids)


# ---- 6. a storage larger than its zip member ----------------------------------------------------------------------


def _rezip(raw: bytes, edit) -> bytes:
    zin = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info in zin.infolist():
            data = zin.read(info.filename)
            z.writestr(info.filename, edit(info.filename, data))
    return out.getvalue()


def test_every_mode_refuses_a_storage_larger_than_its_member_in_the_same_line(tmp_path):
    from ckptbench.checkpoint.formats import torch_format

    buf = io.BytesIO()
    torch.save({"w": torch.arange(16.0)}, buf)
    pkl = [zipfile.ZipFile(io.BytesIO(buf.getvalue())).read(n) for n in zipfile.ZipFile(buf).namelist()
           if n.endswith("data.pkl")][0]
    assert b"cpuq\x06K\x10" in pkl
    raw = _rezip(buf.getvalue(), lambda n, d: d.replace(b"cpuq\x06K\x10", b"cpuq\x06K\x40"))  # 16 floats -> 64
    path = tmp_path / "big.pt"
    path.write_bytes(raw)
    lines = set()
    for load in (lambda: torch_format.peek_file(str(path)), lambda: torch_format.load_file(str(path)),
                 lambda: torch_format.load_buffer(bytearray(raw), str(path))):
        with pytest.raises(FormatError) as exc:
            load()
        lines.add(str(exc.value))
    assert len(lines) == 1, lines
    line = lines.pop()
    assert line.startswith(str(path)) and "storage '0'" in line and "256" in line and "64" in line, line


# ---- 4. names checked before they are resolved --------------------------------------------------------------------


def test_names_are_checked_before_anything_is_imported(tmp_path):
    meta_dir = tmp_path / "dcp"
    meta_dir.mkdir()
    (meta_dir / ".metadata").write_bytes(b"\x80\x02ctorch\n_dynamo\n.")
    (meta_dir / "__0_0.distcp").write_bytes(b"")
    pt = tmp_path / "dyn.pt"
    raw = io.BytesIO()
    torch.save({"w": torch.zeros(2)}, raw)
    pt.write_bytes(_rezip(raw.getvalue(), lambda n, d: d.replace(b"ccollections\nOrderedDict\n",
                                                                  b"ctorch\n_inductor\n") if n.endswith(".pkl") else d))
    chunk = io.BytesIO()
    torch.save(torch.zeros(2), chunk)
    chunk_raw = _rezip(chunk.getvalue(), lambda n, d: d.replace(b"ctorch\nFloatStorage\n", b"ctorch\n_dynamo\n")
                       if n.endswith(".pkl") else d)
    (tmp_path / "chunk.bin").write_bytes(chunk_raw)
    results = _in_child(f"""
        import os
        from ckptbench.checkpoint.formats import dcp_items
        def chunk():
            fd = os.open({str(tmp_path / "chunk.bin")!r}, os.O_RDONLY)
            dcp_items.locate(fd, 0, {len(chunk_raw)}, torch.float32, (2,), "chunk")
        cases = {{"metadata": lambda: dcp_metadata.SafeReader({str(meta_dir)!r}).read_metadata(),
                 "pickle": lambda: torch_format.load_file({str(pt)!r}),
                 "chunk": chunk}}
        """)
    for r in results:
        assert r["err"] and r["err"].startswith("FormatError"), r
        assert r["modules"] == [], r


# ---- 5. crafted pickles give one line, never a traceback ----------------------------------------------------------


class _ItemsAttr:
    """An OrderedDict whose BUILD state sets an instance attribute `items` (shadowing the method)."""

    def __reduce__(self):
        return OrderedDict, (), {"items": 5, "get": 1}


def test_an_ordered_dict_with_an_items_attribute_is_data_or_one_line(tmp_path):
    from ckptbench.checkpoint.formats import torch_format

    path = _save(tmp_path, _ItemsAttr())
    for load in (torch_format.load_file, torch_format.peek_file):
        try:
            load(path)
        except CkptbenchError as exc:
            assert "\n" not in str(exc) and str(exc).startswith(path)


# ---- 3. DCP: the tree rebuild and the overlap check ---------------------------------------------------------------


def _dcp(tmp_path, state: dict):
    import torch.distributed.checkpoint as dcp

    d = tmp_path / "dcp"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(d), no_dist=True)
    return d


def _rewrite_metadata(d, edit) -> None:
    with open(d / ".metadata", "rb") as f:
        meta = pickle.load(f)
    edit(meta)
    with open(d / ".metadata", "wb") as f:
        pickle.dump(meta, f)


def test_planner_data_cannot_make_the_tree_rebuild_allocate(tmp_path):
    d = _dcp(tmp_path, {f"k{i}": torch.zeros(1) for i in range(8)})

    def deep(meta):
        meta.planner_data = {f"k{i}": (f"k{i}",) + (2 ** 20 - 1,) * 20 for i in range(8)}

    _rewrite_metadata(d, deep)
    assert os.path.getsize(d / ".metadata") < 8192
    results = _in_child(f"""
        cases = {{"load": lambda: print(dcp_format.load_dir({str(d)!r}).tree, file=sys.stderr)}}
        """)
    assert results[0]["err"] is None, results
    assert results[0]["s"] <= SECONDS and results[0]["mib"] <= MIB, results


def test_the_overlap_check_is_near_linear():
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    from ckptbench.checkpoint.formats.dcp_metadata import _no_overlap

    n = 20_000
    cols = [ChunkStorageMetadata(offsets=torch.Size([0, i]), sizes=torch.Size([4, 1])) for i in range(n)]
    t = time.monotonic()
    _no_overlap(cols, "x")
    assert time.monotonic() - t <= SECONDS
    with pytest.raises(FormatError, match="overlap"):
        _no_overlap(cols + [ChunkStorageMetadata(offsets=torch.Size([2, n - 1]), sizes=torch.Size([1, 1]))], "x")


# ---- 7. one rule for names beyond torch's allowlist ---------------------------------------------------------------


def test_every_name_beyond_the_allowlist_is_a_stand_in_and_nothing_runs(tmp_path):
    import operator

    from ckptbench.checkpoint.formats import torch_format

    marker = tmp_path / "MARKER"
    path = _save(tmp_path, {"e": _Calls(eval, f"open({str(marker)!r}, 'w')"),
                            "g": operator.attrgetter("x"),
                            "t": _Calls(type, "X", (), {})})
    state = torch_format.load_file(path)
    assert {"builtins.eval", "operator.attrgetter", "builtins.type"} <= state.inert
    assert state.extra["x.e.args.0"].startswith("open(")
    assert not marker.exists()


def test_a_module_torch_blocks_is_refused_in_one_line(tmp_path):
    import functools

    from ckptbench.checkpoint.formats import torch_format

    for obj in (_Calls(os.system, "true"), functools.partial(print, "ran")):  # the second: state no stand-in holds
        path = _save(tmp_path, obj)
        with pytest.raises(FormatError) as exc:
            torch_format.load_file(path)
        assert str(exc.value).startswith(path) and "refused" in str(exc.value) and "\n" not in str(exc.value)


def test_malformed_chunk_pickles_are_one_line(tmp_path):
    from ckptbench.checkpoint.formats import dcp_items

    chunk = io.BytesIO()
    torch.save(torch.zeros(2), chunk)
    bad = [b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(K\x01K\x00K\x02tR.",  # no storage
           b"\x80\x02ctorch._utils\n_rebuild_tensor_v2\n(NK\x00K\x02K\x01tR.",  # size not a sequence
           b"\x80\x02r\x00\x00\x00\x08N.",  # a memo index of 2**27: a dict entry, not a 2 GiB table
           b"\x80\x02ccollections\nOrderedDict\n)R}X\x05\x00\x00\x00itemsK\x05sb."]
    for i, pkl in enumerate(bad):
        raw = _rezip(chunk.getvalue(), lambda n, d: pkl if n.endswith("data.pkl") else d)
        path = tmp_path / f"c{i}"
        path.write_bytes(raw)
        fd = os.open(path, os.O_RDONLY)
        try:
            with pytest.raises(FormatError) as exc:
                dcp_items.locate(fd, 0, len(raw), torch.float32, (2,), f"chunk{i}")
        finally:
            os.close(fd)
        assert str(exc.value).startswith(f"chunk{i}") and "\n" not in str(exc.value)


def test_a_legacy_file_whose_storages_claim_more_than_it_holds_is_refused_first(tmp_path):
    """The pre-zip format: torch allocates each storage from the size its pickle states before reading its bytes."""
    path = str(tmp_path / "legacy.pt")
    torch.save({"w": torch.arange(10.0)}, path, _use_new_zipfile_serialization=False)
    raw = open(path, "rb").read()
    assert raw.count(b"K\nN") == 1  # the storage's numel, 10, as BININT1 before the view metadata (None)
    with open(path, "wb") as f:
        f.write(raw.replace(b"K\nN", b"J\x00\x00\x00\x40N"))  # 2**30 elements: 4 GiB of float32
    _refused_within(_in_child(_modes(path)), "its storages claim 4294967296 bytes")
    honest = str(tmp_path / "honest.pt")
    torch.save({"w": torch.arange(10.0)}, honest, _use_new_zipfile_serialization=False)
    from ckptbench.checkpoint.formats import torch_format

    assert torch.equal(torch_format.load_file(honest).model["w"], torch.arange(10.0))
