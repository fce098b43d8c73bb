"""Page-cache residency (mincore), eviction, drop_caches."""

from __future__ import annotations

import errno

import pytest

import fastio

SIZE = 4 << 20


def test_evict_then_read_brings_pages_in(files):
    paths = [files.make(SIZE, fsync=True), files.make(SIZE // 2 + 123, fsync=True)]
    fastio.evict(paths)
    cold = fastio.residency(paths)
    assert cold.total == SIZE + SIZE // 2 + 123
    assert cold.fraction <= 0.05, cold
    res = fastio.read_files(paths, hash="crc32c", read="pread")
    assert all(f.error is None for f in res.files)
    hot = fastio.residency(paths)
    assert hot.fraction >= 0.95, hot
    assert hot.resident <= hot.total
    # per_file adds up and names each path with its own size
    assert [p for p, _, _ in hot.per_file] == paths
    assert sum(r for _, r, _ in hot.per_file) == hot.resident
    assert sum(t for _, _, t in hot.per_file) == hot.total
    assert [t for _, _, t in hot.per_file] == [len(files.data[p]) for p in paths]
    assert all(0 <= r <= t for _, r, t in hot.per_file)


def test_mmap_read_brings_pages_in(files):
    p = files.make(SIZE, fsync=True)
    fastio.evict([p])
    assert fastio.residency([p]).fraction <= 0.05
    res = fastio.read_files([p], hash="none", read="mmap")
    assert res.files[0].error is None and res.files[0].bytes == SIZE
    assert fastio.residency([p]).fraction >= 0.95


def test_direct_read_bypasses_the_cache(files):
    p = files.make(SIZE, fsync=True)
    fastio.evict([p])
    res = fastio.read_files([p], hash="md5", read="direct")
    assert res.files[0].digest == files.expect(p, "md5")
    assert fastio.residency([p]).fraction <= 0.05


def test_residency_of_missing_path_raises(tmp_path, files):
    good = files.make(10_000)
    missing = str(tmp_path / "missing.bin")
    with pytest.raises(fastio.FastIOError) as ei:
        fastio.residency([good, missing])
    assert ei.value.errno == errno.ENOENT
    assert ei.value.filename == missing
    assert isinstance(ei.value, OSError)


def test_residency_of_empty_file(files):
    p = files.make(0)
    r = fastio.residency([p])
    assert (r.resident, r.total, r.fraction) == (0, 0, 0.0)


def test_evict_tries_every_path_and_reports_first_failure(tmp_path, files):
    p = files.make(SIZE, fsync=True)
    fastio.read_files([p], hash="none")
    assert fastio.residency([p]).fraction >= 0.95
    missing = str(tmp_path / "gone")
    with pytest.raises(fastio.FastIOError) as ei:
        fastio.evict([missing, p])
    assert ei.value.errno == errno.ENOENT and ei.value.filename == missing
    assert fastio.residency([p]).fraction <= 0.05  # the good path after the bad one was still evicted


def test_residency_and_evict_never_follow_a_symbolic_link(tmp_path, files):
    """A shard swapped for a link after the listing: probing or evicting it would act on the link's target, a file
    outside the checkpoint; both refuse it (ELOOP) and leave the target's pages as they were."""
    target = files.make(SIZE, fsync=True)
    fastio.read_files([target], hash="none")
    assert fastio.residency([target]).fraction >= 0.95
    link = tmp_path / "model.safetensors"
    link.symlink_to(target)
    for probe in (fastio.residency, fastio.evict):
        with pytest.raises(fastio.FastIOError) as ei:
            probe([str(link)])
        assert ei.value.errno == errno.ELOOP and ei.value.filename == str(link)
    assert fastio.residency([target]).fraction >= 0.95  # the target was not evicted through the link
    # asked to follow (a /proc/self/fd name of a file the caller holds open is such a link), both act on the file
    with open(target, "rb") as f:
        held = f"/proc/self/fd/{f.fileno()}"
        assert fastio.residency([held], nofollow=False).total == SIZE
        fastio.evict([held], nofollow=False)
    assert fastio.residency([target]).fraction <= 0.05


@pytest.mark.alone  # every test beside it that warmed its files and checks they are hot would find them dropped
def test_drop_caches_drops_or_raises(files):
    p = files.make(SIZE, fsync=True)
    fastio.read_files([p], hash="none")
    try:
        fastio.drop_caches()
    except fastio.FastIOError as e:
        assert e.errno in (errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOENT)
        assert e.filename == "/proc/sys/vm/drop_caches"
    else:
        assert fastio.residency([p]).fraction <= 0.05
