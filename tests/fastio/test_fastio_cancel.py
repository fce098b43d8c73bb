"""cancel(): prompt, per-file ECANCELED for what was not read, and nothing left behind."""

from __future__ import annotations

import errno
import gc
import os

import psutil

import fastio


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _check_cancelled_result(files, res, paths, alg):
    assert res.cancelled and res.final.cancelled
    fin = res.final
    assert fin.finished
    assert fin.files_done + fin.files_failed == fin.files_total == len(paths)
    n_cancelled = 0
    for p, f in zip(paths, res.files):
        if f.error is None:
            assert f.digest == files.expect(p, alg), p  # what finished before the cancel is right
            assert f.bytes == len(files.data[p])
        else:
            assert f.error.errno == errno.ECANCELED, f.error
            assert f.digest is None
            n_cancelled += 1
    assert fin.files_failed == n_cancelled
    return n_cancelled


def test_cancel_mid_run(files):
    paths = [files.make(1 << 20) for _ in range(120)]
    fd0, th0 = _fds(), _threads()
    h = fastio.start(paths, concurrency=2, hash="md5", block_size=64 << 10)
    while True:
        s = h.snapshot()
        if s.files_done >= 2 or s.finished:
            break
    h.cancel()
    res = h.wait(timeout=5)  # "promptly": a cancelled run ends within a few block reads
    assert res is not None, "cancel did not end the run"
    n = _check_cancelled_result(files, res, paths, "md5")
    assert n >= 1, "nothing was left to cancel"
    assert res.final.files_done >= 2
    # files never opened read nothing and are ECANCELED
    unread = [f for f in res.files if f.bytes == 0]
    assert unread and all(f.error is not None and f.error.errno == errno.ECANCELED for f in unread)
    assert _fds() == fd0
    assert _threads() == th0


def test_cancel_split_file_mid_way(files):
    """A crc32c file split into many chunks, cancelled part-way: the file is ECANCELED."""
    big = files.make(32 << 20)
    h = fastio.start([big], concurrency=2, hash="crc32c", block_size=64 << 10, chunk_size=256 << 10,
                     read="mmap")
    while True:
        s = h.snapshot()
        if s.bytes > 0 or s.finished:
            break
    h.cancel()
    res = h.wait(timeout=5)
    assert res is not None
    f = res.files[0]
    if f.error is None:  # the whole file beat the cancel: then it must be right
        assert f.digest == files.expect(big, "crc32c")
    else:
        assert f.error.errno == errno.ECANCELED and f.digest is None
    assert res.cancelled


def test_context_manager_cancels_on_exit(files):
    paths = [files.make(1 << 20) for _ in range(60)]
    fd0, th0 = _fds(), _threads()
    with fastio.start(paths, concurrency=2, hash="sha256") as h:
        while h.snapshot().bytes == 0 and not h.done():
            pass
    # __exit__ cancelled and waited: the workers are gone
    assert h.done()
    assert _threads() == th0 and _fds() == fd0
    res = h.wait(timeout=0.5)
    assert res is not None
    _check_cancelled_result(files, res, paths, "sha256")


def test_cancel_before_any_read(files):
    paths = [files.make(200_000) for _ in range(30)]
    # the only worker is held before it opens the first file (the Gate's mechanism): cancel lands before any read,
    # every time; started free, the worker read 11 files before the flag on a box busy with a second test worker
    h = fastio.start(paths, concurrency=1, hash="xxh64", block_size=4096, chunk_size=16384,
                     _faults={paths[0]: "hold"})
    h.cancel()
    h._release()
    res = h.wait(timeout=5)
    assert res is not None
    n = _check_cancelled_result(files, res, paths, "xxh64")
    assert n >= 25  # at most a file or so slipped through before the flag was seen


def test_no_leaks_across_start_cancel_cycles(files):
    p = files.make(256 << 10)
    listing = [p] * 2000  # many files per run: a leaked engine would cost ~1 MiB per cycle

    def cycle():
        h = fastio.start(listing, concurrency=4, hash="md5", block_size=4 << 20, chunk_size=4 << 20)
        h.cancel()
        res = h.wait(timeout=10)
        assert res is not None and res.cancelled
        del h, res

    for _ in range(5):  # warm up allocator arenas and thread stacks
        cycle()
    gc.collect()
    proc = psutil.Process()
    fd0, th0, rss0 = _fds(), _threads(), proc.memory_info().rss
    for _ in range(30):
        cycle()
    gc.collect()
    grew = proc.memory_info().rss - rss0
    assert _fds() == fd0
    # no more than before: a leak adds threads; under two workers this process also holds threads earlier test files
    # started, and one of those ending meanwhile read as 50 == 51 (a flaky failure, not a leak)
    assert _threads() <= th0
    assert grew < 8 << 20, f"RSS grew by {grew / 2**20:.1f} MiB over 30 start/cancel cycles"
