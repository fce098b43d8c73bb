"""The save side's parts on their own: the dirty limits and diskstats read from a fixture /proc, the sampler's
rates, the preflight probes on a real directory, and the analysis of handmade saves and samples."""

from __future__ import annotations

import os

import pytest

MiB = 1 << 20


def _root(tmp_path, *, dirty_ratio=20, dirty_bytes=0, bg_ratio=10, bg_bytes=0, device="8:0", diskstats=""):
    root = tmp_path / "root"
    (root / "proc/sys/vm").mkdir(parents=True)
    (root / "proc/self").mkdir(parents=True)
    (root / "proc/meminfo").write_text(
        "MemTotal: 8388608 kB\nMemFree: 1024000 kB\nMemAvailable: 3000000 kB\nActive(file): 512000 kB\n"
        "Inactive(file): 512000 kB\nDirty: 20480 kB\nWriteback: 1024 kB\n")
    for name, v in (("dirty_ratio", dirty_ratio), ("dirty_bytes", dirty_bytes),
                    ("dirty_background_ratio", bg_ratio), ("dirty_background_bytes", bg_bytes)):
        (root / f"proc/sys/vm/{name}").write_text(f"{v}\n")
    (root / "proc/self/mountinfo").write_text(
        f"30 1 {device} / /data rw,relatime shared:1 - ext4 /dev/sda rw\n")
    (root / "proc/diskstats").write_text(diskstats)
    return str(root)


def _line(writes, sectors, write_ms, io_ms, dev="8 0 sda"):
    return f"   {dev} 10 0 80 5 {writes} 0 {sectors} {write_ms} 0 {io_ms} {io_ms} 0 0 0 0\n"


def test_dirty_limits_follow_the_ratio_of_dirtyable_memory(tmp_path):
    from ckptbench.system.probes import meminfo
    from ckptbench.system.writeback import dirty_limits

    root = _root(tmp_path)
    dirtyable = (1024000 + 512000 + 512000) * 1024  # free + file cache, not MemTotal
    assert dirty_limits(meminfo(root), root) == (dirtyable * 20 // 100, dirtyable * 10 // 100)


def test_dirty_bytes_override_the_ratios_and_background_is_halved_when_not_below(tmp_path):
    from ckptbench.system.probes import meminfo
    from ckptbench.system.writeback import dirty_limits

    root = _root(tmp_path, dirty_bytes=64 * MiB, bg_bytes=100 * MiB)
    assert dirty_limits(meminfo(root), root) == (64 * MiB, 32 * MiB)


def test_sampler_rates_from_two_diskstats_readings(tmp_path):
    from ckptbench.system.writeback import WritebackSampler

    root = _root(tmp_path, diskstats=_line(100, 2000, 50, 400))
    s = WritebackSampler("/data/ckpt", root=root)
    assert s.device == "8:0"
    s.start()
    s._stop.set()  # drive the samples by hand
    s._thread.join()
    with open(os.path.join(root, "proc/diskstats"), "w") as f:
        f.write(_line(110, 2000 + 20480, 90, 500))
    one = s.sample()
    assert one.dirty_bytes == 20480 * 1024 and one.writeback_bytes == 1024 * 1024
    assert one.w_await_ms == pytest.approx(4.0)  # 40 ms over 10 writes
    assert one.write_mbps > 0 and one.util_pct is not None
    assert s.sectors_written_bytes() == 20480 * 512
    assert s.latest() == one


def test_sampler_without_a_block_device_leaves_device_figures_none(tmp_path):
    from ckptbench.system.writeback import WritebackSampler

    root = _root(tmp_path, device="0:42", diskstats=_line(1, 1, 1, 1))
    s = WritebackSampler("/data/ckpt", root=root).start()
    samples = s.stop()
    assert s.device is None and s.sectors_written_bytes() is None
    assert samples and all(x.write_mbps is None and x.util_pct is None and x.w_await_ms is None for x in samples)
    assert all(x.dirty_limit_bytes > 0 for x in samples)


def test_preflight_on_a_writable_directory(tmp_path):
    from ckptbench.save.preflight import blocking, preflight

    checks = preflight(str(tmp_path), 1 * MiB)
    assert [c.name for c in checks] == ["rename", "fsync file", "fsync dir", "O_DIRECT", "free space"]
    by = {c.name: c for c in checks}
    assert by["rename"].ok and by["fsync file"].ok and by["fsync dir"].ok and by["free space"].ok
    assert by["O_DIRECT"].ok in (True, False)  # depends on the filesystem; it must say which
    assert blocking(checks) == []
    assert os.listdir(tmp_path) == []  # the scratch file is gone


def test_preflight_free_space_short_is_blocking(tmp_path):
    from ckptbench.save.preflight import blocking, preflight

    checks = preflight(str(tmp_path), 1 << 62)
    bad = blocking(checks)
    assert [c.name for c in bad] == ["free space"]
    assert "needed" in bad[0].evidence and bad[0].fix


def _timing(i, nbytes, durable):
    from ckptbench.save.report import SaveTiming

    return SaveTiming(i, f"step-{i:06d}", nbytes, durable, durable / 2, durable, False)


def _sample(dirty, wb, limit=100, bg=50):
    from ckptbench.system.writeback import WritebackSample

    return WritebackSample(0.0, dirty, wb, limit, bg, None, None, None)


def test_sustained_is_the_median_after_the_first_save():
    from ckptbench.save.analysis import sustained

    saves = [_timing(1, 10**9, 10.0), _timing(2, 10**9, 1.0), _timing(3, 10**9, 2.0), _timing(4, 10**9, 4.0)]
    gbps, durable = sustained(saves)
    assert durable == 2.0 and gbps == pytest.approx(0.5)
    assert sustained([_timing(1, 10**9, 2.0)]) == (pytest.approx(0.5), 2.0)


def test_throttled_above_the_midpoint_of_background_and_limit():
    from ckptbench.save.analysis import dirty_peak, throttled

    assert not throttled([_sample(60, 10)])  # 70 is below 75, the midpoint of background 50 and limit 100
    assert throttled([_sample(60, 10), _sample(70, 6)])
    assert dirty_peak([_sample(60, 10), _sample(70, 6)]) == pytest.approx(0.76)


def test_overlap_and_peak_rate_of_rank_spans():
    from ckptbench.save.analysis import overlap, peak_rate

    together = [{"rank": 0, "start_s": 0.0, "end_s": 1.0, "bytes": 10**9},
                {"rank": 1, "start_s": 0.5, "end_s": 1.5, "bytes": 10**9}]
    o = overlap(together)
    assert o["peak_concurrent_ranks"] == 2 and o["overlap_fraction"] == pytest.approx(0.5 / 1.5)
    assert peak_rate(together) == (pytest.approx(2.0), pytest.approx(2.0))
    apart = [dict(together[0]), dict(together[1], start_s=1.0, end_s=2.0)]
    assert overlap(apart) == {"peak_concurrent_ranks": 1, "overlap_fraction": 0.0}
    assert peak_rate(apart) == (pytest.approx(1.0), pytest.approx(2.0))


@pytest.mark.parametrize("field, value, needle", [
    ("interval_s", 0.0, "--interval"), ("keep", 0, "--keep"), ("count", 0, "--count"), ("stagger_s", -1.0, "--stagger"),
    ("async_save", True, "--format dcp"), ("format", "zip", "unknown format")])
def test_validate_refuses_bad_options(field, value, needle):
    from ckptbench.core.errors import CkptbenchError
    from ckptbench.save.series import SaveOptions, validate

    with pytest.raises(CkptbenchError, match=needle.replace("-", r"\-")):
        validate(SaveOptions(**{field: value}))


@pytest.mark.parametrize("profile, interval", [("small", "60"), ("small", "3600"), ("70b", "60")])
def test_plans_save_rates_keep_three_digits_so_the_total_never_reads_below_a_ranks_share(tmp_path, profile, interval):
    import json
    import re

    from clirun import run_cli

    args = ("plan", profile, "--interval", interval, "--results", tmp_path / "none.csv")
    r = run_cli(*args)
    assert r.rc == 0, r.err
    m = re.search(r"needs ([\d.,]+) GB/s sustained \(([\d.,]+) GB/s per rank\)", r.out)
    assert m, r.out
    total, per_rank = (float(g.replace(",", "")) for g in m.groups())
    save = json.loads(run_cli(*args, "--json").out)["save"]
    assert save["required_gbps"] > save["per_rank_gbps"] > 0  # several ranks share it
    assert total == pytest.approx(save["required_gbps"], rel=5e-3) and total > per_rank
    assert per_rank == pytest.approx(save["per_rank_gbps"], rel=5e-3)
