"""Hostile checkpoints, third pass: the work a torch.save file causes grows with its bytes (counted in calls and
characters, never timed), and crafted files written by the real libraries, then damaged, get one line."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from ckptbench.checkpoint.formats import FormatError, check_walk, flatten, torch_format

FORMATS_DIR = os.path.dirname(torch_format.__file__)


def _optimizer_with_ids(path: str, n: int, depth: int = 0) -> None:
    """A torch optimizer's state_dict as torch.save writes it, its one param group listing `n` ids (nested `depth`
    dicts further down, as a crafted file may)."""
    ids = list(range(n))
    for _ in range(depth):
        ids = {"k": ids}
    torch.save({"state": {}, "param_groups": [{"lr": 0.1, "params": ids}]}, path)


def _calls_in_formats(call) -> int:
    """Python-level calls (generator resumes included) made in ckptbench's formats package while `call()` runs."""
    count = 0

    def profile(frame, event, arg):
        nonlocal count
        if event == "call" and frame.f_code.co_filename.startswith(FORMATS_DIR):
            count += 1

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return count


def test_a_million_ids_cost_one_step_each_whatever_their_nesting(tmp_path):
    """The 4.9 MB optimizer with 10**6 ids took 9-11 s: flatten's recursive generators cost every leaf one frame
    per level, check_walk and the numpy check one more step each. Now an id costs one step, at any depth."""
    counts = {}
    for n, depth in ((20_000, 0), (40_000, 0), (40_000, 20)):
        path = str(tmp_path / f"optim_{n}_{depth}.pt")
        _optimizer_with_ids(path, n, depth)
        state = None

        def load():
            nonlocal state
            state = torch_format.load_file(path)

        counts[n, depth] = _calls_in_formats(load)
        assert len(state.extra) == n + 2  # every id under its own key, as before, plus lr and the empty state
    assert counts[40_000, 0] - counts[20_000, 0] <= 1.1 * 20_000, counts  # linear, about one call per id
    assert counts[40_000, 20] - counts[40_000, 0] <= 1_000, counts  # and not multiplied by the nesting


def test_flatten_keeps_order_keys_and_errors():
    nested = {"a": [1, {"b": 2, "c": (3, torch.Size([4, 5]))}], "d": {}, "e": [], 7: "x"}
    # an empty container is a leaf: a load_state_dict may read it (LambdaLR's lr_lambdas [{}])
    assert list(flatten(nested, "p")) == [("p.a.0", 1), ("p.a.1.b", 2), ("p.a.1.c.0", 3),
                                          ("p.a.1.c.1", torch.Size([4, 5])), ("p.d", {}), ("p.e", []), ("p.7", "x")]
    assert list(flatten(5, "leaf")) == [("leaf", 5)]
    with pytest.raises(FormatError, match="key of type float"):
        list(flatten({"a": {1.5: 1}}))
    with pytest.raises(FormatError, match="key of type bool"):
        list(flatten({True: 1}))
    deep = 0
    for _ in range(33):
        deep = [deep]
    with pytest.raises(FormatError, match="nested deeper than 32"):
        list(flatten(deep))
    deep = deep[0]
    assert len(list(flatten(deep))) == 1


def test_check_walk_counts_every_value_once_per_path():
    shared = [0] * 10
    graph = [shared] * 10  # 1 + 10 lists + 100 ints along every path
    check_walk(graph, 111, "w")
    with pytest.raises(FormatError, match="more than 110 values"):
        check_walk(graph, 110, "w")


def test_a_long_key_over_many_leaves_is_refused_before_its_keys_are_built(tmp_path):
    """A 200 KB dict key over a list of 40 Nones is 200 KB of pickle, and its flat keys (the key once per leaf)
    would be 8 MB; at the same ratio a 3 MB file builds a terabyte. Keys average at most 128 characters a leaf
    beyond 1 MiB."""
    path = str(tmp_path / "optim.pt")
    torch.save({"state": {}, "param_groups": [{"x" * 200_000: [None] * 40}]}, path)
    with pytest.raises(FormatError, match="flat keys run to") as err:
        torch_format.load_file(path)
    assert str(err.value).startswith(path) and "\n" not in str(err.value)
    torch.save({"state": {}, "param_groups": [{"x" * 200_000: [{}] * 40}]}, path)  # empty dicts: leaves too
    with pytest.raises(FormatError, match="flat keys run to"):
        torch_format.load_file(path)
    torch.save({"state": {}, "param_groups": [{"x" * 200_000: [None] * 2}]}, path)  # one long key is fine
    assert len(torch_format.load_file(path).extra) == 3  # the two Nones, and the empty state, a leaf of its own


def _deep(n: int, make=list):
    v = 0
    for _ in range(n):
        v = make([v])
    return v


def _save_deep(obj, path: str) -> None:
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # torch's pickler recurses: only to write the crafted file
    try:
        torch.save(obj, path)
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.parametrize("obj", [
    {"state": {_deep(3000, tuple): {}}, "step": 1, "hparams": {}},  # a name 3000 tuples deep: repr recursed
    {"state": {}, "step": _deep(3000), "hparams": {}},  # a step 3000 lists deep
])
def test_a_deep_value_in_an_optimizer_shard_is_one_line(tmp_path, obj):
    path = str(tmp_path / "optim_rank000.pt")
    _save_deep(obj, path)
    with pytest.raises(FormatError, match="corrupt or crafted") as err:
        torch_format.load_file(path)
    assert str(err.value).startswith(path) and len(str(err.value)) < 400


@pytest.mark.parametrize("hparams", [{"a": _deep(100)}, {"t": torch.zeros(2)}, {(1, 2): 3}])
def test_hparams_must_be_what_json_holds(tmp_path, hparams):
    """ckptbench writes hparams back as JSON when it saves the state (save SOURCE TARGET): a 3000-deep list there
    failed the save with 'maximum recursion depth exceeded ... check the target and its permissions'."""
    path = str(tmp_path / "optim_rank000.pt")
    _save_deep({"state": {}, "step": 1, "hparams": hparams}, path)
    with pytest.raises(FormatError, match="hparams is not what a trainer writes"):
        torch_format.load_file(path)
    torch.save({"state": {}, "step": 1, "hparams": {"lr": 0.1, "betas": (0.9, 0.95), "name": None}}, path)
    assert torch_format.load_file(path).hparams["betas"] == (0.9, 0.95)


def test_safetensors_optimizer_hparams_nested_deep_are_refused(tmp_path):
    import json

    from safetensors.torch import save_file

    from ckptbench.checkpoint.formats import safetensors_format

    path = str(tmp_path / "optimizer-00001-of-00001.safetensors")
    meta = {"ckptbench_optimizer": json.dumps({"step": 1, "hparams": {"a": _deep(500)}})}
    save_file({"w.exp_avg": torch.zeros(2)}, path, metadata=meta)
    with pytest.raises(FormatError, match="optimizer metadata is not valid"):
        safetensors_format.load_file(path)


def test_a_safetensors_error_quotes_a_huge_key_briefly(tmp_path):
    import json
    import struct

    from ckptbench.checkpoint.formats import safetensors_format

    path = str(tmp_path / "model.safetensors")
    header = json.dumps({"k" * 5_000_000: {"dtype": "XX", "shape": [1], "data_offsets": [0, 4]}}).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + bytes(4))
    for load in (safetensors_format.load_file, lambda p: safetensors_format.load_buffer(open(p, "rb").read(), p)):
        with pytest.raises(FormatError, match="has dtype 'XX'") as err:
            load(path)
        assert len(str(err.value)) < 600  # the key cut at quote.quote's 200 characters, and the path


def test_a_tensor_with_a_hundred_thousand_dims_is_refused_by_count(tmp_path):
    """The product of 400,000 dims of 3 (a 1.6 MB pickle) took 8 s, its cost the square of the count."""
    import io
    import zipfile

    buf = io.BytesIO()
    torch.save({"w": torch.arange(4.0)}, buf)
    path = str(tmp_path / "dims.pt")
    with zipfile.ZipFile(buf) as zin, zipfile.ZipFile(path, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("data.pkl"):
                assert data.count(b"K\x04\x85") == 1 and data.count(b"K\x01\x85") == 1  # size (4,), stride (1,)
                data = data.replace(b"K\x04\x85", b"(" + b"K\x03" * 100_000 + b"t").replace(
                    b"K\x01\x85", b"(" + b"K\x00" * 100_000 + b"t")
            zout.writestr(info.filename, data)
    with pytest.raises(FormatError, match="at most 64 dimensions"):
        torch_format.load_file(path)


def _dcp(tmp_path, state: dict, name: str = "ckpt"):
    """A checkpoint written by torch.distributed.checkpoint itself, and its metadata unpickled for crafting."""
    import pickle
    import warnings

    import torch.distributed.checkpoint as dcp

    directory = str(tmp_path / name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=directory, no_dist=True)
    with open(os.path.join(directory, ".metadata"), "rb") as f:
        return directory, pickle.load(f)


def _rewrite(directory: str, meta) -> None:
    import pickle

    with open(os.path.join(directory, ".metadata"), "wb") as f:
        pickle.dump(meta, f)


def test_dcp_storage_entries_sharing_bytes_are_refused(tmp_path):
    """2000 byte entries over one shard's whole span: each was read, unpickled and held, N entries costing N times
    the shard; DCP stores every item once."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    from ckptbench.checkpoint.formats import dcp_format

    directory, meta = _dcp(tmp_path, {"model": {"w": torch.arange(4.0)}, "note": "hello"})
    info = next(i for k, i in meta.storage_data.items() if k.fqn == "note")
    whole = _StorageInfo(info.relative_path, 0, os.path.getsize(os.path.join(directory, info.relative_path)))
    for i in range(2000):
        meta.state_dict_metadata[f"b{i}"] = BytesStorageMetadata()
        meta.storage_data[MetadataIndex(f"b{i}")] = whole
    _rewrite(directory, meta)
    with pytest.raises(FormatError, match="share bytes of '__0_0.distcp'"):
        dcp_format.load_dir(directory)


def test_dcp_metadata_naming_a_forbidden_global_says_which_file(tmp_path):
    from ckptbench.checkpoint.formats import dcp_format

    class Evil:
        def __reduce__(self):
            return os.system, ("echo crafted",)

    directory, meta = _dcp(tmp_path, {"model": {"w": torch.arange(4.0)}})
    meta.planner_data = Evil()
    _rewrite(directory, meta)
    with pytest.raises(FormatError, match=r"/\.metadata: names posix\.system, which is not DCP metadata") as err:
        dcp_format.load_dir(directory)
    assert str(err.value).startswith(directory)


def test_dcp_shard_that_is_a_fifo_is_named_as_one(tmp_path):
    from ckptbench.checkpoint.formats import dcp_format

    directory, _ = _dcp(tmp_path, {"model": {"w": torch.arange(4.0)}})
    shard = os.path.join(directory, "__0_0.distcp")
    os.remove(shard)
    os.mkfifo(shard)
    with pytest.raises(FormatError, match="names shard '__0_0.distcp', which is not a regular file"):
        dcp_format.load_dir(directory)


def test_dcp_byte_entry_that_shares_containers_without_end_stays_bytes(tmp_path):
    """A 4 KiB byte entry holding a list of two references to one list, 40 deep (2**40 paths), is kept as the bytes
    it was saved as, as a refused pickle is; a plain one is loaded."""
    import io

    from ckptbench.checkpoint.formats import RawBytes, dcp_format

    bomb = [0]
    for _ in range(40):
        bomb = [bomb, bomb]
    buf = io.BytesIO()
    torch.save(bomb, buf)
    assert dcp_format.load_byte_entry(buf.getvalue()).__class__ is RawBytes
    buf = io.BytesIO()
    torch.save({"epoch": 3, "ids": list(range(100))}, buf)
    assert dcp_format.load_byte_entry(buf.getvalue()) == {"epoch": 3, "ids": list(range(100))}


def _str_eq_counter():
    counts = {"eq": 0}

    class Name(str):
        __hash__ = str.__hash__

        def __eq__(self, other):
            counts["eq"] += 1
            return str.__eq__(self, other)

    return Name, counts


def test_reading_every_packed_member_costs_one_lookup_each(tmp_path):
    """read_member scanned the file list for its pack's size on every call: n members, n packs, n**2 compares."""
    from ckptbench.checkpoint import manifest as mf
    from ckptbench.checkpoint import members

    Name, counts = _str_eq_counter()
    per_n = {}
    for n in (100, 200):
        directory = tmp_path / f"d{n}"
        directory.mkdir()
        files, tables = [], {}
        for i in range(n):
            pack_file = f"pack-{i:05d}.ckpack"
            (directory / pack_file).write_bytes(b"x" * 4)
            files.append(mf.FileEntry(Name(pack_file), 4, None, "pack"))
            tables[pack_file] = {f"m{i}.json": [0, 4, "small", None]}
        man = mf.Manifest("safetensors", "p", {}, 0, "fp32", "fp32", 1, 0, "none", tuple(files), packs=tables)
        counts["eq"] = 0
        assert all(members.read_member(str(directory), man, f"m{i}.json") == b"x" * 4 for i in range(n))
        per_n[n] = counts["eq"]
    assert per_n[200] <= 2 * per_n[100] + 10, per_n


def test_names_inside_other_names_are_found_in_one_sorted_pass():
    """Every prefix of every name was joined and looked up: 2000 names of 2048 parts took 65 s."""
    from ckptbench.checkpoint import packs
    from ckptbench.core.errors import CkptbenchError

    with pytest.raises(CkptbenchError, match="'a/c' would sit inside 'a', which is a file"):
        packs._check_names("w", ["a", "a-b", "a.b", "a/c"])
    packs._check_names("w", ["a-b", "a.b", "a/c", "ab/c"])
    calls = {"n": 0}

    def profile(frame, event, arg):
        if event == "c_call":
            calls["n"] += 1

    names = [("a/" * 500) + f"{i:x}" for i in range(200)]
    sys.setprofile(profile)
    try:
        packs._check_names("w", names)
    finally:
        sys.setprofile(None)
    assert calls["n"] <= 10 * len(names), calls  # a few calls a name, not one per part


def _swap_after(module, name: str, path: str, other: str, monkeypatch) -> None:
    """`module.name` (a check) runs, then the file at `path` is replaced by `other`, as a writer racing the load
    would: what is loaded must still be what was checked."""
    real = getattr(module, name)

    def checked_then_swapped(*args, **kwargs):
        out = real(*args, **kwargs)
        if os.path.exists(other):
            os.replace(other, path)
        return out

    monkeypatch.setattr(module, name, checked_then_swapped)


def test_a_torch_file_replaced_after_its_checks_is_not_the_one_loaded(tmp_path, monkeypatch):
    path, other = str(tmp_path / "model.pt"), str(tmp_path / "other.pt")
    torch.save({"w": torch.arange(4.0)}, path)
    torch.save({"unchecked": torch.zeros(3)}, other)
    _swap_after(torch_format, "prescan", path, other, monkeypatch)
    assert list(torch_format.load_file(path).model) == ["w"]


def test_a_safetensors_file_replaced_after_its_header_check_is_not_the_one_loaded(tmp_path, monkeypatch):
    from safetensors.torch import save_file

    from ckptbench.checkpoint.formats import safetensors_format

    path, other = str(tmp_path / "model.safetensors"), str(tmp_path / "other.safetensors")
    save_file({"w": torch.arange(4.0)}, path)
    save_file({"unchecked": torch.zeros(3)}, other)
    _swap_after(safetensors_format, "tensor_entries", path, other, monkeypatch)
    assert list(safetensors_format.load_file(path).model) == ["w"]


def test_a_fifo_shard_is_refused_without_blocking(tmp_path):
    from ckptbench.checkpoint.formats import safetensors_format

    for load, name in ((torch_format.load_file, "model.pt"), (safetensors_format.load_file, "model.safetensors")):
        path = str(tmp_path / name)
        os.mkfifo(path)
        with pytest.raises(FormatError, match="not a regular file"):
            load(path)
