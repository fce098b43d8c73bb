"""into_memory=True: each file's bytes come back in ReadResult.buffers, in file order."""

from __future__ import annotations

import errno

import pytest

import fastio


@pytest.mark.parametrize("mode", ("pread", "mmap", "direct"))
@pytest.mark.parametrize("alg", ("none", "crc32c", "sha256"))
def test_buffers_hold_the_file_bytes(files, tmp_path, mode, alg):
    sizes = [0, 1, 4095, 4097, 16384, 5 * 16384 + 7, 300_001]
    paths = [files.make(s) for s in sizes]
    missing = str(tmp_path / "missing.bin")
    listing = [paths[0], missing, *paths[1:]]
    res = fastio.read_files(listing, concurrency=3, read=mode, hash=alg, block_size=4096,
                            chunk_size=16384, into_memory=True)
    assert len(res.buffers) == len(listing)
    assert res.buffers[1] is None and res.files[1].error.errno == errno.ENOENT
    for p, buf, f in zip(listing, res.buffers, res.files):
        if p == missing:
            continue
        assert f.error is None
        assert bytes(buf) == files.data[p], (p, len(files.data[p]))
        assert f.digest == files.expect(p, alg)



def test_completed_files_are_usable_before_the_read_ends(files, tmp_path):
    """A file whose bytes are all in memory is listed by completed() and readable through buffer() while a later
    file has not even been opened (held before its open); a failed file is never listed."""
    first, held = files.make(300_001), files.make(70_000)
    missing = str(tmp_path / "missing.bin")
    h = fastio.start([first, missing, held], concurrency=1, read="pread", hash="none", block_size=4096,
                     chunk_size=16384, into_memory=True, _faults={held: "hold"})
    try:
        deadline = __import__("time").monotonic() + 30
        while h.completed() != [0] and __import__("time").monotonic() < deadline:
            __import__("time").sleep(0.01)
        assert h.completed() == [0] and not h.done()
        early = h.buffer(0)
        assert early.readonly and bytes(early) == files.data[first]
        assert h.buffer(1) is None and h.buffer(2) is None and h.buffer(7) is None
        assert h.completed(1) == []
    finally:
        h._release()
    res = h.wait()
    assert h.completed() == [0, 2] and res.files[1].error.errno == errno.ENOENT
    assert bytes(h.buffer(2)) == files.data[held]


def test_a_read_without_memory_has_no_buffers_to_hand_out(files):
    p = files.make(5000)
    h = fastio.start([p], concurrency=1, read="pread", hash="none")
    h.wait()
    assert h.completed() == [0] and h.buffer(0) is None
