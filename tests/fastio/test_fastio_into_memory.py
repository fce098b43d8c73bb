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

