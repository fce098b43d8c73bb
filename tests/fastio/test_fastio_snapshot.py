"""Snapshot counters: consistent while the run is going and exact at the end; wait()/done()."""

from __future__ import annotations

import errno
import math
import time

import fastio

BLOCK = 4096
CHUNK = 16384


def _check_running(s: fastio.Snapshot, nfiles: int, planned: int, threads: int):
    assert s.files_total == nfiles
    assert s.bytes_planned == planned
    assert 0 <= s.bytes <= planned
    assert 0 <= s.files_done + s.files_failed <= nfiles
    assert s.threads == threads
    assert len(s.worker_busy_s) == s.threads
    assert all(b >= 0 for b in s.worker_busy_s)
    assert 0 <= s.active_workers + s.parked_workers <= s.threads
    assert len(s.latency_hist) == 32
    assert s.elapsed_s >= 0
    assert not s.cancelled


def test_snapshot_consistent_while_running_and_at_end(files):
    sizes = [0, 1, 4095, 4096, 4097, 100_000, 3 * CHUNK + 1] * 3 + [6 << 20] * 6
    paths = [files.make(s) for s in sizes]
    planned = sum(sizes)
    h = fastio.start(paths, concurrency=2, hash="sha256", block_size=BLOCK, chunk_size=CHUNK)
    prev = None
    seen_running = 0
    while True:
        s = h.snapshot()
        _check_running(s, len(paths), planned, 2)
        if prev is not None:  # counters only move forward
            assert s.bytes >= prev.bytes
            assert s.reads >= prev.reads
            assert s.files_done >= prev.files_done
            assert s.elapsed_s >= prev.elapsed_s
            assert all(b >= a for a, b in zip(prev.worker_busy_s, s.worker_busy_s))
        prev = s
        if s.finished:
            break
        if 0 < s.bytes < planned:
            seen_running += 1
        time.sleep(0.001)
    res = h.wait(timeout=30)
    assert res is not None
    assert seen_running > 0, "never saw the run in progress"
    fin = res.final
    assert fin.finished and not fin.cancelled
    assert fin.bytes == sum(f.bytes for f in res.files) == planned == res.bytes
    assert fin.files_done + fin.files_failed == fin.files_total == len(paths)
    assert fin.files_failed == 0
    assert sum(fin.latency_hist) == fin.reads
    # one read call per block of each file (sizes known; chunks are whole blocks)
    assert fin.reads == sum(math.ceil(sz / BLOCK) for sz in sizes)
    assert len(fin.worker_busy_s) == fin.threads == 2
    assert fin.concurrency == 2
    assert fin.elapsed_s > 0 and res.seconds == fin.elapsed_s
    assert res.read_gbps > 0
    q50, q99 = fin.latency_us(0.5), fin.latency_us(0.99)
    assert q50 is not None and q99 is not None and q50 <= q99
    assert math.log2(q50).is_integer()  # an upper bucket bound
    # a later snapshot of a finished run does not move
    again = h.snapshot()
    assert again.bytes == fin.bytes and again.reads == fin.reads and again.elapsed_s == fin.elapsed_s
    for f, p in zip(res.files, paths):
        assert f.digest == files.expect(p, "sha256")
        assert f.attempts == 1
        assert f.seconds >= 0


def test_snapshot_counts_failures(files, tmp_path):
    good = [files.make(s) for s in (10, 20_000)]
    missing = str(tmp_path / "nope")
    res = fastio.read_files([good[0], missing, good[1]], concurrency=2, hash="crc32c",
                            block_size=BLOCK, chunk_size=CHUNK)
    fin = res.final
    assert fin.files_done == 2 and fin.files_failed == 1 and fin.files_total == 3
    assert fin.bytes == sum(f.bytes for f in res.files) == 20_010
    assert [f.error.errno if f.error else 0 for f in res.files] == [0, errno.ENOENT, 0]


def test_empty_run_finishes(poll):
    h = fastio.start([])
    # done() must turn true without anybody calling wait()
    assert poll(h.done, timeout=1), "done() never became True for an empty file list"
    res = h.wait(timeout=5)
    assert res is not None and res.files == () and res.bytes == 0
    assert res.final.finished


def test_wait_timeout_returns_none_while_running_then_result(files, gate):
    p = files.make(5000)
    h = fastio.start([gate.path, p], concurrency=1, hash="md5", _faults=gate.faults)
    try:
        assert h.wait(timeout=0.05) is None  # the only worker is held before the gate file
        assert not h.done()
        assert not h.snapshot().finished
    finally:
        gate.release(h)
    res = h.wait(timeout=30)
    assert res is not None
    assert res.files[1].digest == files.expect(p, "md5")
    assert h.wait() is res  # the same result again


def test_wait_with_zero_timeout_on_finished_run_returns_result(files, poll):
    p = files.make(5000)
    h = fastio.start([p], concurrency=1, hash="md5")
    assert poll(h.done, timeout=10)
    res = h.wait(timeout=0)  # already done: no waiting needed, so no timeout
    assert res is not None
    assert res.files[0].digest == files.expect(p, "md5")


def test_bytes_consistent_when_a_file_fails_mid_way(files):
    """The run's byte count and the files' byte counts agree even when a file fails part-way."""
    good = [files.make(s) for s in (50_000, 3 * CHUNK + 5)]
    bad = files.make(8 * BLOCK)
    res = fastio.read_files([good[0], bad, good[1]], concurrency=1, hash="md5", block_size=BLOCK,
                            chunk_size=CHUNK, _faults={bad: (errno.EIO, 4 * BLOCK, 1)})
    f = res.files[1]
    assert f.error is not None and f.error.errno == errno.EIO
    assert res.final.bytes == sum(x.bytes for x in res.files) == res.bytes
    assert res.files[0].digest == files.expect(good[0], "md5")
    assert res.files[2].digest == files.expect(good[1], "md5")
