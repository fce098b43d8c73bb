"""Fresh memory as a read met it: the bytes a read into memory populated first, and its workers' CPU time in it —
counted where it was done, and nowhere else (a read into reused block buffers populates nothing)."""

from __future__ import annotations

import fastio

CHUNK = 1 << 20
PAGE = 4096


def _rounded(size: int, chunk: int) -> int:
    """The bytes the workers populate for a file: each chunk's length rounded up to whole pages."""
    full, tail = divmod(size, chunk)
    return full * chunk + (-(-tail // PAGE) * PAGE)


def test_a_pread_into_memory_counts_every_destination_byte_it_populated_and_its_cpu_time(files):
    sizes = [8 << 20, 3 * CHUNK + 5, 4097]
    paths = [files.make(s) for s in sizes]
    res = fastio.read_files(paths, concurrency=4, read="pread", hash="none", into_memory=True, chunk_size=CHUNK)
    assert not res.failed
    s = res.final
    assert s.populated_bytes == sum(_rounded(n, CHUNK) for n in sizes)
    assert s.populate_cpu_s > 0
    assert s.populate_gbps_per_core == s.populated_bytes / s.populate_cpu_s / 1e9
    assert all(bytes(b) == files.data[p] for p, b in zip(paths, res.buffers))  # populated, then read into


def test_a_mapping_read_into_memory_populates_too_and_a_read_into_reused_blocks_does_not(files):
    paths = [files.make(4 << 20) for _ in range(2)]
    s = fastio.read_files(paths, concurrency=2, hash="none", read="mmap", into_memory=True).final
    assert s.populated_bytes == 8 << 20 and s.populate_cpu_s > 0  # copied out of the mapping into fresh memory
    s = fastio.read_files(paths, concurrency=2, hash="none", read="pread").final  # each worker's one block buffer
    assert s.populated_bytes == 0 and s.populate_cpu_s == 0.0
    assert s.populate_gbps_per_core is None
