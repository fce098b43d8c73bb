"""Hostile checkpoints, fifth round: what earlier rounds left open, each input made by the real library (safetensors,
torch.distributed.checkpoint, torch.save) and then crafted. Bad input is one line naming the file and a non-zero
exit, the same from inspect, run and load."""

from __future__ import annotations

import json
import os
import pickle
import struct
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file

from ckptbench.checkpoint.formats import FormatError, dcp_format, safetensors_format

HUGE = 1 << 62


def _add_safetensors_entry(path: str, name: str, entry: dict) -> None:
    """A shard safetensors wrote, with one more header entry (padded as safetensors pads)."""
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    header[name] = entry
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + raw[8 + n :])


def _dcp(directory, state: dict):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(directory), no_dist=True)
    with open(os.path.join(directory, ".metadata"), "rb") as f:
        return str(directory), pickle.load(f)


def _assert_one_line(h, directory: str, match: str) -> None:
    for cmd in ("inspect", "load", "run"):
        extra = ("--repeat", "1", "--results", "") if cmd == "run" else ()
        r = h.run_cli(cmd, directory, *extra)
        assert r.rc != 0 and "Traceback" not in r.err and len(r.err_lines) == 1, (cmd, r.err)
        assert match in r.err, (cmd, r.err)


@pytest.mark.parametrize("shape", [[HUGE, HUGE, 0], [0, HUGE, HUGE]])
def test_a_safetensors_empty_tensor_whose_dimensions_overflow_is_one_line(tmp_path, h, shape):
    """A zero-element tensor spans 0 bytes whatever its other dimensions say: [2**62, 2**62, 0] passed every check,
    inspect listed it, and `load` died in torch's view() with a RuntimeError traceback (safetensors refuses it)."""
    directory = tmp_path / "ck"
    directory.mkdir()
    shard = str(directory / "model.safetensors")
    save_file({"w": torch.randn(4, 4)}, shard, metadata={"format": "pt"})
    _add_safetensors_entry(shard, "z", {"dtype": "F32", "shape": shape, "data_offsets": [64, 64]})
    with pytest.raises(FormatError, match="tensor 'z' has shape .* more elements than a tensor can hold"):
        safetensors_format.header_entries(shard)
    _assert_one_line(h, str(directory), "more elements than a tensor can hold")


def test_a_dcp_empty_tensor_whose_dimensions_overflow_is_one_line(tmp_path, h):
    """The same in a DCP's metadata: an entry of size (2**62, 2**62, 0) covered by one empty chunk passed the checks;
    inspect listed it and run blamed the checkpoint's files ('check that its files are whole')."""
    import torch.distributed.checkpoint.metadata as md

    directory, meta = _dcp(tmp_path / "ck", {"w": torch.randn(4, 4), "e": torch.empty(0, 3)})
    size = torch.Size([HUGE, HUGE, 0])
    entry = meta.state_dict_metadata["e"]
    entry.size = size
    entry.chunks[0].offsets, entry.chunks[0].sizes = torch.Size([0, 0, 0]), size
    old = next(k for k in meta.storage_data if k.fqn == "e")
    meta.storage_data[md.MetadataIndex("e", torch.Size([0, 0, 0]))] = meta.storage_data.pop(old)
    with open(os.path.join(directory, ".metadata"), "wb") as f:
        pickle.dump(meta, f)
    with pytest.raises(FormatError, match="entry 'e' has size .* more elements than a tensor can hold"):
        dcp_format.load_dir(directory)
    _assert_one_line(h, directory, "more elements than a tensor can hold")


@pytest.mark.parametrize("which", ["results.csv", "results.csv.jsonl"])
def test_a_row_cut_short_by_a_full_disk_is_taken_back(ckpt, tmp_path, h, monkeypatch, which):
    """A row whose write the disk cut short (half written, then ENOSPC) stayed in results.csv: the run said 'env is
    not a JSON object' instead of 'no space', and every later run, history and compare refused the file ('repair or
    move the file'). What a failed write wrote is taken back; the rows before it stay."""
    import errno

    out = tmp_path / "out"
    out.mkdir()
    results = out / "results.csv"
    first = h.run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", results)
    assert first.rc == 0, first.err
    before = {p: p.read_bytes() for p in (results, out / "results.csv.jsonl")}
    write, cut = os.write, []

    def full(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}") == str(out / which):
            if not cut:
                cut.append(fd)
                return write(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(fd, data)

    monkeypatch.setattr(os, "write", full)
    r = h.run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", results)
    monkeypatch.setattr(os, "write", write)
    assert cut, "the write was never cut"
    assert r.rc == 1 and "Traceback" not in r.err and len(r.err_lines) == 1, r.err
    assert "free space" in r.err and str(out / which) in r.err, r.err
    assert (out / which).read_bytes() == before[out / which], "half a record was left"
    assert h.run_cli("history", results).rc == 0
    again = h.run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", results)
    assert again.rc == 0, again.err
