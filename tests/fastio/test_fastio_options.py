"""Option checking: bad values raise OptionError before anything starts."""

from __future__ import annotations

import errno
import threading

import pytest

import fastio

BAD = [
    dict(concurrency=0),
    dict(concurrency=-3),
    dict(concurrency=fastio.MAX_CONCURRENCY + 1),
    dict(hash="crc64"),
    dict(hash="none2"),
    dict(hash=None),
    dict(read="aio"),
    dict(read="uring"),
    dict(block_size=8192, chunk_size=12288),  # chunk not a multiple of the block
    dict(block_size=65536, chunk_size=65536 + 4096),
    dict(block_size=1 << 20, chunk_size=512 << 10),  # chunk smaller than a block
    dict(block_size=1024),  # below 4 KiB
    dict(read="direct", block_size=6144, chunk_size=6144 * 4096),  # direct needs 4096-multiples
    dict(hash="none", multipart=True),
]


@pytest.mark.parametrize("opts", BAD, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_bad_options_raise_option_error(files, opts):
    p = files.make(1000)
    before = threading.active_count()
    with pytest.raises(fastio.OptionError) as ei:
        fastio.start([p], **opts)
    e = ei.value
    assert isinstance(e, fastio.FastIOError) and isinstance(e, OSError) and isinstance(e, ValueError)
    assert e.errno == errno.EINVAL
    assert threading.active_count() == before


def test_block_6000_is_fine_for_pread_when_chunk_is_aligned(files):
    """Control for the list above: a non-4096 block is allowed outside direct mode when the chunk
    is a multiple of both, and the digest is right."""
    p = files.make(100_000)
    res = fastio.read_files([p], block_size=6000, chunk_size=6000 * 4096, hash="md5")
    assert res.files[0].digest == files.expect(p, "md5")


def test_hasher_bad_alg():
    for alg in ("none", "crc64", "MD5x"):
        with pytest.raises(fastio.OptionError):
            fastio.Hasher(alg)


def test_option_error_is_catchable_as_value_error(files):
    p = files.make(10)
    with pytest.raises(ValueError):
        fastio.start([p], concurrency=0)
