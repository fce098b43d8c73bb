"""FileSpec.offset: a spec names the bytes [offset, offset+size) of its file, as a distributed rank reads its rows.

Every digest is checked against hashlib / the crc32c and xxhash packages on the same Python slice.
"""

from __future__ import annotations

import errno

import pytest

import fastio
from fastio import FileSpec

BLOCK = 4096
CHUNK = 16384
SIZE = 10 * CHUNK + 1234  # several chunks, and an end that is not 4096-aligned
TAIL = SIZE - SIZE % 4096  # the last 4096-aligned offset of the file

# (offset, size): unaligned starts and ends, a start mid-page, ranges over several chunks, the file's end, empty
RANGES = [(0, 100), (1, 4095), (4095, 2), (5000, 3 * CHUNK + 17), (SIZE - 777, 777), (SIZE, 0), (123, 0)]
# O_DIRECT needs aligned starts; the ends stay unaligned
ALIGNED = [(0, 100), (4096, 4095), (8192, 3 * CHUNK + 17), (TAIL, SIZE - TAIL), (4096, 0), (0, SIZE - 1)]


def _ranges(mode):
    return ALIGNED if mode == "direct" else RANGES


@pytest.mark.parametrize("into_memory", (False, True))
@pytest.mark.parametrize("alg", ("none", "crc32c", "xxh64", "sha256"))
@pytest.mark.parametrize("mode", ("pread", "mmap", "direct"))
def test_ranges_of_one_file_read_in_one_run(files, ref, mode, alg, into_memory):
    p = files.make(SIZE)
    data = files.data[p]
    ranges = _ranges(mode)
    specs = [FileSpec(p, size, off) for off, size in ranges]
    res = fastio.read_files(specs, concurrency=3, read=mode, hash=alg, block_size=BLOCK, chunk_size=CHUNK,
                            into_memory=into_memory)
    assert len(res.files) == len(ranges)
    for (off, size), f in zip(ranges, res.files):
        want = data[off:off + size]
        assert f.error is None, (off, size, f.error)
        assert f.path == p and f.bytes == size, (off, size)
        assert f.digest == ref(alg, want), (off, size)
    assert res.bytes == sum(size for _, size in ranges)
    if into_memory:
        assert [bytes(b) for b in res.buffers] == [data[off:off + size] for off, size in ranges]
    else:
        assert res.buffers == ()


@pytest.mark.parametrize("mode", ("pread", "mmap", "direct"))
def test_a_range_split_into_chunks_lands_in_its_own_buffer(files, ref_digest_raw, mode):
    """Units stay relative to the range: each chunk's digest is of the range's slice, not of the file's."""
    p = files.make(SIZE)
    off, size = (8192, 5 * CHUNK + 300) if mode == "direct" else (777, 5 * CHUNK + 300)
    want = files.data[p][off:off + size]
    res = fastio.read_files([FileSpec(p, size, off)], concurrency=4, read=mode, hash="sha256", block_size=BLOCK,
                            chunk_size=CHUNK, multipart=True, into_memory=True)
    [f] = res.files
    assert f.error is None, f.error
    assert bytes(res.buffers[0]) == want
    parts = [want[i:i + CHUNK] for i in range(0, size, CHUNK)]
    assert len(parts) == 6
    assert list(f.part_digests) == [ref_digest_raw("sha256", x).hex() for x in parts]


@pytest.mark.parametrize("mode", ("pread", "mmap", "direct"))
def test_ranges_and_whole_file_specs_of_one_path_keep_their_order(files, ref, mode):
    p, q = files.make(SIZE), files.make(70_001)
    first = (4096, 4096) if mode == "direct" else (10, 5000)
    specs = [FileSpec(q), FileSpec(p, first[1], first[0]), FileSpec(p), FileSpec(p, 100, 0)]
    res = fastio.read_files(specs, concurrency=3, read=mode, hash="crc32c", block_size=BLOCK, chunk_size=CHUNK,
                            into_memory=True)
    d = files.data[p]
    wants = [files.data[q], d[first[0]:first[0] + first[1]], d, d[:100]]
    assert [f.path for f in res.files] == [q, p, p, p]
    assert [f.digest for f in res.files] == [ref("crc32c", w) for w in wants]
    assert [bytes(b) for b in res.buffers] == wants


@pytest.mark.parametrize("mode", ("pread", "mmap", "direct"))
def test_a_range_from_zero_may_be_shorter_than_the_file_a_whole_file_spec_may_not(files, mode):
    p = files.make(SIZE)
    res = fastio.read_files([FileSpec(p, SIZE - 1, 0), FileSpec(p, SIZE - 1)], read=mode, hash="md5",
                            block_size=BLOCK, chunk_size=CHUNK, into_memory=True)
    ranged, whole = res.files
    assert ranged.error is None and bytes(res.buffers[0]) == files.data[p][:SIZE - 1]
    assert whole.error is not None and whole.error.errno == errno.ENODATA
    assert f"file is {SIZE} bytes, expected {SIZE - 1}" in whole.error.message


@pytest.mark.parametrize("mode", ("pread", "mmap", "direct"))
def test_a_range_past_the_end_fails_alone(files, ref, mode):
    p = files.make(SIZE)
    specs = [FileSpec(p, 8192, TAIL), FileSpec(p, SIZE - TAIL, TAIL), FileSpec(p, 0, TAIL + 8192)]
    res = fastio.read_files(specs, concurrency=2, read=mode, hash="crc32c", block_size=BLOCK, chunk_size=CHUNK,
                            into_memory=True)
    over, ok, beyond = res.files
    assert over.error is not None and over.error.errno == errno.ENODATA
    assert over.error.message == (f"file is {SIZE} bytes, shorter than the range {TAIL}+8192 "
                                  f"(changed since it was listed)")
    assert beyond.error is not None and beyond.error.errno == errno.ENODATA
    assert over.digest is None and res.buffers[0] is None
    assert ok.error is None and ok.digest == ref("crc32c", files.data[p][TAIL:])
    assert bytes(res.buffers[1]) == files.data[p][TAIL:]
    assert res.final.files_failed == 2 and res.final.files_done == 1


@pytest.mark.parametrize("mode", ("pread", "mmap", "direct"))
def test_fault_positions_are_file_offsets_not_range_offsets(files, mode):
    """fault_after=12000 lies inside the second range's file bytes but past the end of both ranges counted from
    their own start: only the range that covers file byte 12000 fails."""
    p = files.make(SIZE)
    res = fastio.read_files([FileSpec(p, 8192, 0), FileSpec(p, 8192, 8192)], concurrency=1, read=mode,
                            hash="crc32c", block_size=BLOCK, chunk_size=CHUNK,
                            _faults={p: (errno.EIO, 12000, 1)})
    before, covering = res.files
    assert before.error is None
    assert covering.error is not None and covering.error.errno == errno.EIO


def test_buffers_of_ranges_are_handed_out_as_they_complete(files):
    p = files.make(SIZE)
    h = fastio.start([FileSpec(p, 3 * CHUNK, 100), FileSpec(p, 50, SIZE - 50)], concurrency=2, hash="none",
                     block_size=BLOCK, chunk_size=CHUNK, into_memory=True)
    h.wait()
    assert h.completed() == [0, 1]
    assert bytes(h.buffer(0)) == files.data[p][100:100 + 3 * CHUNK]
    assert bytes(h.buffer(1)) == files.data[p][-50:]


@pytest.mark.parametrize("spec, words", [
    (lambda p: FileSpec(p, None, 10), "needs a size"),
    (lambda p: FileSpec(p, 10, -1), "offset -1"),
    (lambda p: FileSpec(p, -10, 0), "size -10"),
    (lambda p: FileSpec(p, 1 << 62, 1 << 62), "largest file offset"),
])
def test_bad_ranges_are_refused_before_the_run(files, spec, words):
    p = files.make(100)
    with pytest.raises(fastio.OptionError) as ei:
        fastio.start([FileSpec(p), spec(p)])
    msg = ei.value.strerror
    assert ei.value.errno == errno.EINVAL
    assert words in msg and p in msg and "\n" not in msg


def test_direct_refuses_an_unaligned_range_start_that_pread_reads(files, ref):
    p = files.make(SIZE)
    spec = FileSpec(p, 4096, 512)
    with pytest.raises(fastio.OptionError) as ei:
        fastio.start([spec], read="direct")
    assert ei.value.strerror == (f"{p}: range offset 512 is not a multiple of 4096: direct reads need 4096-aligned "
                             f"range offsets; use read='pread'")
    res = fastio.read_files([spec], read="pread")
    assert res.files[0].digest == ref("crc32c", files.data[p][512:512 + 4096])
