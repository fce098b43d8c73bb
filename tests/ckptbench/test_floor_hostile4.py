"""The page cache figure and the storage sample under hostile input: a file cut short while its copy runs, a box that
will not start a thread per core, a name swapped for a symlink out of the checkpoint between the cold reads and the
page cache copy, a sample too small to be anything but the CPU's caches, and sparse files whose holes read at
memory's rate."""

from __future__ import annotations

import os
import threading

import pytest

from ckptbench.core.errors import CkptbenchError
from ckptbench.system import ceilings, sourcefigures
from clirun import assert_one_line_error

MiB = 1 << 20


def test_a_file_cut_short_mid_copy_is_one_clear_error_not_a_figure(tmp_path, monkeypatch):
    """The copy's threads raised, the error was printed as a thread's traceback and the copy's rate (12 GB/s of a
    file that had gone) was taken as measured."""
    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(16 * MiB))
    real = sourcefigures.populate

    def cut_then_populate(region, n):  # after the descriptors are checked, before the copy
        os.truncate(data, MiB)
        return real(region, n)

    monkeypatch.setattr(sourcefigures, "populate", cut_then_populate)
    seen = []
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    with pytest.raises(CkptbenchError, match="shorter than it was listed"):
        sourcefigures._page_cache_copy([(str(data), 16 * MiB)], 16 * MiB, 2, 1)
    assert seen == []  # said once, on the caller's thread


def test_a_box_that_will_not_start_a_thread_per_core_is_a_clear_error_not_a_hang(monkeypatch):
    """A pids limit: RuntimeError came up as a traceback, and the threads already started waited at the gate for one
    that never came, for ever (the process never exited)."""
    barriers = []

    class Recorded(threading.Barrier):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            barriers.append(self)

    monkeypatch.setattr(threading, "Barrier", Recorded)
    real_start, starts = threading.Thread.start, []

    def start(self):
        starts.append(self)
        if len(starts) == 2:
            raise RuntimeError("can't start new thread")
        return real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    outcome = []

    def call():
        try:
            ceilings.parallel(4, lambda i: None)
            outcome.append("returned")
        except BaseException as exc:  # noqa: BLE001  what it raised is the test's
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    real_start(caller)
    caller.join(10)
    try:
        assert not caller.is_alive(), "hung at the gate"
        assert isinstance(outcome[0], CkptbenchError) and "could not start 4 threads" in str(outcome[0])
        assert not starts[0].is_alive()  # the started one let go, not left waiting
    finally:
        for b in barriers:  # the buggy code's waiting threads: let them go, or the run never ends
            b.abort()


def test_a_name_swapped_for_a_symlink_is_not_followed_out_of_the_checkpoint(tmp_path):
    outside = tmp_path / "outside.bin"
    outside.write_bytes(os.urandom(8 * MiB))
    root = tmp_path / "ck"
    root.mkdir()
    os.symlink(outside, root / "shard.bin")
    with pytest.raises(CkptbenchError, match="no longer the regular file"):
        sourcefigures.page_cache_rates([(str(root / "shard.bin"), 8 * MiB)], cores=2, repeats=1)


def test_floor_with_a_symlink_swapped_in_before_the_page_cache_copy_says_so_in_one_line(tmp_path, monkeypatch, h,
                                                                                     plant_floor):
    """The race a checkpoint's writer can win: the cold reads done, the largest file replaced by a symlink to a file
    the checkpoint does not hold; root read it into the page cache, copied it and evicted it."""
    plant_floor()  # the box's figures: only the storage one is measured
    outside = tmp_path / "outside.bin"
    outside.write_bytes(os.urandom(8 * MiB))
    root = tmp_path / "ck"
    root.mkdir()
    (root / "shard.bin").write_bytes(os.urandom(8 * MiB))
    monkeypatch.setattr(sourcefigures, "MIN_STORAGE_SAMPLE", MiB)  # a test-sized sample is measured
    real = sourcefigures._in_page_cache  # the page cache step's start: where the files are opened and read in

    def swapped(take):
        os.unlink(root / "shard.bin")
        os.symlink(outside, root / "shard.bin")
        return real(take)

    monkeypatch.setattr(sourcefigures, "_in_page_cache", swapped)
    r = h.run_cli("floor", root)
    assert_one_line_error(r, "shard.bin: no longer the regular file")


def test_a_page_cache_sample_of_a_few_mib_is_not_the_mounts_figure(tmp_path, monkeypatch):
    """4 MiB copied from the CPU's caches at 6.9 GB/s where 256 MiB ran at 4.5: kept as the mount's figure, every
    hot restore on the mount was held to it."""
    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(4 * MiB))
    c, note = sourcefigures.storage_ceiling([(str(data), 4 * MiB)], levels=(1,), repeats=1)
    assert c.hot_gbps == 0.0 and "page cache" not in c.method
    assert "measures latency" in note
    monkeypatch.setattr(sourcefigures, "MIN_STORAGE_SAMPLE", 2 * MiB)  # the same sample, over the bar: measured
    c, _ = sourcefigures.storage_ceiling([(str(data), 4 * MiB)], levels=(1,), repeats=1)
    assert c.hot_gbps > 0.0


def _sparse(path, size: int, data_at: int = -1, data: int = 0) -> bool:
    """A file of `size` bytes with `data` bytes written at `data_at`; whether this filesystem keeps the holes."""
    with open(path, "wb") as f:
        f.truncate(size)
        if data:
            f.seek(data_at)
            f.write(os.urandom(data))
    return os.stat(path).st_blocks * 512 < size // 2


def test_a_sparse_file_is_left_out_of_the_storage_sample(tmp_path):
    """A file listed at 1 GiB with its bytes at its end read 'cold' at 64 GB/s (the hole, never the device), and the
    mount's figure, kept, held every restore on the mount to that for a day."""
    if not _sparse(tmp_path / "big.bin", 1 << 30, data_at=(1 << 30) - 4 * MiB, data=4 * MiB):
        pytest.skip("this filesystem keeps no holes")
    (tmp_path / "dense.bin").write_bytes(os.urandom(8 * MiB))
    files = [(str(tmp_path / "big.bin"), 1 << 30), (str(tmp_path / "dense.bin"), 8 * MiB)]
    c, note = sourcefigures.storage_ceiling(files, levels=(1,), repeats=1)
    assert c.sample_bytes == 8 * MiB and "1 largest file(s)" in c.method
    assert "1 sparse file(s) left out" in note


def test_a_source_of_sparse_files_only_is_one_clear_error(tmp_path, h, plant_floor):
    plant_floor()
    root = tmp_path / "ck"
    root.mkdir()
    if not _sparse(root / "x.bin", 1 << 30):
        pytest.skip("this filesystem keeps no holes")
    r = h.run_cli("floor", root)
    assert_one_line_error(r, "sparse file(s) left out")


@pytest.mark.parametrize("call", ["populate", "copy"])
def test_native_threads_that_cannot_start_are_the_same_one_line(monkeypatch, call):
    """Fresh memory and the copy are measured in fastio's native threads since cf0f960: a thread it cannot start (a
    pids limit: EAGAIN) is the floor's one line, as the Python threads' was, not fastio's error out of `floor`."""
    import errno

    import fastio

    def refuse(*_a, **_k):
        raise fastio.FastIOError(errno.EAGAIN, "populate (a page-aligned buffer, at least a page a thread): "
                                               "Resource temporarily unavailable")

    monkeypatch.setattr(fastio, call, refuse)
    region = ceilings.anonymous(4 << 20, huge=False)
    try:
        with pytest.raises(CkptbenchError, match="could not start 2 threads .Resource temporarily unavailable."):
            if call == "populate":
                ceilings.populate(region, 2)
            else:
                ceilings._copy(bytes(1 << 20), bytearray(1 << 20), 2)
    finally:
        region.close()
