"""set_concurrency mid-run: workers start and park at chunk boundaries, up and down."""

from __future__ import annotations

import hashlib

import pytest

import fastio

CHUNK = 256 << 10


def _observe(h, pred, what, log):
    """Busy-polls snapshots until pred(snapshot) or the run finishes; True when observed."""
    while True:
        s = h.snapshot()
        assert len(s.worker_busy_s) == s.threads  # no spawn can happen between the two reads here
        assert s.active_workers + s.parked_workers <= s.threads
        if pred(s):
            log.append((what, s.threads, s.active_workers, s.parked_workers, s.concurrency))
            return True
        if s.finished:
            return False


def _one_run(path, copies, files):
    """One run through the phases; returns (all phases observed, result)."""
    log = []
    h = fastio.start([path] * copies, concurrency=1, hash="md5", multipart=True,
                     block_size=64 << 10, chunk_size=CHUNK)
    ok = _observe(h, lambda s: s.threads == 1 and s.active_workers == 1, "start", log)
    if ok:
        h.set_concurrency(3)
        assert h.snapshot().concurrency == 3
        ok = _observe(h, lambda s: s.threads == 3 and s.active_workers == 3 and s.parked_workers == 0,
                      "up to 3", log)
    if ok:
        h.set_concurrency(1)
        ok = _observe(h, lambda s: s.concurrency == 1 and s.active_workers == 1 and s.parked_workers == 2,
                      "down to 1", log)
    if ok:
        h.set_concurrency(2)
        ok = _observe(h, lambda s: s.active_workers == 2 and s.parked_workers == 1 and s.threads == 3,
                      "back up to 2", log)
    if ok:
        h.set_concurrency(4)
        ok = _observe(h, lambda s: s.threads == 4 and s.active_workers == 4 and s.parked_workers == 0,
                      "up to 4", log)
    res = h.wait(timeout=60)
    assert res is not None
    return ok, res, log


def test_set_concurrency_up_and_down(files):
    p = files.make(16 << 20)  # 64 chunks of 256 KiB; listed several times for more chunks
    copies = 4
    for attempt in range(5):
        ok, res, log = _one_run(p, copies, files)
        # whatever happened to the workers, every copy was read right
        assert all(f.error is None for f in res.files)
        assert all(f.bytes == 16 << 20 for f in res.files)
        assert res.final.finished and not res.final.cancelled
        if ok:
            break
        copies *= 2  # the run ended before all phases were seen: give it more work
    assert ok, f"phases seen before the run ended: {log}"
    assert res.final.threads == 4
    assert res.concurrency == 4
    assert len(res.final.worker_busy_s) == 4
    # more than one worker did work
    assert sum(1 for b in res.final.worker_busy_s if b > 0) >= 2
    # part digests are complete

    data = files.data[p]
    parts = [hashlib.md5(data[i:i + CHUNK]).hexdigest() for i in range(0, len(data), CHUNK)]
    for f in res.files:
        assert list(f.part_digests) == parts
        assert f.digest is None  # md5 split into parts has no plain whole-file digest


def test_set_concurrency_rejects_out_of_range(files):
    p = files.make(1000)
    with fastio.start([p]) as h:
        for bad in (0, -1, fastio.MAX_CONCURRENCY + 1):
            with pytest.raises(fastio.OptionError):
                h.set_concurrency(bad)
        res = h.wait(timeout=30)
    assert res.files[0].error is None


def test_set_concurrency_after_finish_starts_nothing(files):
    p = files.make(100_000)
    h = fastio.start([p], concurrency=1, hash="crc32c")
    res = h.wait(timeout=30)
    h.set_concurrency(8)
    s = h.snapshot()
    assert s.threads == 1
    assert res.files[0].digest == files.expect(p, "crc32c")


def test_run_finishes_with_workers_parked(files):
    """Lowering concurrency and never raising it again: the parked workers must still exit."""
    p = files.make(8 << 20)
    for copies in (4, 16, 64):
        h = fastio.start([p] * copies, concurrency=3, hash="sha256", multipart=True,
                         block_size=64 << 10, chunk_size=CHUNK)
        h.set_concurrency(1)
        parked_seen = False
        while not h.done():
            s = h.snapshot()
            if s.parked_workers == 2 and s.active_workers == 1:
                parked_seen = True
                break
        res = h.wait(timeout=30)
        assert res is not None, "run with parked workers never finished"
        assert res.final.finished and res.final.parked_workers == 0 and res.final.active_workers == 0
        assert res.final.files_done == copies

        data = files.data[p]
        parts = [hashlib.sha256(data[i:i + CHUNK]).hexdigest() for i in range(0, len(data), CHUNK)]
        assert all(list(f.part_digests) == parts for f in res.files)
        if parked_seen:
            break
    assert parked_seen
