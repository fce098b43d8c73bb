"""Hostile variants of checkpoints the real libraries wrote (tests/compat/fixtures): what finds and restores the
checkpoint a resume loads must answer each in one line, without a traceback, without work beyond the checkpoint's
size, and without reading anything but the checkpoint's regular files. What test_hardening3_formats,
test_hostile_local, test_hostile_packs and test_hardening2_bounds cover is not repeated here."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import shutil
import struct
import time
import warnings

import pytest
import torch

from clirun import run_cli

FIXTURES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "compat", "fixtures")


def _fixture(name: str, tmp_path) -> str:
    """A copy of a checkpoint a library wrote, without the test's expected.json."""
    dst = str(tmp_path / name)
    shutil.copytree(os.path.join(FIXTURES, name), dst, symlinks=True)
    os.unlink(os.path.join(dst, "expected.json"))
    return dst


def _one_line(r, *needles) -> str:
    assert r.rc != 0 and r.out == "", (r.rc, r.out)
    assert "Traceback" not in r.err and len(r.err_lines) == 1, r.err
    line = r.err_lines[0]
    assert line.startswith("ckptbench: error: "), line
    for n in needles:
        assert n in line, line
    return line


# ---- the listing -------------------------------------------------------------------------------------------------


def test_a_tree_nested_deeper_than_the_recursion_limit_is_listed_not_a_traceback(tmp_path):
    """os.walk recurses (Python 3.11): a log folder 1500 levels deep (3 KB of path, under PATH_MAX) beside a
    save_pretrained checkpoint raised RecursionError from every command's listing."""
    from ckptbench.checkpoint import detect, tree

    root = _fixture("hf_safetensors", tmp_path)
    os.mkdir(os.path.join(root, "logs"))
    with _nested(os.path.join(root, "logs"), 1500):
        assert "logs/" + "a/" * 1500 + "notes.txt" in tree.rels(root)
        assert detect.detect(root) == "safetensors"
        r = run_cli("inspect", root, "--json")
        assert r.rc == 0 and "Traceback" not in r.err, r.err
        assert json.loads(r.out)["layout"]["name"] == "hf-safetensors"


@contextlib.contextmanager
def _nested(parent: str, depth: int):
    """`depth` folders `a`, one in the other, under `parent`, notes.txt at the bottom; removed on the way out, bottom
    up, since pytest's cleanup (shutil.rmtree) recurses and fails on such a tree."""
    fd = os.open(parent, os.O_RDONLY)
    made = 0
    try:
        for made in range(1, depth + 1):
            os.mkdir("a/" * made, dir_fd=fd)
        os.close(os.open("a/" * depth + "notes.txt", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink("a/" * depth + "notes.txt", dir_fd=fd)
        for level in range(made, 0, -1):
            with contextlib.suppress(FileNotFoundError):
                os.rmdir("a/" * level, dir_fd=fd)
        os.close(fd)


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_a_latest_that_is_no_regular_file_is_named_not_called_missing(tmp_path, kind):
    """DeepSpeed follows a symlinked `latest`; the listing never reads one (nor a FIFO), and the line said the
    save held no `latest` at all."""
    root = _fixture("deepspeed_zero2", tmp_path)
    latest = os.path.join(root, "latest")
    if kind == "symlink":
        os.rename(latest, os.path.join(root, "latest.real"))
        os.symlink("latest.real", latest)
    else:
        os.unlink(latest)
        os.mkfifo(latest)
    for args in (("inspect", root), ("run", root, "--repeat", "1", "--results", tmp_path / "R.csv")):
        _one_line(run_cli(*args), "2 DeepSpeed step directories", "`latest` is not a regular file")


def _saved_for_ranks(path: str, world: int) -> None:
    """DeepSpeed's model states file rewritten as saved by `world` data-parallel ranks (its dp_world_size), every
    other byte as DeepSpeed wrote it (the pickle's int is one byte either way)."""
    import re
    import zipfile

    with zipfile.ZipFile(path) as z:
        members = [(i, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for info, data in members:
            if info.filename.endswith("/data.pkl"):
                data, n = re.subn(rb"(dp_world_size[qr].{1,4}?K)\x01", lambda m: m.group(1) + bytes([world]), data,
                                  flags=re.S)
                assert n == 1
            z.writestr(info, data)


@pytest.mark.parametrize("damage", ["missing", "beyond"])
def test_a_deepspeed_step_short_of_a_partition_or_with_another_saves_is_one_line(tmp_path, damage):
    """A ZeRO step's optimizer partitions are DeepSpeed's ranks 0..dp_world_size-1: each rank's resume torch.loads
    its own, and zero_to_fp32 refuses another count. A step whose model states say 2 ranks with rank 1's partition
    gone, or one with a third partition copied in from another save, restored as whole (structural check passed)."""
    root = _fixture("deepspeed_zero2", tmp_path)
    step = os.path.join(root, "global_step2")
    if damage == "missing":
        _saved_for_ranks(os.path.join(step, "mp_rank_00_model_states.pt"), 2)
        needle = "for 2 data-parallel rank(s), but rank 1's is missing"
    else:
        shutil.copy(os.path.join(step, "zero_pp_rank_0_mp_rank_00_optim_states.pt"),
                    os.path.join(step, "zero_pp_rank_2_mp_rank_00_optim_states.pt"))
        needle = "for 1 data-parallel rank(s), but rank 2's is beyond them"
    for args in (("load", root), ("run", root, "--repeat", "1", "--results", tmp_path / "R.csv")):
        _one_line(run_cli(*args), "global_step2: DeepSpeed saved optim states of mp_rank_00", needle)


# ---- names a checkpoint's content gives --------------------------------------------------------------------------


def test_an_index_naming_a_lone_surrogate_is_one_line(tmp_path):
    """JSON's "\\ud800" escape is a string no file name can hold: os.fsencode raised UnicodeEncodeError (a traceback)
    when the shard name was confined."""
    from ckptbench.checkpoint import confine

    assert not confine.is_plain("\ud800.safetensors")
    assert confine.is_plain(os.fsdecode(b"\xff.safetensors"))  # a listing's undecodable bytes are a real name
    root = _fixture("hf_sharded", tmp_path)
    path = os.path.join(root, "model.safetensors.index.json")
    with open(path) as f:
        doc = json.load(f)
    doc["weight_map"]["lm_head.extra"] = "\ud800.safetensors"
    with open(path, "w") as f:
        json.dump(doc, f)  # ensure_ascii: the file holds the escape, as a crafted one would
    _one_line(run_cli("inspect", root), "'\\ud800.safetensors'", "not a plain relative path")
    _one_line(run_cli("run", root, "--repeat", "1", "--results", tmp_path / "R.csv"), "'\\ud800.safetensors'")


def test_a_safetensors_header_with_a_lone_surrogate_is_refused_as_safetensors_refuses_it(tmp_path):
    """A tensor named "\\ud800…" parsed, reached inspect's table, and killed the process printing it."""
    from safetensors.torch import load_file

    from ckptbench.checkpoint.formats import FormatError
    from ckptbench.checkpoint.formats.safetensors_format import header_entries, load_buffer

    root = tmp_path / "st"
    root.mkdir()
    header = json.dumps({"\ud800\x1b[2Jw": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    data = struct.pack("<Q", len(header)) + header + struct.pack("<2f", 1.0, 2.0)
    (root / "model.safetensors").write_bytes(data)
    with pytest.raises(Exception, match="surrogate"):  # the reference refuses it
        load_file(str(root / "model.safetensors"))
    for read in (lambda: header_entries(str(root / "model.safetensors")), lambda: load_buffer(bytearray(data), "m")):
        with pytest.raises(FormatError, match="lone surrogate"):
            read()
    _one_line(run_cli("inspect", root, "--tensors"), "model.safetensors", "lone surrogate")
    pair = json.dumps({"\U0001f600": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()  # \ud83d\ude00
    state = load_buffer(bytearray(struct.pack("<Q", len(pair)) + pair + struct.pack("<2f", 1.0, 2.0)), "m")
    assert list(state.model) == ["\U0001f600"]


# ---- torch.distributed.checkpoint --------------------------------------------------------------------------------


def _dcp(directory: str, state: dict) -> tuple[dict, object]:
    """A DCP checkpoint saved by torch, and its metadata read back with torch's own (trusting) unpickler to craft."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=directory, no_dist=True)
    with open(os.path.join(directory, ".metadata"), "rb") as f:
        return state, pickle.load(f)


def _write_meta(directory: str, meta) -> None:
    with open(os.path.join(directory, ".metadata"), "wb") as f:
        pickle.dump(meta, f)


def test_dcp_shards_named_through_symlinks_are_refused_not_counted_again(tmp_path):
    """A 1 MiB shard and 20 links to it inside the folder, each named by a storage entry at the same bytes: the
    per-file overlap check and the bytes-held bound counted each link as a new file, and the load allocated and
    filled 21 MiB (20,000 links to a 1 GiB shard: 20 TB) from files the listing says are never read."""
    import copy

    from torch.distributed.checkpoint.metadata import MetadataIndex

    from ckptbench.checkpoint.formats import dcp_format
    from ckptbench.core.errors import CkptbenchError

    d = str(tmp_path / "dcp")
    _, meta = _dcp(d, {"model": {"w": torch.ones(1 << 18)}})
    (key, info), = meta.storage_data.items()
    for i in range(20):
        os.symlink("__0_0.distcp", os.path.join(d, f"link{i}.distcp"))
        meta.state_dict_metadata[f"model.w{i}"] = copy.deepcopy(meta.state_dict_metadata["model.w"])
        linked = copy.deepcopy(info)
        linked.relative_path = f"link{i}.distcp"
        meta.storage_data[MetadataIndex(f"model.w{i}", key.offset)] = linked
    _write_meta(d, meta)
    with pytest.raises(CkptbenchError, match="'link0.distcp', which is a symbolic link"):
        dcp_format.load_dir(d)
    _one_line(run_cli("run", d, "--repeat", "1", "--results", tmp_path / "R.csv"), "link0.distcp", "symbolic link")
    _one_line(run_cli("inspect", d), "link0.distcp", "symbolic link")


def _byte_entry(directory: str, value) -> bytes:
    """A DCP checkpoint whose byte entry `blob` holds torch.save(value), as a crafted one would hold it."""
    _, meta = _dcp(directory, {"model": {"w": torch.ones(4)}, "blob": io.BytesIO(b"x")})
    payload = io.BytesIO()
    torch.save(value, payload)
    payload = payload.getvalue()
    shard = os.path.join(directory, "__0_0.distcp")
    with open(shard, "ab") as f:
        end = f.tell()
        f.write(payload)
    for k, info in meta.storage_data.items():
        if k.fqn == "blob":
            info.offset, info.length = end, len(payload)
    _write_meta(directory, meta)
    return payload


@pytest.mark.parametrize("value", [
    pytest.param(lambda: torch.ones(1).expand(1 << 31), id="stride-0-8GiB-claim"),
    pytest.param(lambda: torch.empty(4, device="meta"), id="meta"),
    pytest.param(lambda: torch.ones(4).to_sparse(), id="sparse"),
    pytest.param(lambda: {"rng": [torch.ones(1).expand(1 << 31)]}, id="nested"),
])
def test_a_dcp_byte_entry_holding_a_tensor_without_its_data_stays_bytes(tmp_path, value):
    """weights_only rebuilds a meta tensor, a sparse one, or a 4-byte storage viewed as 2**31 floats: as a byte
    entry's value it reached the structural check, which raised (a traceback after the load) or would copy the
    claim. Kept as the bytes it was saved as, as a byte entry whose pickle is refused is."""
    from ckptbench.checkpoint.formats import RawBytes, dcp_format

    d = str(tmp_path / "dcp")
    payload = _byte_entry(d, value())
    kept = dcp_format.load_byte_entry(payload)
    assert type(kept) is RawBytes and kept == payload
    assert type(dcp_format.load_dir(d).extra["blob"]) is RawBytes
    r = run_cli("run", d, "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0 and "Traceback" not in r.err, r.err
    assert dcp_format.load_byte_entry(_saved(torch.arange(3))).tolist() == [0, 1, 2]  # a real tensor stays one


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


# ---- config.json, the shape the check builds -------------------------------------------------------------------


PLAIN = {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 300, "n_positions": 64}


@pytest.fixture(scope="module")
def gpt_dir(tmp_path_factory):
    from ckptbench.checkpoint.model import GPT
    from ckptbench.checkpoint.profiles import ModelDims

    root = tmp_path_factory.mktemp("gpt")
    torch.manual_seed(0)
    torch.save(GPT(ModelDims(2, 64, 4, 300, 64)).state_dict(), str(root / "pytorch_model.bin"))
    (root / "config.json").write_text(json.dumps(PLAIN))
    return root


@pytest.mark.parametrize("edit, needle", [
    ({"n_head": 0}, "n_head (heads) is 0"),  # ZeroDivisionError
    ({"n_embd": [64]}, "n_embd (hidden) is [64]"),  # TypeError from nn.Embedding
    ({"n_head": 3}, "n_embd 64 is not a multiple of n_head 3"),  # RuntimeError in the forward step
    ({"n_layer": 5000}, "n_layer (layers) is 5000"),  # 20 s building 5000 blocks on meta; 10**8: never done
    ({"n_layer": True}, "n_layer (layers) is True"),
])
def test_a_config_json_shape_is_held_to_the_manifest_bounds_before_anything_is_built(gpt_dir, tmp_path, edit,
                                                                                        needle):
    root = tmp_path / "gpt"
    shutil.copytree(gpt_dir, root)
    (root / "config.json").write_text(json.dumps({**PLAIN, **edit}))
    t0 = time.monotonic()
    for args in (("load", root, "--json"), ("inspect", root)):
        _one_line(run_cli(*args), "config.json", needle)
    assert time.monotonic() - t0 < 10


def test_a_sound_config_json_still_builds_and_runs_the_step(gpt_dir):
    r = run_cli("load", gpt_dir, "--json")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["finite_output"] is True


def test_a_config_json_nested_beyond_recursion_or_naming_other_weights_is_structural(tmp_path):
    """config.json '[' 200000 deep raised RecursionError out of dims_of; a shape whose name count is not ckptbench's
    GPT's is told without building 4096 layers on meta (20 s) only to compare names."""
    import time

    from ckptbench.restore import load

    assert load.dims_of(None, {"config.json": b"[" * 200000 + b"]" * 200000}) is None
    cfg = b'{"n_layer": 4096, "n_embd": 4096, "n_head": 64, "vocab_size": 32000, "n_positions": 2048}'
    t = time.perf_counter()
    dims, why = load.model_dims(None, {"config.json": cfg}, ["transformer.wte.weight", "lm_head.weight"])
    assert dims is None and "(2 tensors, where its GPT of 4096 layers has 49157)" in why
    assert time.perf_counter() - t < 1.0  # bounded by the names, not by the shape it claims


def test_a_lone_surrogate_in_a_tensor_key_is_printed_escaped(tmp_path):
    import subprocess
    import sys

    import torch

    (tmp_path / "ck").mkdir()
    torch.save({"\ud800w": torch.ones(2)}, tmp_path / "ck" / "model.pt")
    r = subprocess.run([sys.executable, "-m", "ckptbench", "inspect", str(tmp_path / "ck"), "--tensors"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "\\ud800w" in r.stdout
