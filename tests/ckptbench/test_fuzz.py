"""Seeded fuzzing of the parsers a crafted checkpoint reaches first: safetensors headers (fused), torch.save bytes,
and the manifest. Every mutated input either parses into something consistent or is refused with one
CkptbenchError line naming it; no other exception, and nothing written anywhere.

The seed is fixed, so a failure names a case that replays exactly."""

from __future__ import annotations

import collections
import copy
import io
import json
import os
import random
import struct
import warnings

import pytest
import torch

from ckptbench.checkpoint import manifest as mf
from ckptbench.core.errors import CkptbenchError

SEED = 0x5AFE7E45
ODD = [-1, 0, 1, 7, 2 ** 63, 2 ** 64, -2 ** 70, 1.5, float("nan"), "4", "", None, True, False, [], {}, [1, 2], [[1]],
       {"a": 1}, "F32", "Q9", [0, 0], [2, 1], [0, 2 ** 63], "../x", "/etc/passwd", "a\nb", "x" * 300]


def _refused(exc: CkptbenchError, name: str) -> None:
    text = str(exc)
    assert "\n" not in text and "\r" not in text, text
    assert text.startswith(name), text


def _tree(*roots) -> dict:
    """Every path under the roots with its size and mtime: what "nothing was written" compares."""
    out = {}
    for root in roots:
        for dirpath, dirs, names in os.walk(root):
            for n in dirs + names:
                full = os.path.join(dirpath, n)
                st = os.lstat(full)
                out[full] = (st.st_size, st.st_mtime_ns)
    return out


# ---- safetensors headers ----------------------------------------------------------------------------------------


def _split(buf: bytes) -> tuple:
    (n,) = struct.unpack("<Q", buf[:8])
    return json.loads(buf[8:8 + n]), buf[8 + n:]


def _join(header, data: bytes, raw: bytes | None = None) -> bytes:
    text = raw if raw is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _mutate_safetensors(rng: random.Random, buf: bytes) -> bytes:
    """One structured (header field) or byte-level change of a shard; byte-level once the header is no longer
    an object of tensors (an earlier change broke it)."""
    try:
        header, data = _split(buf)
        names = [k for k in header if k != "__metadata__" and isinstance(header[k], dict)]
    except (ValueError, TypeError, struct.error):
        names = []
    if not names:
        out = bytearray(buf)
        if out:
            out[rng.randrange(len(out))] = rng.randrange(256)
        return bytes(out)
    key = rng.choice(names)
    entry = header[key]
    op = rng.randrange(16)
    if op == 14:  # harmless to safetensors: another order of entries, an extra field in one
        header = dict(rng.sample(list(header.items()), len(header)))
    elif op == 15:
        entry[rng.choice(["note", "offsets", "DTYPE"])] = rng.choice(ODD)
    elif op == 0:
        entry["shape"] = [rng.choice(ODD) for _ in range(rng.randint(0, 3))]
    elif op == 1:
        entry["dtype"] = rng.choice(["F32", "BF16", "I64", "U8", "BOOL", "F8_E4M3", "F4", "Q9", "f32", 5, None])
    elif op == 2:
        entry["data_offsets"] = rng.choice(ODD)
    elif op == 3:
        start, end = entry["data_offsets"]
        d = rng.choice([-8, -4, -1, 1, 4, 8, 1 << 20])
        entry["data_offsets"] = rng.choice([[start + d, end + d], [start, end + d], [start + d, end], [end, start]])
    elif op == 4:
        header[key] = rng.choice(ODD)
    elif op == 5:
        del entry[rng.choice(list(entry))]
    elif op == 6:
        header = rng.choice([[header], 5, "x", None])
    elif op == 7:
        header["__metadata__"] = rng.choice(ODD + [
            {"ckptbench_optimizer": rng.choice(["{}", "[]", "5", '{"step": "x"}', '{"step": -1}', '{"hparams": 3}',
                                                "{", '{"step": 1e400}', "[" * 5000])},
            {"step": "3"}, {"step": "x"}])
    elif op == 8:
        other = header[rng.choice(names)]
        other.update(copy.deepcopy({k: entry[k] for k in ("dtype", "shape", "data_offsets") if k in entry}))
    elif op == 9:
        data = data[:rng.randrange(len(data) + 1)]
    elif op == 10:
        data += bytes(rng.randint(1, 16))
    elif op == 11:
        del header[key]
    elif op == 12:
        raw = bytearray(json.dumps(header).encode())
        raw[rng.randrange(len(raw))] = rng.randrange(256)
        return _join(None, data, bytes(raw))
    else:
        length = struct.unpack("<Q", buf[:8])[0]
        return struct.pack("<Q", rng.choice([0, 1, 7, len(buf), 2 ** 63, 2 ** 64 - 1, length - 1, length + 1])) + buf[8:]
    return _join(header, data)


def _consistent(state, buf: bytearray) -> None:
    """Every tensor lies inside the data section of the buffer, no two share a byte, and safetensors itself
    reads the same bytes back."""
    from safetensors.torch import load as st_load

    base = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
    (n,) = struct.unpack("<Q", bytes(buf[:8]))
    spans = []
    for t in state.model.values():
        nbytes = t.numel() * t.element_size()
        if nbytes:
            start = t.data_ptr() - base
            assert 8 + n <= start and start + nbytes <= len(buf)
            spans.append((start, start + nbytes))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    reference = st_load(bytes(buf))  # ours accepted it: the reference must too, with the same tensors
    assert set(reference) == set(state.model)
    for k, t in reference.items():
        assert torch.equal(state.model[k].view(-1).view(torch.uint8), t.view(-1).view(torch.uint8)), k


def test_fuzzed_safetensors_headers_parse_or_are_one_line(ckpt, tmp_path):
    from ckptbench.checkpoint.formats.safetensors_format import load_buffer

    root = ckpt("safetensors", 2)
    shards = [open(os.path.join(root, n), "rb").read() for n in sorted(os.listdir(root)) if n.endswith(".safetensors")]
    before = _tree(root, tmp_path)
    rng = random.Random(SEED)
    outcomes = {"parsed": 0, "refused": 0}
    for case in range(300):
        buf = rng.choice(shards)
        for _ in range(rng.randint(1, 3)):
            buf = _mutate_safetensors(rng, buf)
        name = f"case{case}.safetensors"  # not "optimizer-…": every tensor lands in state.model, where it is checked
        target = bytearray(buf)
        try:
            state = load_buffer(target, name)
        except CkptbenchError as exc:
            _refused(exc, name)
            outcomes["refused"] += 1
            continue
        _consistent(state, target)
        outcomes["parsed"] += 1
    assert outcomes["parsed"] and outcomes["refused"] > 200, outcomes  # the mutations reach both outcomes
    assert _tree(root, tmp_path) == before


# ---- torch.save bytes -------------------------------------------------------------------------------------------


def test_fuzzed_torch_shards_parse_or_are_one_line(tmp_path):
    from ckptbench.checkpoint.formats.torch_format import load_buffer, load_file

    saved = []
    for kw in ({}, {"_use_new_zipfile_serialization": False}):
        buf = io.BytesIO()
        torch.save({"state": {"w": {"master": torch.arange(16.0), "exp_avg": torch.ones(4)}}, "step": 3,
                    "hparams": {"lr": 0.1}}, buf, **kw)
        saved.append(buf.getvalue())
    rng = random.Random(SEED)
    path = tmp_path / "case.pt"
    before = set(os.listdir(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns on read-only buffers and legacy files
        for case in range(150):
            buf = bytearray(rng.choice(saved))
            for _ in range(rng.randint(1, 3)):
                i = rng.randrange(len(buf))
                op = rng.random()
                if op < 0.6:
                    buf[i] = rng.randrange(256)
                elif op < 0.8:
                    del buf[i:i + rng.randint(1, 64)]
                else:
                    buf[i:i] = rng.randbytes(rng.randint(1, 8))
            path.write_bytes(buf)
            for load, arg in ((load_buffer, bytearray(buf)), (load_buffer, bytes(buf)), (load_file, str(path))):
                name = f"case{case}.pt"
                try:
                    state = load(arg, name) if load is load_buffer else load(arg)
                except CkptbenchError as exc:
                    _refused(exc, name if load is load_buffer else str(path))
                    continue
                assert all(isinstance(t, torch.Tensor) for parts in state.optim.values() for t in parts.values())
    assert set(os.listdir(tmp_path)) == before | {"case.pt"}  # only the test's own file


# ---- manifests ----------------------------------------------------------------------------------------------------


def _nodes(value, path=()):
    yield path, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nodes(v, path + (i,))


def _replace(doc, path, value):
    if not path:
        return value
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value
    return doc


def _mutate_manifest(rng: random.Random, doc):
    path, value = rng.choice(list(_nodes(doc)))
    op = rng.randrange(6)
    if op == 0:
        return _replace(doc, path, copy.deepcopy(rng.choice(ODD)))
    if op == 1 and path:
        parent = doc
        for p in path[:-1]:
            parent = parent[p]
        del parent[path[-1]]
        return doc
    if op == 2 and isinstance(value, dict):
        value[rng.choice(["zz", "path", "rank", "step", "packs"])] = copy.deepcopy(rng.choice(ODD))
        return doc
    if op == 3:
        return _replace(doc, path, [value] if rng.random() < 0.5 else {"k": value})
    if op == 4 and isinstance(value, int) and not isinstance(value, bool):
        return _replace(doc, path, value + rng.choice([-1, 1, -10 ** 6, 2 ** 63]))
    return doc


def _manifest_bytes(rng: random.Random, doc) -> bytes:
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        doc = _mutate_manifest(rng, doc)
    raw = json.dumps(doc).encode()
    r = rng.random()
    if r < 0.15:
        b = bytearray(raw)
        b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
    if r < 0.2:
        depth = rng.choice([50, 5000, 100_000])
        return b'{"files": ' + b"[" * depth + b"]" * depth + b"}"
    if r < 0.25:
        return raw[:rng.randrange(len(raw))]
    return raw


def _well_typed(man: mf.Manifest) -> None:
    whole = lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0  # noqa: E731
    assert man.hash in mf.DIGEST_HEX and man.version == mf.VERSION
    assert whole(man.param_count) and whole(man.world_size) and whole(man.step)
    for e in man.files:
        assert isinstance(e.path, str) and whole(e.bytes) and e.kind in mf.KINDS
        assert e.rank is None or whole(e.rank)
        assert (e.digest in (None, "") if man.hash == "none" else len(e.digest) == mf.DIGEST_HEX[man.hash])
    for index in man.packs.values():
        for rec in index.values():
            assert whole(rec[0]) and whole(rec[1])
    assert not man.dims or all(1 <= man.dims[k] <= high for k, high in mf.DIM_LIMITS.items())
    assert mf.parse(json.dumps(man.to_json()).encode(), "again") == man


def _real_manifest(h, ckpt) -> dict:
    doc = h.read_manifest(ckpt("torch", 2))
    doc["packs"] = {"pack-00001-of-00001.ckpack": {"config.json": [0, 10, "small", None], "b.json": [10, 5]}}
    return doc


def test_fuzzed_manifests_parse_or_are_one_line(h, ckpt, tmp_path):
    doc = _real_manifest(h, ckpt)
    rng = random.Random(SEED)
    outcomes = {"parsed": 0, "refused": 0}
    before = _tree(tmp_path)
    for case in range(300):
        where = f"case{case}/ckptbench.json"
        try:
            man = mf.parse(_manifest_bytes(rng, doc), where)
        except CkptbenchError as exc:
            _refused(exc, where)
            outcomes["refused"] += 1
            continue
        _well_typed(man)
        outcomes["parsed"] += 1
    assert outcomes["parsed"] > 20 and outcomes["refused"] > 100, outcomes
    assert _tree(tmp_path) == before


# ---- a handful through the CLI --------------------------------------------------------------------------------------


def _pick(rng, make, accept, n: int) -> list:
    """The first n seeded candidates `accept` takes (deterministic: same seed, same cases)."""
    out = []
    while len(out) < n:
        candidate = make(rng)
        if accept(candidate):
            out.append(candidate)
    return out


def _cli_refuses(h, root, needle: str, args: list) -> None:
    r = h.run_cli(*args)
    assert r.rc != 0 and "Traceback" not in r.err, r.err
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("ckptbench: error:"), r.err
    assert needle in r.err_lines[0], r.err


@pytest.mark.parametrize("kind", ["safetensors", "manifest"])
def test_fuzzed_cases_through_the_cli_are_one_line_and_write_nothing(h, ckpt, tmp_path, kind):
    from ckptbench.checkpoint.formats.safetensors_format import load_buffer

    src = ckpt("safetensors", 2)
    rel = "model-00001-of-00002.safetensors"
    rng = random.Random(SEED + 1)
    if kind == "safetensors":
        shard = open(os.path.join(src, rel), "rb").read()

        def refused(buf):
            try:
                load_buffer(bytearray(buf), rel)
            except CkptbenchError:
                return True
            return False

        cases = _pick(rng, lambda r: _mutate_safetensors(r, shard), refused, 3)
    else:
        doc = h.read_manifest(src)

        def refused(raw):
            try:
                mf.parse(raw, "m")
            except CkptbenchError:
                return True
            return False

        cases = _pick(rng, lambda r: _manifest_bytes(r, doc), refused, 3)
    results = tmp_path / "results.csv"
    for i, case in enumerate(cases):
        root = h.copy_ckpt(src, tmp_path / f"ck{i}")
        if kind == "safetensors":
            with open(os.path.join(root, rel), "wb") as f:
                f.write(case)
            h.refresh_manifest_entry(root, rel)  # the manifest agrees: the parser, not the digest, meets the bytes
        else:
            with open(os.path.join(root, h.MANIFEST), "wb") as f:
                f.write(case)
        needle = rel if kind == "safetensors" else h.MANIFEST
        before = _tree(root)
        for args in (["run", root, "--mode", "fused", "--repeat", "1", "--results", results], ["load", root]):
            _cli_refuses(h, root, needle, args)
        if kind == "manifest":
            _cli_refuses(h, root, needle, ["verify", root])
        assert _tree(root) == before


# ---- budgets: pickles, DCP metadata and manifests, each case bounded in time and memory --------------------------

CASE_SECONDS, CASE_MIB = 2.0, 256  # per case, for inputs under 64 KiB (issue #25: work bounded by the input's size)


def _budgeted(call, label: str):
    """call() within the per-case budget: wall time, and growth of this process's peak RSS."""
    import resource
    import time

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.monotonic()
    try:
        return call()
    finally:
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
        assert time.monotonic() - t <= CASE_SECONDS and grew <= CASE_MIB, (label, time.monotonic() - t, grew)


# opcodes a crafted pickle reaches for: calls of allow-listed allocators, shared references, large numbers
_GLOBALS = [b"c__builtin__\nbytearray\n", b"ctorch\nFloatTensor\n", b"ctorch\nFloatStorage\n", b"ctorch\nSize\n",
            b"ctorch._utils\n_rebuild_meta_tensor_no_storage\n", b"ctorch._utils\n_rebuild_tensor_v2\n",
            b"ccollections\nOrderedDict\n", b"cbuiltins\neval\n", b"ctorch\n_dynamo\n", b"cfunctools\npartial\n"]
_NUMBERS = [b"K\x00", b"K\x10", b"J\xff\xff\xff\x7f", b"\x8a\x05\x00\x00\x00\x00\x01", b"\x8a\x08" + b"\xff" * 8]


def _mutate_pickle(rng: random.Random, pkl: bytes) -> bytes:
    out = bytearray(pkl)
    for _ in range(rng.randint(1, 4)):
        op, i = rng.randrange(5), rng.randrange(len(out))
        if op == 0:  # a global replaced by another (both end in a newline)
            start = out.find(b"c", i)
            end = out.find(b"\n", out.find(b"\n", start + 1) + 1) if start >= 0 else -1
            if end > 0:
                out[start:end + 1] = rng.choice(_GLOBALS)
        elif op == 1:  # a small int replaced by a large one
            j = out.find(b"K", i)
            if j >= 0:
                out[j:j + 2] = rng.choice(_NUMBERS)
        elif op == 2:  # a memo reference repeated (a shared graph)
            j = out.find(b"h", i)
            if j >= 0:
                out[j:j] = out[j:j + 2] * rng.randint(1, 8)
        elif op == 3:
            out[i] = rng.randrange(256)
        else:
            del out[i:i + rng.randint(1, 8)]
    return bytes(out)


class _Reduces:
    def __init__(self, *reduced):
        self.reduced = reduced

    def __reduce__(self):
        return self.reduced


def _crafted_value(rng: random.Random):
    """One value of the kinds a crafted pickle uses to make a few KiB cost gigabytes or a traceback."""
    big = rng.choice([0, 3, 1 << 20, 1 << 28, 1 << 31])
    kind = rng.randrange(7)
    if kind == 0:
        shared = [1]
        for _ in range(rng.choice([2, 10, 22])):
            shared = [shared, shared]
        return shared
    if kind == 1:
        return _Reduces(bytearray, (big,))
    if kind == 2:
        return _Reduces(rng.choice([torch.FloatTensor, torch.FloatStorage, torch.Tensor]), (big,))
    if kind == 3:
        return torch.zeros(1).expand(max(big, 1))
    if kind == 4:
        return torch.empty(4, device="meta")
    if kind == 5:
        return _Reduces(collections.OrderedDict, (), {"items": 5, "get": 1, "values": 2})
    return {"step": big, "lr": [0.1, 0.2]}


def test_fuzzed_pickles_stay_within_budget():
    import zipfile

    from ckptbench.checkpoint.formats.torch_format import load_buffer

    rng = random.Random(SEED + 2)
    outcomes = {"parsed": 0, "refused": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for case in range(80):
            buf = io.BytesIO()
            torch.save({"w": torch.arange(16.0), **{f"x{i}": _crafted_value(rng) for i in range(rng.randint(1, 2))}},
                       buf)
            members = [(i.filename, zipfile.ZipFile(buf).read(i.filename)) for i in zipfile.ZipFile(buf).infolist()]
            out = io.BytesIO()
            with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
                for n, data in members:
                    mutate = n.endswith("data.pkl") and rng.random() < 0.5
                    z.writestr(n, _mutate_pickle(rng, data) if mutate else data)
            raw = out.getvalue()
            assert len(raw) < 64 << 10
            name = f"case{case}.pt"
            try:
                _budgeted(lambda: load_buffer(bytearray(raw), name).model["w"].clone(), name)
                outcomes["parsed"] += 1
            except CkptbenchError as exc:
                _refused(exc, name)
                outcomes["refused"] += 1
    assert outcomes["parsed"] and outcomes["refused"] > 20, outcomes


def _mutate_metadata(rng: random.Random, meta) -> None:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata

    fqns = list(meta.state_dict_metadata)
    fqn = rng.choice(fqns)
    md = meta.state_dict_metadata[fqn]
    op = rng.randrange(5)
    if op == 0:
        index, depth = rng.choice([0, 5, 2 ** 20 - 1]), rng.randint(1, 40)  # list indices at every level
        meta.planner_data = {f: (f,) + (index,) * depth for f in fqns}
    elif op == 1 and isinstance(md, TensorStorageMetadata) and md.chunks:
        c = rng.choice(md.chunks)
        md.chunks.append(ChunkStorageMetadata(offsets=c.offsets, sizes=torch.Size(
            [rng.choice([0, 1, d, 2 ** 40]) for d in c.sizes])))
    elif op == 2:
        key = rng.choice(list(meta.storage_data))
        info = meta.storage_data[key]
        info.offset, info.length = rng.choice([(0, 2 ** 62), (2 ** 40, 1), (info.offset, info.length + 1)])
    elif op == 3 and isinstance(md, TensorStorageMetadata):
        md.size = torch.Size([rng.choice([1, 2 ** 20, 2 ** 31]) for _ in md.size])
    else:
        meta.state_dict_metadata[rng.choice(ODD[:5] + ["x"])] = rng.choice([md, 5, None])


def test_fuzzed_dcp_metadata_stays_within_budget(tmp_path):
    import pickle

    import torch.distributed.checkpoint as dcp

    from ckptbench.checkpoint.formats.dcp_format import load_dir

    root = tmp_path / "dcp"  # a foreign layout, so the nesting is rebuilt from planner_data
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": {"w": torch.arange(12.0).reshape(3, 4), "b": torch.ones(4)},
                  "optim": {"groups": [{"lr": 0.1}, {"lr": 0.2}]}, "step": torch.tensor(3)},
                 checkpoint_id=str(root), no_dist=True)
    raw = (root / ".metadata").read_bytes()
    rng = random.Random(SEED + 3)
    outcomes = {"parsed": 0, "refused": 0}
    for case in range(60):
        meta = pickle.loads(raw)
        for _ in range(rng.randint(1, 3)):
            _mutate_metadata(rng, meta)
        data = bytearray(pickle.dumps(meta))
        if rng.random() < 0.3:
            data[rng.randrange(len(data))] = rng.randrange(256)
        assert len(data) < 64 << 10
        (root / ".metadata").write_bytes(data)
        try:
            _budgeted(lambda: load_dir(str(root)), f"case{case}")
            outcomes["parsed"] += 1
        except CkptbenchError as exc:
            assert "\n" not in str(exc), str(exc)
            outcomes["refused"] += 1
    assert outcomes["refused"] > 20, outcomes


def test_fuzzed_manifests_stay_within_budget(h, ckpt):
    doc = _real_manifest(h, ckpt)
    rng = random.Random(SEED + 4)
    for case in range(200):
        raw = _manifest_bytes(rng, doc)
        if len(raw) >= 64 << 10:
            continue
        try:
            _budgeted(lambda: mf.parse(raw, "m"), f"case{case}")
        except CkptbenchError:
            pass
