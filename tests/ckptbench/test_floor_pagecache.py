"""A hot restore's copy out of the page cache: measured on the source's own mount (the kernel's copy, pread into
populated memory), kept with its storage figure, and what the hot floor holds a restore to; a memmove's rate only
where the mount's was not measured, and then the note says so."""

from __future__ import annotations

import os
import time

import pytest

from ckptbench.system import floor as fl, pagecache, sourcefigures
from floorhelp import fixed_floor


def test_the_hot_floor_copies_at_the_mounts_page_cache_rate_where_measured():
    f = fixed_floor(storage=2.0, copy=8.0, populate_4k=2.0)
    memmove = fl.model(f, bytes_read=8 * 10**9, hot=True)
    assert memmove["times_s"]["page cache"] == pytest.approx(1.0)
    f.storage.hot_gbps = 4.0  # the kernel's copy: slower than a memmove
    m = fl.model(f, bytes_read=8 * 10**9, hot=True)
    assert m["times_s"]["page cache"] == pytest.approx(2.0)
    # populated (4 s), then copied into (2 s), one after the other
    assert m["times_s"]["fresh memory"] == pytest.approx(4.0) and m["binding"] == "fresh memory"
    assert m["floor_s"] == pytest.approx(6.0)
    assert fl.landing_gbps(f, hot=True) == pytest.approx(8 / 6)
    # a cold read goes by the device, not the page cache
    assert "page cache" not in fl.model(f, bytes_read=8 * 10**9)["times_s"]
    # a read into reused buffers copies into the CPU's caches: its own figure, where measured
    reused = fl.model(f, bytes_read=8 * 10**9, hot=True, destination=fl.REUSED)
    assert reused["times_s"] == pytest.approx({"page cache": 2.0})
    f.storage.hot_reused_gbps = 8.0
    reused = fl.model(f, bytes_read=8 * 10**9, hot=True, destination=fl.REUSED)
    assert reused["times_s"] == pytest.approx({"page cache": 1.0}) and reused["floor_s"] == pytest.approx(1.0)


def test_the_note_says_when_the_copy_is_held_to_a_memmove():
    f = fixed_floor(copy=8.0, populate_4k=2.0, populate_thp=2.0, scan=8.0, hash_crc32c=8.0)
    note = fl.restore_fields(f, bytes_read=10**9, measured_s=1.0, hash_alg="none", hot=True)["floor_note"]
    assert "memmove" in note and "ckptbench floor SOURCE" in note
    f.storage = fl.Ceiling(2.0, 2.0, 2.0, "fixed", time.time(), fl.STORAGE_SAMPLE, hot_gbps=5.0)
    note = fl.restore_fields(f, bytes_read=10**9, measured_s=1.0, hash_alg="none", hot=True)["floor_note"]
    assert "memmove" not in note and note.startswith("the read was from the page cache; ")


def test_a_real_page_cache_figure_on_this_disk_leaves_the_file_uncached(tmp_path, monkeypatch):
    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(12 << 20) + b"x" * 1000)  # not whole MiB: only whole MiB are read
    monkeypatch.setattr(sourcefigures, "HOT_BYTES", 8 << 20)
    read = []
    real = sourcefigures.fastio.read_files
    monkeypatch.setattr(sourcefigures.fastio, "read_files", lambda specs, **kw: read.append(specs) or real(specs, **kw))
    rates, n = sourcefigures.page_cache_rates([(str(data), data.stat().st_size)], cores=2, repeats=2)
    assert len(rates) == 2 and all(r > 1e8 for r in rates) and n in (1, 2)
    assert [(s.offset, s.size) for s in read[0]] == [(0, 8 << 20)]  # the sample, not the file
    reused, _ = sourcefigures.page_cache_rates([(str(data), data.stat().st_size)], cores=2, repeats=2, reused=True)
    assert len(reused) == 2 and all(r > 1e8 for r in reused)
    after = pagecache.residency_of_each([str(data)])[0][1]
    pagecache.evict([str(data)])
    evictable = pagecache.residency_of_each([str(data)])[0][1] < 1 << 20  # not a tmpfs
    assert after < 1 << 20 or not evictable  # evicted again where the filesystem lets it


def test_a_mount_that_does_not_keep_pages_cached_has_no_page_cache_figure(tmp_path, monkeypatch):
    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(4 << 20))
    monkeypatch.setattr(pagecache, "residency_of_each", lambda paths, **kw: tuple((p, 0, 4 << 20) for p in paths))
    assert sourcefigures.page_cache_rates([(str(data), 4 << 20)], cores=2, repeats=1) == ([], 0)


def _fixed_box(monkeypatch) -> None:
    """The box's figures at 3 GB/s, measured now: only the storage figure is the test's."""
    monkeypatch.setattr(fl, "memory_ceilings", lambda **kw: {k: fl.Ceiling(3.0, 3.0, 3.0, "x", time.time())
                                                              for k in ("populate_4k", "populate_thp", "copy")})
    monkeypatch.setattr(fl, "cpu_ceilings", lambda: {k: fl.Ceiling(3.0, 3.0, 3.0, "x", time.time())
                                                     for k in fl.BOX_FIGURES if k not in ("populate_4k",
                                                                                           "populate_thp", "copy")})


def test_the_figure_is_kept_with_the_storage_figure_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setattr(fl, "storage_ceiling", lambda ps: (fl.Ceiling(
        2.0, 1.9, 2.1, "fixed read", time.time(), fl.STORAGE_SAMPLE, hot_gbps=6.5), ""))
    _fixed_box(monkeypatch)
    cache = str(tmp_path / "floor.json")
    fl.measure([("/nowhere", 1 << 30)], "/data (ext4)", path=cache)
    again = fl.cached("/data (ext4)", path=cache)
    assert again is not None and again.storage.hot_gbps == 6.5
    assert fl.page_cache_gbps(again) == 6.5


def test_a_file_swapped_for_a_fifo_or_cut_short_is_one_clear_error_not_a_hang(tmp_path):
    from ckptbench.core.errors import CkptbenchError

    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(4 << 20))
    fifo = tmp_path / "swapped.bin"
    os.mkfifo(fifo)
    with pytest.raises(CkptbenchError, match="no longer the regular file"):
        sourcefigures._page_cache_copy([(str(fifo), 4 << 20)], 4 << 20, 2, 1)
    with pytest.raises(CkptbenchError, match="no longer the regular file"):
        sourcefigures._page_cache_copy([(str(data), 8 << 20)], 8 << 20, 2, 1)
    with pytest.raises(CkptbenchError, match="unreadable"):
        sourcefigures._page_cache_copy([(str(tmp_path / "gone.bin"), 4 << 20)], 4 << 20, 2, 1)


def test_a_kept_storage_figure_without_the_page_cache_copy_gets_it_alone(tmp_path, monkeypatch):
    """A figure kept before the page cache's was measured (or where it could not be) is not left so for a day while
    every hot run's note sends the user back to `floor`: `floor` measures that one alone, not the device again."""
    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(80 << 20))
    now = time.time()
    box = {k: fl.Ceiling(3.0, 3.0, 3.0, "x", now) for k in fl.BOX_FIGURES}
    kept = fl.Floor(fl.box_key(), box, fl.Ceiling(2.0, 2.0, 2.0, "read cold", now, 80 << 20), "/data (ext4)")
    cache = str(tmp_path / "floor.json")
    fl._save(cache, kept, {})
    monkeypatch.setattr(fl, "storage_ceiling", lambda ps: pytest.fail("the device's figure was measured again"))
    f = fl.measure([(str(data), 80 << 20)], "/data (ext4)", path=cache)
    assert f.storage.gbps == 2.0 and f.storage.hot_gbps > 0 and "from the page cache" in f.storage.method
    assert f.storage.hot_reused_gbps > 0 and "into a reused 1 MiB buffer per thread" in f.storage.method
    again = fl.cached("/data (ext4)", path=cache).storage  # and kept
    assert (again.hot_gbps, again.hot_reused_gbps) == (f.storage.hot_gbps, f.storage.hot_reused_gbps)


@pytest.mark.parametrize("rates, tried", [({4: 1.0, 8: 2.0, 16: 1.5}, [4, 8, 16]),
                                          ({4: 2.0, 8: 1.0, 16: 1.0, 1: 3.0}, [4, 8, 16, 1])])
def test_the_sweep_tries_one_reader_only_where_the_lowest_level_above_it_won(tmp_path, monkeypatch, rates, tried):
    from types import SimpleNamespace

    data = tmp_path / "shard.bin"
    data.write_bytes(os.urandom(2 << 20))
    asked = []

    def fake(specs, concurrency, into_memory=False, **kw):
        asked.append(concurrency) if not into_memory else None
        return SimpleNamespace(failed=[], read_gbps=rates[concurrency], bytes=2 << 20)

    monkeypatch.setattr(sourcefigures.fastio, "read_files", fake)
    c, _ = sourcefigures.storage_ceiling([(str(data), 2 << 20)], repeats=1)
    assert sorted(set(asked)) == sorted(tried) and asked[:3] == [4, 8, 16]
    assert c.gbps == max(rates.values()) and f"of {', '.join(map(str, sorted(tried)))}," in c.method


def test_busy_is_other_work_before_the_measurement_not_its_own(tmp_path, monkeypatch):
    stat = tmp_path / "stat"
    lines = iter(["cpu 100 0 100 800 0 0 0 0 0 0\n", "cpu 150 0 150 900 0 0 0 0 0 0\n",  # half busy
                  "cpu 100 0 100 800 0 0 0 0 0 0\n", "cpu 110 0 110 980 0 0 0 0 0 0\n"])  # a tenth
    real_open = open

    def fake_open(path, *a, **k):
        if path == "/proc/stat":
            stat.write_text(next(lines))
            return real_open(stat, *a, **k)
        return real_open(path, *a, **k)

    monkeypatch.setattr("builtins.open", fake_open)
    note = fl._busy(window_s=0)
    assert note.startswith("the box was busy (50 % of its cores' time") and "ckptbench floor SOURCE --remeasure" in note
    assert fl._busy(window_s=0) == ""


def test_busy_is_other_work_while_measuring_less_the_measurements_own(monkeypatch):
    """A box two other jobs were loading was called quiet (only the 0.2 s before was looked at), and a hot read then
    ran at 168 % of its floor. Over a 2-core second: 2 s of cores, 0.1 s idle, 1.2 s our own: 0.7 s (35 %) others'."""
    import os as _os

    hz = _os.sysconf("SC_CLK_TCK")
    ticks = iter([(0, 0), (round(0.1 * hz), 2 * hz)])
    own = iter([10.0, 11.2])
    from ckptbench.system import busy

    monkeypatch.setattr(busy, "_idle_total", lambda: next(ticks))
    monkeypatch.setattr(busy, "_own_cpu_s", lambda: next(own))
    others = fl.OtherWork()
    assert others.share() == pytest.approx(0.35, abs=0.01)
    ticks, own = iter([(0, 0), (round(0.1 * hz), 2 * hz)]), iter([10.0, 11.8])  # 0.1 s others': quiet
    assert fl.OtherWork().note() == ""


def test_the_checklist_names_the_page_cache_copy_it_holds_a_hot_restore_to():
    from ckptbench.checklist import efficiency

    f = fixed_floor(copy=12.0, populate_4k=3.0, storage=2.0)
    memmove = efficiency.ceilings(f, "none")["page cache copy"]
    assert memmove["gbps"] == 12.0 and "memmove" in memmove["note"]
    f.storage.hot_gbps = 8.0
    own = efficiency.ceilings(f, "none")["page cache copy"]
    assert own["gbps"] == 8.0 and "pread" in own["method"] and "note" not in own


def test_a_hot_restore_to_a_gpu_names_what_sets_its_floor():
    f = fixed_floor(copy=8.0, populate_4k=4.0, h2d_pinned=1.0)
    f.storage = fl.Ceiling(2.0, 2.0, 2.0, "fixed", time.time(), fl.STORAGE_SAMPLE, hot_gbps=8.0)
    slow_link = fl.model(f, bytes_read=8 * 10**9, hot=True, device_bytes=8 * 10**9)
    assert slow_link["binding"] == "host-to-device" and slow_link["floor_s"] == pytest.approx(8.0)
    f.ceilings["h2d_pinned"] = fl.Ceiling(5.0, 5.0, 5.0, "fixed", time.time())  # 1.6 s: under the cores' 3 s
    fast_link = fl.model(f, bytes_read=8 * 10**9, hot=True, device_bytes=8 * 10**9)
    assert fast_link["binding"] == "fresh memory" and fast_link["floor_s"] == pytest.approx(3.0)
    assert fast_link["gbps"] == pytest.approx(4.0)


@pytest.mark.parametrize("hot, reused", [(0.0, 9.0), (9.0, 4.0)], ids=["reused-alone", "reused-slower"])
def test_a_reused_copy_figure_that_cannot_be_ours_is_not_used(hot, reused):
    c = {"gbps": 2.0, "min_gbps": 2.0, "max_gbps": 2.0, "method": "x", "measured_at": time.time(),
         "hot_gbps": hot, "hot_reused_gbps": reused}
    assert fl.valid_ceiling(c, time.time()) is None
    assert fl.valid_ceiling(c | {"hot_gbps": 8.0, "hot_reused_gbps": 12.0}, time.time()).hot_reused_gbps == 12.0


def test_a_weights_only_load_out_of_a_larger_checkpoint_is_judged(tmp_path):
    """The watch holds the job to the files it mapped or opened, each once whatever name it came by: not to every
    file of --source (a hot load of the weights out of a checkpoint with an optimizer lost its efficiency)."""
    from ckptbench.watch import sampler as watch
    from ckptbench.watch import verdict

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\0" * (8 << 20))
    (tmp_path / "optimizer.pt").write_bytes(b"\0" * (32 << 20))
    link = tmp_path / "link.safetensors"
    link.symlink_to(weights)
    w = watch.WatchReport(pid=1, command="job", wall_s=1.0, bytes=8 << 20, disk_bytes=0,
                          files={str(weights): 8 << 20, str(link): 8 << 20}, intervals=[], phases=[],
                          mapped=[str(weights), str(link)])
    assert verdict._unseen(w) == ""
    assert verdict._unseen(watch.WatchReport(**{**w.__dict__, "bytes": 2 << 20})).startswith("no efficiency")


def test_a_sample_too_small_for_bandwidth_does_not_replace_the_mounts_figure(tmp_path, monkeypatch):
    sample = {"bytes": 282 << 20, "gbps": 2.5}
    monkeypatch.setattr(fl, "storage_ceiling", lambda ps: (fl.Ceiling(
        sample["gbps"], sample["gbps"], sample["gbps"], "fixed read", time.time(), sample["bytes"], hot_gbps=6.5), ""))
    _fixed_box(monkeypatch)
    cache, mount = str(tmp_path / "floor.json"), "/data (ext4)"
    fl.measure([("/big", sample["bytes"])], mount, path=cache)
    sample.update(bytes=17 << 20, gbps=0.3)  # a tiny checkpoint on the same mount, measured again
    small = fl.measure([("/tiny", sample["bytes"])], mount, path=cache, remeasure=True)
    # the floor it shows is the one every restore on the mount is held to (it showed the small sample's, unusable,
    # and a cold floor under the hot one), said once
    assert small.storage.sample_bytes == 282 << 20 and fl.storage_usable(small)
    assert sum("282.0 MiB sample is kept and is the one used" in n for n in small.notes) == 1
    assert not any(n.startswith("a 17.0 MiB sample") for n in small.notes), small.notes
    kept = fl.cached(mount, path=cache)
    assert kept.storage.sample_bytes == 282 << 20 and kept.storage.gbps == 2.5 and fl.storage_usable(kept)
    sample.update(bytes=300 << 20, gbps=2.0)  # a large enough one replaces it, as ever
    fl.measure([("/big2", sample["bytes"])], mount, path=cache, remeasure=True)
    assert fl.cached(mount, path=cache).storage.gbps == 2.0


def test_floor_and_check_say_they_left_the_source_cold(tmp_path):
    import subprocess
    import sys

    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "model.safetensors").write_bytes(os.urandom(8 << 20))
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    for cmd in (["floor", str(d)], ["check", str(d)]):
        p = subprocess.run([sys.executable, "-m", "ckptbench", *cmd], capture_output=True, text=True, env=env)
        assert "have left the page cache" in p.stderr, (cmd, p.stderr[-500:])


def test_a_kept_storage_figure_says_whether_it_read_this_checkpoints_files(tmp_path, monkeypatch):
    """The kept figure's note sent a user to `--remeasure` for "this checkpoint's" files when it had read exactly
    those: it now knows which checkpoint's files it read (their paths' key), and says which."""
    monkeypatch.setattr(fl, "storage_ceiling", lambda ps: (fl.Ceiling(
        2.0, 1.9, 2.1, "fixed read", time.time(), fl.STORAGE_SAMPLE, hot_gbps=6.5, hot_reused_gbps=7.0), ""))
    _fixed_box(monkeypatch)
    cache = str(tmp_path / "floor.json")
    mine = [("/data/a/model.safetensors", 1 << 30)]
    first = fl.measure(mine, "/data (ext4)", path=cache)
    assert first.storage.of_files == fl.files_key(mine) and not any("kept" in n for n in first.notes)
    monkeypatch.setattr(fl, "storage_ceiling", lambda ps: pytest.fail("the kept figure was measured again"))
    same = fl.measure(mine, "/data (ext4)", path=cache)
    assert any("read from this checkpoint's files" in n for n in same.notes), same.notes
    other = fl.measure([("/data/b/model.safetensors", 1 << 30)], "/data (ext4)", path=cache)
    assert any("this mount's, kept from" in n for n in other.notes), other.notes
    assert not any("read from this checkpoint's files" in n for n in other.notes)
