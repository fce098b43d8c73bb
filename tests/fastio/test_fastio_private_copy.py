"""into memory, the buffers are the process's own memory when the read ends: changing, truncating or removing the
file afterwards changes nothing in them. (A private copy-on-write mapping of the file lands hot bytes faster, but a
truncate takes its pages back and the next access to them is a SIGBUS: this test is why fastio does not use one.)"""

from __future__ import annotations

import os

import pytest

import fastio


@pytest.mark.parametrize("mode", ("pread", "mmap", "direct"))
def test_restored_bytes_outlive_a_rewrite_of_their_file(files, mode):
    size = 3 * (1 << 20) + 12345
    p = files.make(size)
    res = fastio.read_files([p], concurrency=2, read=mode, hash="crc32c", block_size=1 << 20, chunk_size=1 << 20,
                            into_memory=True)
    assert res.files[0].error is None and res.files[0].digest == files.expect(p, "crc32c")
    with open(p, "r+b") as f:  # what a trainer saving its next checkpoint over this one does: open(p, "wb")
        f.write(b"\xff" * 4096)
        f.truncate(0)
    os.unlink(p)
    assert bytes(res.buffers[0]) == files.data[p]
