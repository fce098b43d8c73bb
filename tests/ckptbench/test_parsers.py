"""Parsers are total: a crafted safetensors header, torch shard, DCP .metadata or manifest gives one line that
names the file and says what is wrong, through `run --mode fused`, `load` and `verify`; never a traceback.

Every case below is a checkpoint whose manifest agrees with the crafted bytes (or is itself the crafted part),
so the parser under test is what meets them, not the digest check."""

from __future__ import annotations

import io
import json
import os
import pickle
import struct
import zipfile
from dataclasses import fields

import pytest
import torch

from ckptbench.checkpoint import manifest as mf
from ckptbench.core.errors import CkptbenchError
from ckptbench.checkpoint.formats import FormatError

MODEL = "model-00001-of-00002.safetensors"


def _one_line(r, *needles) -> None:
    """Refused: non-zero exit, exactly one "ckptbench: error:" line holding every needle, no traceback."""
    assert r.rc != 0, (r.rc, r.out, r.err)
    assert "Traceback" not in r.err, r.err
    assert len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith("ckptbench: error:"), r.err
    for n in needles:
        assert n in r.err_lines[0], (n, r.err)


def _fused(h, root, results) -> object:
    return h.run_cli("run", root, "--mode", "fused", "--repeat", "1", "--results", results)


# ---- safetensors: crafted headers -----------------------------------------------------------------------------


def _rewrite_header(path: str, edit) -> None:
    """The shard with its header replaced by edit(header) and the data section kept byte for byte."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    new = json.dumps(edit(header)).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(new)) + new + data[8 + n:])


def _tensors(header: dict) -> list[str]:
    """Tensor names in data order."""
    return sorted((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"])


def _set(field: str, value):
    def edit(header):
        header[_tensors(header)[0]][field] = value
        return header
    return edit


def _overlap(header):
    """The second tensor made to share the first one's bytes (same dtype and shape, so the sizes agree)."""
    a, b = _tensors(header)[:2]
    header[b] = dict(header[a])
    return header


def _shift_last(delta: int):
    def edit(header):
        last = _tensors(header)[-1]
        start, end = header[last]["data_offsets"]
        header[last]["data_offsets"] = [start + delta, end + delta]
        return header
    return edit


def _first_size(header):
    first = _tensors(header)[0]
    start, end = header[first]["data_offsets"]
    header[first]["data_offsets"] = [start, end - 1]
    return header


@pytest.mark.parametrize("edit, needle", [
    (_set("shape", [-4]), "shape"),
    (_set("shape", ["4"]), "shape"),
    (_set("shape", [2.5]), "shape"),
    (lambda header: [header], "JSON list"),
    (_set("dtype", "Q9"), "dtype"),
    (_set("data_offsets", [0, 4, 8]), "data_offsets"),
    (_set("data_offsets", ["0", "4"]), "data_offsets"),
    (lambda header: _set("data_offsets", header[_tensors(header)[0]]["data_offsets"][::-1])(header), "backwards"),
    (_shift_last(1 << 20), "expected"),
    (_first_size, "needs"),
    (_overlap, "overlaps"),
    (_shift_last(8), "gap"),
    (_set("dtype", 5), "dtype"),
], ids=["negative-shape", "string-shape", "float-shape", "header-is-a-list", "unknown-dtype", "three-offsets",
        "string-offsets", "reversed-offsets", "outside-the-buffer", "size-not-shape-times-dtype", "overlapping",
        "gap", "dtype-not-a-string"])
def test_crafted_safetensors_header_is_one_line_naming_the_shard(h, ckpt, tmp_path, edit, needle):
    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    _rewrite_header(os.path.join(root, MODEL), edit)
    h.refresh_manifest_entry(root, MODEL)
    before = h.snapshot(root)
    _one_line(_fused(h, root, tmp_path / "results.csv"), MODEL, needle)
    _one_line(h.run_cli("load", root), MODEL, needle)
    assert h.snapshot(root) == before


def test_safetensors_buffer_errors_name_the_file():
    from ckptbench.checkpoint.formats.safetensors_format import load_buffer, parse_header

    with pytest.raises(FormatError, match="^shard.safetensors: "):
        parse_header(b"\x01", "shard.safetensors")
    with pytest.raises(FormatError, match="^shard.safetensors: .*not an object"):
        load_buffer(struct.pack("<Q", 2) + b"[]", "shard.safetensors")


def test_fused_safetensors_matches_what_safetensors_accepts():
    """Overlap, gap and trailing bytes are refused by safetensors itself; a zero-size tensor and any order of
    entries are not. The fused loader agrees on every one."""
    from safetensors.torch import load as st_load

    from ckptbench.checkpoint.formats.safetensors_format import load_buffer

    def shard(entries: dict, data_len: int) -> bytes:
        head = json.dumps(entries).encode()
        return struct.pack("<Q", len(head)) + head + bytes(range(data_len))

    u8 = lambda a, b: {"dtype": "U8", "shape": [b - a], "data_offsets": [a, b]}  # noqa: E731
    cases = {
        "contiguous": ({"b": u8(4, 8), "a": u8(0, 4)}, 8, True),
        "empty-tensor-between": ({"a": u8(0, 4), "z": u8(4, 4), "b": u8(4, 8)}, 8, True),
        "overlap": ({"a": u8(0, 6), "b": u8(4, 8)}, 8, False),
        "same-bytes": ({"a": u8(0, 4), "b": u8(0, 4)}, 4, False),
        "gap": ({"a": u8(0, 2), "b": u8(4, 8)}, 8, False),
        "trailing-bytes": ({"a": u8(0, 4)}, 8, False),
        "past-the-end": ({"a": u8(0, 16)}, 8, False),
    }
    for name, (entries, data_len, ok) in cases.items():
        buf = shard(entries, data_len)
        try:
            st_load(buf)
            theirs = True
        except Exception:  # noqa: BLE001  (the reference's own refusal, whatever its type)
            theirs = False
        assert theirs == ok, name
        if ok:
            state = load_buffer(bytearray(buf), "x.safetensors")
            assert {k: v.tolist() for k, v in state.model.items()} == {k: v.tolist() for k, v in st_load(buf).items()}
        else:
            with pytest.raises(FormatError, match="^x.safetensors: "):
                load_buffer(bytearray(buf), "x.safetensors")


# ---- torch ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("content", [b".", b"\x80", b""], ids=["stop-opcode", "proto-opcode", "empty"])
def test_one_byte_torch_bin_is_one_line(h, tmp_path, content):
    root = tmp_path / "ck"
    root.mkdir()
    (root / "pytorch_model.bin").write_bytes(content)
    _one_line(_fused(h, root, tmp_path / "results.csv"), "pytorch_model.bin", "not a torch.save file")
    _one_line(h.run_cli("load", root), "pytorch_model.bin", "not a torch.save file")
    assert os.listdir(root) == ["pytorch_model.bin"]


def _zip_with(members: dict[str, tuple[bytes, int]]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, (data, how) in members.items():
            z.writestr(name, data, compress_type=how)
    return out.getvalue()


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_torch_zip_members_are_validated(tmp_path):
    """Compressed members cannot be loaded in place, a member named twice is ambiguous, and a storage larger than
    its member (a pickle that lies about numel) would alias the bytes after it: all refused, on both paths."""
    from ckptbench.checkpoint.formats.torch_format import load_buffer, load_file

    good = _saved({"w": torch.arange(100, dtype=torch.float32).view(10, 10)})
    src = zipfile.ZipFile(io.BytesIO(good))
    names = [i.filename for i in src.infolist()]
    pkl = next(n for n in names if n.endswith("data.pkl"))
    raw = src.read(pkl)
    assert raw.count(b"Kd") == 1  # the storage's numel, 100, as BININT1 in its persistent id
    stored, deflated = zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED
    crafted = {
        "deflated": (_zip_with({n: (src.read(n), deflated if "/data/" in n else stored) for n in names}), "compressed"),
        "lying": (_zip_with({n: (raw.replace(b"Kd", b"K\xc8") if n == pkl else src.read(n), stored) for n in names}),
                  "claims 800 bytes, its zip member holds 400"),
    }
    with pytest.warns(UserWarning, match="Duplicate name"):
        twice = io.BytesIO()
        with zipfile.ZipFile(twice, "w") as z:
            for n in names + [pkl]:
                z.writestr(n, src.read(n))
    crafted["twice"] = (twice.getvalue(), "appears twice")
    for name, (data, needle) in crafted.items():
        for buf in (bytearray(data), data):
            with pytest.raises(FormatError, match=f"^{name}.pt: .*{needle}"):
                load_buffer(buf, f"{name}.pt")
        path = tmp_path / f"{name}.pt"
        path.write_bytes(data)
        if name != "lying":  # the mmap path slices the file, bounded by it, and is not checked per storage
            with pytest.raises(FormatError, match=needle):
                load_file(str(path))
    assert load_buffer(bytearray(good), "good.pt").model["w"].flatten().tolist() == list(range(100))


def test_torch_optimizer_shard_with_mistyped_fields_is_one_line(tmp_path):
    from ckptbench.checkpoint.formats.torch_format import load_buffer

    w = torch.ones(2)
    for obj in ({"state": {"w": {"master": w}}, "step": [1]}, {"state": {"w": {"master": w}}, "hparams": 3},
                {"state": {"w": {"master": "x"}}}, {"state": {5: {"master": w}}}):
        with pytest.raises(FormatError, match="^o.pt: "):
            load_buffer(bytearray(_saved(obj)), "o.pt")


# ---- manifest -----------------------------------------------------------------------------------------------------


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("edit, needle", [
    (lambda d: d.update(dims=json.loads(_nested(200))), "dims"),
    ("deep", "nested too deeply"),
    (lambda d: d.update(hash="sha1"), "hash"),
    (lambda d: d["dims"].update(layers=-2), "dims.layers"),
    (lambda d: d["dims"].update(hidden="64"), "dims.hidden"),
    (lambda d: d["dims"].update(vocab=2 ** 70), "dims.vocab"),
    (lambda d: d["dims"].update(layers=10 ** 9), "dims.layers"),
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.update(version=True), "version"),
    (lambda d: d["files"][0].update(bytes="12"), "files[0].bytes"),
    (lambda d: d["files"][0].update(path=7), "files[0].path"),
    (lambda d: d["files"][0].update(digest="XYZ"), "files[0].digest"),
    (lambda d: d["files"][1].update(kind="weights"), "files[1].kind"),
    (lambda d: d["files"][1].update(rank="0"), "files[1].rank"),
    (lambda d: d.update(files={"a": 1}), "files"),
    (lambda d: d.update(packs={"p.ckpack": {"config.json": "0:10"}}), "record"),
    (lambda d: d.update(packs={"p.ckpack": {"config.json": [0, -1]}}), "not whole numbers"),
    (lambda d: d.update(param_count=1.5), "param_count"),
    (lambda d: d.update(extra=1), "unknown field"),
    (lambda d: d.pop("world_size"), "world_size"),
], ids=["nested-dims", "nested-document", "bad-hash", "negative-dims", "string-dims", "huge-dims",
        "a-billion-layers", "version-2", "version-true", "string-bytes", "int-path", "digest-not-hex", "unknown-kind",
        "string-rank", "files-not-a-list", "pack-record-a-string", "pack-size-negative", "float-param-count",
        "unknown-field", "missing-field"])
def test_crafted_manifest_is_one_line_naming_it(h, ckpt, tmp_path, edit, needle):
    root = h.copy_ckpt(ckpt("torch", 1), tmp_path / "ck")
    if edit == "deep":
        with open(os.path.join(root, h.MANIFEST), "w") as f:
            f.write('{"format": ' + _nested(100_000) + "}")
    else:
        doc = h.read_manifest(root)
        edit(doc)
        h.write_manifest(root, doc)
    before = h.snapshot(root)
    for args in (["verify", root], ["load", root], ["run", root, "--mode", "fused", "--repeat", "1", "--results",
                                                    tmp_path / "results.csv"]):
        _one_line(h.run_cli(*args), h.MANIFEST, needle)
    assert h.snapshot(root) == before


def test_manifest_larger_than_the_limit_is_refused_before_it_is_read(h, ckpt, tmp_path, monkeypatch):
    root = h.copy_ckpt(ckpt("torch", 1), tmp_path / "ck")
    monkeypatch.setattr(mf, "MAX_BYTES", 1024)
    assert os.path.getsize(os.path.join(root, h.MANIFEST)) > 1024
    _one_line(h.run_cli("verify", root), h.MANIFEST, "limit")
    with pytest.raises(CkptbenchError, match="over the 1024-byte limit"):
        mf.parse(b" " * 2048, "x")


def test_manifest_a_fifo_is_refused_without_hanging(h, ckpt, tmp_path):
    root = h.copy_ckpt(ckpt("torch", 1), tmp_path / "ck")
    os.unlink(os.path.join(root, h.MANIFEST))
    os.mkfifo(os.path.join(root, h.MANIFEST))
    _one_line(h.run_proc("verify", root, timeout=60), h.MANIFEST, "not a regular file")


def test_manifest_schema_covers_every_field():
    """The checks name every Manifest field and every model dimension: a new field cannot skip the schema."""
    from ckptbench.checkpoint.profiles import ModelDims

    assert set(mf._REQUIRED + mf._OPTIONAL) == {f.name for f in fields(mf.Manifest)}
    assert set(mf.DIM_LIMITS) == {f.name for f in fields(ModelDims)}
    import fastio

    assert set(mf.DIGEST_HEX) == set(fastio.HASHES)


def test_generated_manifests_still_parse(h, ckpt):
    """The control: what gen writes (every format, both digests) passes the schema, and round-trips."""
    for fmt, digest in [(f, "crc32c") for f in h.FORMATS] + [("torch", "md5")]:
        root = ckpt(fmt, 2, digest=digest)
        man = mf.parse(open(os.path.join(root, h.MANIFEST), "rb").read(), "m")
        assert man.hash == digest and man.files and man.dims
        assert mf.parse(json.dumps(man.to_json()).encode(), "again") == man


# ---- DCP metadata -------------------------------------------------------------------------------------------------


def _edit_metadata(root: str, edit) -> None:
    """The .metadata unpickled (our own file, trusted here), changed, and pickled back."""
    path = os.path.join(root, ".metadata")
    with open(path, "rb") as f:
        meta = pickle.load(f)
    edit(meta)
    with open(path, "wb") as f:
        pickle.dump(meta, f)


def _every_storage(attr: str, value):
    def edit(meta):
        for info in meta.storage_data.values():
            setattr(info, attr, value)
    return edit


def _first_storage(attr: str, value):
    def edit(meta):
        setattr(next(iter(meta.storage_data.values())), attr, value)
    return edit


def _first_tensor(attr: str, value):
    def edit(meta):
        fqn = next(k for k in meta.state_dict_metadata if k.startswith("model."))
        setattr(meta.state_dict_metadata[fqn], attr, value)
    return edit


@pytest.mark.parametrize("edit, needle", [
    (_every_storage("relative_path", "../outside/__0_0.distcp"), "outside the checkpoint"),
    ("absolute", "outside the checkpoint"),
    (_first_storage("offset", -5), "offset -5"),
    (_first_storage("length", "9"), "length '9'"),
    (_first_storage("offset", 10 ** 12), "past the"),
    (_every_storage("relative_path", "missing.distcp"), "missing.distcp"),
    (_every_storage("relative_path", 7), "has path 7,"),
    (lambda m: setattr(m, "state_dict_metadata", [1]), "state_dict_metadata"),
    (lambda m: setattr(m, "storage_data", None), "storage_data"),
    (lambda m: setattr(m, "storage_meta", 5), "storage_meta"),
    (_first_tensor("size", torch.Size([1 << 40])), "chunk"),
    (_first_tensor("size", (-3, 4)), "size"),
    (_first_tensor("chunks", []), "covering 0"),
    (lambda m: m.state_dict_metadata.update({"model.x": 5}), "model.x"),
], ids=["dotdot-path", "absolute-path", "negative-offset", "string-length", "offset-past-the-file", "missing-shard",
        "path-not-a-string", "entries-not-a-dict", "no-storage-index", "storage-meta-an-int", "huge-tensor",
        "negative-size", "no-chunks", "entry-not-metadata"])
def test_crafted_dcp_metadata_is_one_line(h, ckpt, tmp_path, edit, needle):
    root = h.copy_ckpt(ckpt("dcp", 1), tmp_path / "ck")
    outside = tmp_path / "outside"
    outside.mkdir()
    for n in os.listdir(root):
        if n.endswith(".distcp"):  # a lure: the same shards, outside the checkpoint
            (outside / n).write_bytes(open(os.path.join(root, n), "rb").read())
    if edit == "absolute":
        edit = _every_storage("relative_path", str(outside / "__0_0.distcp"))
    _edit_metadata(root, edit)
    h.refresh_manifest_entry(root, ".metadata")
    before = h.snapshot(root)
    _one_line(_fused(h, root, tmp_path / "results.csv"), ".metadata", needle)
    _one_line(h.run_cli("load", root), ".metadata", needle)
    assert h.snapshot(root) == before


def test_dcp_loader_never_opens_a_shard_outside_the_directory(h, ckpt, tmp_path, monkeypatch):
    """Beyond the error line: no file outside the checkpoint is opened at all (watched at os.open and open)."""
    import builtins

    root = h.copy_ckpt(ckpt("dcp", 1), tmp_path / "ck")
    _edit_metadata(root, _every_storage("relative_path", "../lure.distcp"))
    (tmp_path / "lure.distcp").write_bytes(open(os.path.join(root, "__0_0.distcp"), "rb").read())
    opened = []
    real_open, real_os_open = builtins.open, os.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: (opened.append(str(p)), real_open(p, *a, **k))[1])
    monkeypatch.setattr(os, "open", lambda p, *a, **k: (opened.append(str(p)), real_os_open(p, *a, **k))[1])
    from ckptbench.checkpoint.formats.dcp_format import load_dir

    with pytest.raises(CkptbenchError, match="outside"):
        load_dir(root)
    assert not [p for p in opened if "lure" in p]
