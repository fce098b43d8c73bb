"""The read engine's per-block finite scan (`start(..., scan=...)`): every region's count equals count_nonfinite's
over the same bytes, whatever the block and chunk sizes cut (units split by a block edge, by a chunk edge, regions
at odd offsets), with pread and O_DIRECT; hostile regions are one OptionError; a failed file has no counts."""

from __future__ import annotations

import os
import random

import pytest

import fastio
from fastio import OptionError

UNIT = {"bf16": 2, "f16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16, "f8_e4m3fn": 1, "f8_e5m2": 1}


def _regions(rng: random.Random, size: int) -> list[tuple[int, int, str]]:
    out, at = [], rng.randint(0, 7)  # odd starts: a safetensors header's length is any number of bytes
    while True:
        kind = rng.choice(sorted(UNIT))
        room = (size - at) // UNIT[kind]
        if room < 1:
            return out
        n = rng.randint(1, min(room, 300_000)) * UNIT[kind]
        out.append((at, n, kind))
        at += n + rng.randint(0, 5)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("read", ["pread", "direct"])
def test_counts_as_the_blocks_land_equal_a_scan_of_the_whole_buffer(tmp_path, seed, read):
    rng = random.Random(seed)
    size = rng.randint(2 << 20, 9 << 20) + rng.randint(0, 4095)
    data = os.urandom(size)  # random bits: about one bf16 in 256 is NaN or Inf, so every count is a real number
    path = tmp_path / "shard.safetensors"
    path.write_bytes(data)
    regions = _regions(rng, size)
    block = rng.choice([4096, 12288, 1 << 20])
    chunk = block * rng.choice([1, 3, 64])  # chunk edges cut units the blocks of neither side hold whole
    h = fastio.start([str(path)], concurrency=3, read=read, hash="none", into_memory=True, block_size=block,
                     chunk_size=chunk, scan={0: regions})
    res = h.wait()
    assert not res.failed
    want = fastio.count_nonfinite([(data[o:o + n], k) for o, n, k in regions], concurrency=1)
    assert h.scan_counts(0) == want and sum(want) > 0


def test_a_file_given_no_regions_and_a_failed_file_have_no_counts(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(os.urandom(1 << 20))
    b.write_bytes(os.urandom(1 << 20))
    h = fastio.start([str(a), str(b)], read="pread", hash="none", into_memory=True, block_size=4096,
                     scan={1: [(0, 1 << 20, "bf16")]}, _faults={str(b): (5, 8192, 1)})
    res = h.wait()
    assert len(res.failed) == 1 and h.scan_counts(0) is None and h.scan_counts(1) is None


@pytest.mark.parametrize("scan, why", [
    ({0: [(0, 10, "bf16"), (8, 2, "bf16")]}, "in order"),  # overlapping
    ({0: [(4, 2, "bf16"), (0, 2, "bf16")]}, "in order"),  # out of order
    ({0: [(0, 4098, "bf16")]}, "within the file"),  # past the end
    ({0: [(0, 3, "f32")]}, "whole f32"),  # not whole elements
    ({0: [(-2, 2, "bf16")]}, "in order"),
    ({0: [(0, 2, "int8")]}, "unknown kind"),
    ({1: [(0, 2, "bf16")]}, "not the index"),
])
def test_hostile_regions_are_one_clear_error_before_anything_is_read(tmp_path, scan, why):
    p = tmp_path / "f"
    p.write_bytes(b"\0" * 4096)
    with pytest.raises(OptionError, match=why):
        fastio.start([str(p)], read="pread", hash="none", into_memory=True, scan=scan)


def test_regions_need_a_read_into_memory_that_lands_blocks(tmp_path):
    p = tmp_path / "f"
    p.write_bytes(b"\0" * 4096)
    for kw in ({"read": "mmap", "into_memory": True}, {"read": "pread", "into_memory": False}):
        with pytest.raises(OptionError, match="into_memory"):
            fastio.start([str(p)], hash="none", scan={0: [(0, 2, "bf16")]}, **kw)
