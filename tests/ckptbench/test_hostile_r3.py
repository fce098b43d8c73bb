"""Hostile checkpoints, third round: the checkpoint parsers behind a restore (DCP's metadata and chunk archives on the
ranged read, written by torch.distributed.checkpoint and then crafted), and what a write does when the disk fills.
Bad input is one line and a non-zero exit; the work it causes grows with its bytes (counted, never timed)."""

from __future__ import annotations

import json
import os
import pickle
import sys

import pytest
import torch

from ckptbench.checkpoint import shares
from ckptbench.checkpoint.formats import FormatError, dcp_format
from ckptbench.sources import open_source


def _rewrite(directory: str, meta) -> None:
    with open(os.path.join(directory, ".metadata"), "wb") as f:
        pickle.dump(meta, f)


def _lines_in(path: str, call) -> int:
    """Lines of `path` run while `call()` runs (a generator's every step counts): what a loop there costs."""
    count = 0

    def trace(frame, event, arg):
        nonlocal count
        if frame.f_code.co_filename != path:
            return None
        if event == "line":
            count += 1
        return trace

    sys.settrace(trace)
    try:
        call()
    finally:
        sys.settrace(None)
    return count


def test_a_dcp_byte_entry_stored_in_no_shard_is_one_line(tmp_path, h):
    """The ranged (tiled) restore looked a byte entry's storage up with next(): a metadata declaring one that no
    shard stores was a StopIteration traceback from `run`; the whole-file load skipped it silently."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    directory, meta = h.dcp_saved(tmp_path / "ck", {"model": {"w": torch.arange(8.0)}, "note": "hello"})
    meta.state_dict_metadata["orphan"] = BytesStorageMetadata()
    _rewrite(directory, meta)
    with pytest.raises(FormatError, match=r"/\.metadata: byte entry 'orphan' is stored in no shard"):
        dcp_format.load_dir(directory)
    for mode in ("fused", "staged"):
        r = h.run_cli("run", directory, "--repeat", "1", "--results", "", "--mode", mode)
        assert r.rc != 0 and "Traceback" not in r.err, r.err
        assert "byte entry 'orphan' is stored in no shard" in r.err, r.err


def test_planning_a_ranged_dcp_restore_costs_one_lookup_per_byte_entry(tmp_path, h):
    """Each byte entry's storage was found by scanning every storage entry: N byte entries cost N² steps (30,000 of
    them, 2.6 MB of metadata, added 23 s to a run; a few MB more, hours). Counted in lines run, at 600 entries."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

    directory, meta = h.dcp_saved(tmp_path / "ck", {"model": {"w": torch.arange(8.0)}})
    n = 600
    for i in range(n):
        meta.state_dict_metadata[f"b{i}"] = BytesStorageMetadata()
        meta.storage_data[MetadataIndex(f"b{i}")] = _StorageInfo("__0_0.distcp", 0, 0)
    _rewrite(directory, meta)
    listing = open_source(directory).list()
    share = None

    def plan():
        nonlocal share
        share = shares.plan_share(listing, 1, 0)

    lines = _lines_in(shares.__file__, plan)
    assert len(share.byte_entries) == n
    assert lines < 40 * n, f"{lines} lines run in shares.py for {n} byte entries"


@pytest.mark.parametrize("name", [b".format_version", b"data.pkl"])
def test_a_dcp_chunk_archive_with_a_record_name_not_utf8_is_one_line(tmp_path, h, name):
    """The ranged restore reads each chunk's archive index with torch's zip reader, which hands record names (and
    its own errors quoting them) back through pybind11 as UTF-8: one byte flipped in a name was a UnicodeDecodeError
    traceback from `run` (a plan that refuses a chunk falls back to the whole-file load, which names it)."""
    directory, _ = h.dcp_saved(tmp_path / "ck", {"model": {"w": torch.arange(64.0), "v": torch.ones(3, 5)}})
    shard = os.path.join(directory, "__0_0.distcp")
    with open(shard, "rb") as f:
        data = f.read()
    assert data.count(name) >= 2  # every chunk's archive names it, in its local header and its directory
    with open(shard, "wb") as f:
        f.write(data.replace(name, name[:3] + b"\xff" + name[4:]))
    r = h.run_cli("run", directory, "--repeat", "1", "--results", "")
    assert r.rc != 0 and "Traceback" not in r.err, r.err
    assert len(r.err_lines) == 1 and "__0_0.distcp: entry 'model." in r.err, r.err  # the whole-file load's line
    with pytest.raises(FormatError, match="not a torch.save archive"):  # the plan refuses it, in one line too
        shares.plan_share(open_source(directory).list(), 1, 0)


@pytest.fixture
def swapped(tmp_path, monkeypatch):
    """A checkpoint whose one shard is swapped, after the listing and before the read, for a symlink to a secret of
    the same size outside it (a size an attacker can stat without reading it): the read used to follow it, and the
    header check then quoted the secret's first 8 bytes back as a header length."""
    from ckptbench.sources import local

    secret = tmp_path / "shadow"
    secret.write_bytes(b"root:$6$" + b"s3cr3t-hash-" * 8)
    ck = tmp_path / "ck"
    ck.mkdir()
    shard = ck / "model.safetensors"
    shard.write_bytes(b"\0" * secret.stat().st_size)
    start = local.LocalSource.start_read

    def swap_then_read(self, *args, **kwargs):
        if not shard.is_symlink():
            shard.unlink()
            shard.symlink_to(secret)
        return start(self, *args, **kwargs)

    monkeypatch.setattr(local.LocalSource, "start_read", swap_then_read)
    return ck


@pytest.mark.parametrize("args", [("run", "--repeat", "1", "--results", ""),
                                  ("run", "--repeat", "1", "--results", "", "--mode", "staged"), ("read",)])
def test_a_shard_swapped_for_a_symlink_after_the_listing_is_never_read(swapped, h, args):
    r = h.run_cli(args[0], swapped, *args[1:])
    assert r.rc != 0 and "Traceback" not in r.err, r.err
    assert "symbolic link" in r.out + r.err, r.out + r.err
    assert "header length" not in r.out + r.err  # the secret's bytes were never parsed


def test_the_loaders_never_follow_a_symlink_where_the_listing_had_a_file(tmp_path):
    from ckptbench.checkpoint.formats import safetensors_format, torch_format

    for name, load in (("model.safetensors", safetensors_format.header_entries), ("model.pt", torch_format.peek_file)):
        real = tmp_path / f"real-{name}"
        torch.save({"w": torch.ones(2)}, real) if name.endswith(".pt") else real.write_bytes(b"\0" * 16)
        link = tmp_path / name
        link.symlink_to(real)
        with pytest.raises(FormatError, match="is a symbolic link now, swapped in since the checkpoint was listed"):
            load(str(link))


def test_fastio_follows_a_symlink_only_when_asked_to(tmp_path):
    import fastio

    real = tmp_path / "real.bin"
    real.write_bytes(b"x" * 5000)
    link = tmp_path / "link.bin"
    link.symlink_to(real)
    followed = fastio.read_files([str(link)])
    assert followed.files[0].error is None and followed.files[0].bytes == 5000
    refused = fastio.read_files([str(link), str(real)], nofollow=True)
    assert refused.files[0].error is not None and refused.files[0].error.errno == 40  # ELOOP
    assert "symbolic link" in refused.files[0].error.message
    assert refused.files[1].error is None and refused.files[1].bytes == 5000


def test_read_of_a_file_the_user_names_through_a_symlink_still_reads_it(tmp_path, h):
    real = tmp_path / "real.bin"
    real.write_bytes(b"y" * 8192)
    link = tmp_path / "named.bin"
    link.symlink_to(real)
    r = h.run_cli("read", link, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert (doc["bytes"], doc["files_ok"], doc["files_failed"]) == (8192, 1, 0)


def test_a_full_disk_under_the_results_file_is_one_line_naming_it(ckpt, tmp_path, h, monkeypatch):
    """A run whose results file's filesystem was full ended in 'I/O: No space left on device; check the path and its
    permissions': no file named, and the wrong thing to check."""
    import errno

    write = os.write

    def full(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").startswith(str(tmp_path / "out")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(fd, data)

    (tmp_path / "out").mkdir()
    monkeypatch.setattr(os, "write", full)
    r = h.run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", tmp_path / "out" / "results.csv")
    assert r.rc == 1 and "Traceback" not in r.err, r.err
    assert len(r.err_lines) == 1, r.err
    line = r.err_lines[0]
    assert str(tmp_path / "out" / "results.csv") in line and "free space" in line, line
    assert "permissions" not in line, line


def test_a_full_disk_is_never_sent_to_check_permissions():
    from ckptbench.core.errors import translate

    for code in ("ENOSPC", "EDQUOT"):
        err = translate(OSError(getattr(__import__("errno"), code), "full", "/data/pack-00001.ckpack"))
        assert str(err).startswith("/data/pack-00001.ckpack: full") and "free space" in str(err), str(err)
        assert "permissions" not in str(err) and err.exit_code == 1
    assert "permissions" in str(translate(OSError(13, "Permission denied", "/x")))
