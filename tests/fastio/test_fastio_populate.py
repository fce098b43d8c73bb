"""fastio.populate: the floor's fresh-memory figure, populated on native threads started before the clock."""

from __future__ import annotations

import mmap

import psutil
import pytest

import fastio


def _region(size: int) -> mmap.mmap:
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_NOHUGEPAGE)
    return region


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_every_page_of_every_part_is_populated_and_timed(threads):
    size = 64 << 20
    region = _region(size)
    try:
        before = psutil.Process().memory_info().rss
        seconds, how = fastio.populate(region, threads)
        grown = psutil.Process().memory_info().rss - before
        assert how in ("MADV_POPULATE_WRITE", "a write per page")
        assert seconds > 0
        # each thread's whole pages: all but under a page a thread is resident now
        assert grown >= size - threads * mmap.PAGESIZE - (4 << 20), grown
        assert region[:16] == bytes(16) and region[-16:] == bytes(16)  # populated, not written over
    finally:
        region.close()  # no export is left behind: a held view would refuse this


def test_a_slice_populates_only_its_pages():
    region = _region(32 << 20)
    try:
        with memoryview(region) as whole, whole[8 << 20:16 << 20] as view:
            before = psutil.Process().memory_info().rss
            fastio.populate(view, 2)
            grown = psutil.Process().memory_info().rss - before
        assert (8 << 20) - (1 << 20) <= grown <= (8 << 20) + (2 << 20), grown
    finally:
        region.close()


def test_what_it_cannot_populate_is_one_clear_error():
    with pytest.raises(fastio.OptionError, match="writable"):
        fastio.populate(bytes(1 << 20), 1)
    region = _region(1 << 20)
    try:
        with pytest.raises(fastio.OptionError, match="threads"):
            fastio.populate(region, 0)
        with pytest.raises(fastio.FastIOError, match="a page a thread"):
            fastio.populate(region, 1024)  # 256 pages over 1024 threads: no whole page each
        with memoryview(region) as whole, whole[100:] as view, pytest.raises(fastio.FastIOError):
            fastio.populate(view, 1)  # not page-aligned
    finally:
        region.close()


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_copy_moves_every_part(threads):
    import os

    src = bytearray(os.urandom((3 << 20) + 5))
    dst = bytearray(len(src) + 7)
    seconds, n = fastio.copy(dst, src, threads)
    assert n == len(src) // threads * threads and seconds > 0
    assert dst[:n] == src[:n] and dst[n:] == bytes(len(dst) - n)  # nothing past what it says it copied


def test_copy_refuses_what_it_cannot_copy_into():
    with pytest.raises(fastio.OptionError, match="writable"):
        fastio.copy(bytes(10), bytearray(10), 1)
    with pytest.raises(fastio.OptionError, match="holds 4 bytes"):
        fastio.copy(bytearray(4), bytes(8), 1)
    with pytest.raises(fastio.FastIOError, match="a byte a thread"):
        fastio.copy(bytearray(8), bytes(2), 4)


@pytest.mark.parametrize("threads", [2**31, 2**40, -2**63 - 1, 10**100, 1.0, "2", None, True])
def test_threads_out_of_a_c_int_is_the_same_clear_error(threads):
    """A thread count past a C int raised OverflowError (a float TypeError) from the call itself, outside the
    package's errors; each is now OptionError, before any buffer is taken, for populate and copy alike."""
    region = _region(1 << 20)
    try:
        with pytest.raises(fastio.OptionError, match="threads must be 1..1024"):
            fastio.populate(region, threads)
        with pytest.raises(fastio.OptionError, match="threads must be 1..1024"):
            fastio.copy(bytearray(64), b"x" * 64, threads)
    finally:
        region.close()
    assert fastio.copy(bytearray(64), b"x" * 64, 2)[1] == 64
