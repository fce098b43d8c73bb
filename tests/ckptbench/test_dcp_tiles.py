"""A single-process DCP restore lands each stored chunk's elements by range in memory of their own, which becomes
the tensor (restore/tiles.py): the state equals torch's own load of the checkpoint, no tensor is a copy of a read
buffer, every byte of every file is still read and hashed (the tiles' CRCs combine into each file's, checked against
the manifest: a flipped byte between two chunks fails the restore), and what cannot be tiled keeps the whole-file
read. Checkpoints written by torch.distributed.checkpoint (one process, and two gloo ranks with sharded DTensors)
and by ckptbench gen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import crc32c
import fastio
import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckptbench.checkpoint.formats import dcp_format
from ckptbench.checkpoint.shares import tensors_of
from ckptbench.restore import tiles
from ckptbench.sources import open_source


def _save(state: dict, directory) -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(directory), no_dist=True)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """A model and optimizer state saved by dcp.save in one process: every tensor one chunk, at any offset."""
    d = tmp_path_factory.mktemp("single")
    g = torch.Generator().manual_seed(5)
    state = {"model": {"embed.weight": torch.randn(96, 40, generator=g), "norm.weight": torch.randn(40, generator=g),
                       "proj.weight": torch.randn(40, 40, generator=g).bfloat16(), "ids": torch.arange(7)},
             "optimizer": {"state": {"embed.weight": {"exp_avg": torch.randn(96, 40, generator=g),
                                                      "step": torch.tensor(3.0)}},
                           "param_groups": [{"lr": 1e-3, "params": ["embed.weight"]}]}}
    _save(state, d)
    return d


_GLOO_WRITER = textwrap.dedent("""
    import sys, torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def main(rank, world, out, port):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        mesh = init_device_mesh("cpu", (world,))
        g = torch.Generator().manual_seed(4)
        full = {"w": torch.randn(10, 6, generator=g), "v": torch.randn(4, 9, generator=g).bfloat16(),
                "r": torch.randn(5, generator=g)}
        sd = {"model": {"w": distribute_tensor(full["w"], mesh, [Shard(0)]),
                        "v": distribute_tensor(full["v"], mesh, [Shard(1)]),
                        "r": distribute_tensor(full["r"], mesh, [Replicate()])}}
        dcp.save(sd, checkpoint_id=out)
        dist.destroy_process_group()

    if __name__ == "__main__":
        import torch.multiprocessing as mp
        mp.spawn(main, args=(2, sys.argv[1], int(sys.argv[2])), nprocs=2)
""")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """Rows (Shard(0)) and columns (Shard(1)) over two gloo ranks, and a replicated tensor."""
    import socket

    root = tmp_path_factory.mktemp("sharded")
    script = root / "writer.py"
    script.write_text(_GLOO_WRITER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    d = root / "ckpt"
    proc = subprocess.run([sys.executable, str(script), str(d), str(port)], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return d


def _read_tiled(d):
    """The tiled read of `d` as the runner does it: plan, read every tile into memory with crc32c, fold."""
    listing = open_source(str(d)).list()
    tiling = tiles.plan(listing)
    assert tiling is not None
    res = fastio.read_files(tiling.listing.files, read="pread", hash="crc32c", into_memory=True)
    assert not res.failed, res.failed
    return listing, tiling, res


def _outline(tree):
    """The nesting with every tensor as its dtype and shape (tensors do not compare with ==)."""
    if isinstance(tree, torch.Tensor):
        return (str(tree.dtype), tuple(tree.shape))
    if isinstance(tree, dict):
        return {k: _outline(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_outline(v) for v in tree]
    return tree


def _flat(state) -> dict[str, torch.Tensor]:
    return {name: t for _, name, t in state.tensors()}


@pytest.mark.parametrize("which", ["single", "sharded"])
def test_the_tiled_state_is_torchs_and_its_tensors_are_the_read_buffers(which, request):
    d = request.getfixturevalue(which)
    listing, tiling, res = _read_tiled(d)
    bufs = tiles.piece_buffers(tiling, res)
    tensors, values, _ = tensors_of(tiling.share, bufs)
    folded = tiles.fold(tiling, listing, res)
    named = {os.path.basename(f.path): b for f, b in zip(folded.files, folded.buffers) if b is not None}
    state = dcp_format.from_pieces(str(d), tensors, values, named)
    reference = dcp_format.load_dir(str(d))  # the whole-file load, checked against torch's own in its tests
    got, want = _flat(state), _flat(reference)
    assert set(got) == set(want) and got
    for k, t in want.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k
    assert _outline(state.tree) == _outline(reference.tree) and set(state.extra) == set(reference.extra)
    # a tensor held whole by one chunk is the buffer its elements landed in: page-aligned, no second copy
    starts = {torch.frombuffer(b, dtype=torch.uint8).data_ptr() for b in bufs if len(b)}
    whole = [sl.key for sl in tiling.share.slices if len(sl.fills) == 1 and sl.full]
    assert whole
    for key in whole:
        assert tensors[key].data_ptr() in starts and tensors[key].data_ptr() % 4096 == 0, key
    if which == "sharded":  # rows and columns from two ranks' chunks, copied together once
        assert any(len(sl.fills) == 2 for sl in tiling.share.slices)


@pytest.mark.parametrize("which", ["single", "sharded"])
def test_every_byte_of_every_file_is_read_and_its_crc_is_the_files(which, request):
    d = request.getfixturevalue(which)
    listing, tiling, res = _read_tiled(d)
    folded = tiles.fold(tiling, listing, res)
    assert len(folded.files) == len(listing.files)
    assert sum(t.size for t in tiling.listing.files) == listing.bytes == folded.bytes
    for f in folded.files:
        data = Path(f.path).read_bytes()
        assert f.bytes == len(data) and f.digest == f"{crc32c.crc32c(data):08x}", f.path
    # the tiles of a file cover it once, in order
    for k, f in enumerate(listing.files):
        spans = [(t.offset or 0, t.size) for t, j in zip(tiling.listing.files, tiling.file_of) if j == k]
        at = 0
        for off, n in spans:
            assert off == at and n > 0
            at += n
        assert at == f.size, f.path


def _run(h, d, *extra) -> tuple[dict, str]:
    r = h.run_cli("run", d, "--repeat", "1", "--cache", "hot", "--json", *extra)
    return (json.loads(r.out) if r.out.strip() else {}), r.err


def test_a_restore_of_ckptbenchs_own_dcp_reads_by_range_and_verifies_every_file(h, tmp_path):
    d = tmp_path / "c"
    assert h.run_cli("gen", "small", d, "--format", "dcp", "--ranks", "2", "--scale", h.SCALE).rc == 0
    doc, err = _run(h, d)
    assert doc.get("status") == "ok" and doc["verified"], err
    read = doc["repeats"][0]["read"]
    assert read["mode"] == "pread" and "each DCP chunk's elements land in memory of their own" in read["why"], read
    load = doc["repeats"][0]["notes"]["load"]
    assert "read by range, each into memory of its own that is its tensor" in load, load
    assert doc["bytes"] == sum(p.stat().st_size for p in d.rglob("*") if p.is_file())
    cold, err = _run(h, d, "--cache", "cold")  # `auto` would read cold with O_DIRECT; ranges are read with pread
    assert cold.get("status") == "ok" and cold["repeats"][0]["read"]["mode"] == "pread", err

    # a byte flipped between two chunks (in an archive's header, not in any tensor's elements) fails the digest
    meta = dcp_format.SafeReader(str(d)).read_metadata()
    info = next(iter(meta.storage_data.values()))
    shard = d / str(info.relative_path)
    raw = bytearray(shard.read_bytes())
    raw[info.offset + 2] ^= 0x01  # inside the chunk's zip local header ("PK\x03\x04"): read, but no tensor's
    shard.write_bytes(bytes(raw))
    r = h.run_cli("run", d, "--repeat", "1", "--cache", "hot", "--results", tmp_path / "r.csv")
    assert r.rc != 0 and str(info.relative_path) in r.out + r.err and "Traceback" not in r.err, r.out + r.err


def test_what_cannot_be_tiled_keeps_the_whole_file_read(h, single):
    for extra, why in ((("--read", "mmap"), "a mode asked for by name"),
                       (("--hash", "md5"), "a digest that does not combine"),
                       (("--mode", "staged"), "a staged restore loads from the files")):
        doc, err = _run(h, single, *extra)
        assert doc.get("status") == "unverified", (why, err)
        assert "read by range" not in json.dumps(doc["repeats"][0]["notes"]), why


def test_overlapping_ranges_are_not_tiled(single, monkeypatch):
    from ckptbench.checkpoint import shares

    listing = open_source(str(single)).list()
    real = shares.plan_share

    def overlapping(*a, **kw):
        share = real(*a, **kw)
        p = next(i for i, x in enumerate(share.pieces) if not x.whole and x.offset > 0)
        share.pieces[p] = shares.Piece(share.pieces[p].rel, share.pieces[p].offset - 1, share.pieces[p].length + 1,
                                       False)
        share.pieces.append(shares.Piece(share.pieces[p].rel, share.pieces[p].offset, 1, False))
        return share

    monkeypatch.setattr(tiles, "plan_share", overlapping)
    assert tiles.plan(listing) is None
