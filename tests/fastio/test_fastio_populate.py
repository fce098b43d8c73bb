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
