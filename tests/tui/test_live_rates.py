"""LiveRates, the dashboard's now / average / peak GB/s, fed engine snapshots made by hand: "now" is the bytes
read between two snapshots over the reader's clock between them, and the peak never reads below the average."""

from __future__ import annotations

import pytest

import fastio

from ckptbench.system.live import LiveRates

PLANNED = 3_000_000_000


def snap(elapsed_s: float, nbytes: int, *, finished: bool = False) -> fastio.Snapshot:
    return fastio.Snapshot(bytes=nbytes, bytes_planned=PLANNED, files_done=4 if finished else 0, files_failed=0,
                           files_total=4, retries=0, reads=nbytes // (1 << 20), active_workers=0 if finished else 4,
                           parked_workers=0, threads=4, concurrency=4, elapsed_s=elapsed_s, finished=finished,
                           cancelled=False, worker_busy_s=(elapsed_s,) * 4)


def feed(snaps):
    """Each snapshot through one LiveRates, with the figures it gave; the previous snapshot rides along."""
    rates = LiveRates()
    prev = snap(0.0, 0)
    for s in snaps:
        yield prev, s, rates.update(s)
        prev = s


def test_now_is_the_delta_rate_and_peak_never_below_average():
    steady = [snap(0.25, 250_000_000), snap(0.5, 600_000_000), snap(0.75, 800_000_000)]
    idle = [snap(1.0, 800_000_000), snap(1.25, 800_000_000)]
    burst = [snap(1.5, 2_900_000_000)]  # the rest arrives in one poll interval after two idle ones
    final = [snap(1.6, PLANNED, finished=True)]
    seen = 0
    for prev, s, live in feed(steady + idle + burst + final):
        expected_now = (s.bytes - prev.bytes) / (s.elapsed_s - prev.elapsed_s) / 1e9
        assert live["now_gbps"] == pytest.approx(expected_now, rel=1e-12, abs=1e-15), (s, live)
        assert live["avg_gbps"] == pytest.approx(s.bytes / s.elapsed_s / 1e9, rel=1e-12)
        assert live["peak_gbps"] >= live["avg_gbps"] - 1e-12, (s, live)
        seen += 1
    assert seen == 7
    assert live["now_gbps"] == pytest.approx(1.0) and live["peak_gbps"] == pytest.approx(2.1 / 0.25)
    assert live["eta_s"] is None and live["bytes"] == PLANNED


def test_everything_in_the_last_interval_before_the_finish():
    """All bytes arrive between the last unfinished snapshot and the finished one: the peak is that interval."""
    for prev, s, live in feed([snap(0.25, 0), snap(0.5, 0), snap(0.75, 0), snap(0.9, PLANNED, finished=True)]):
        assert live["now_gbps"] == pytest.approx((s.bytes - prev.bytes) / (s.elapsed_s - prev.elapsed_s) / 1e9)
        assert live["peak_gbps"] >= live["avg_gbps"] - 1e-12, (s, live)
    assert live["peak_gbps"] == pytest.approx(PLANNED / 0.15 / 1e9)
    assert live["avg_gbps"] == pytest.approx(PLANNED / 0.9 / 1e9)


def test_finished_snapshot_clocked_at_the_last_byte_keeps_peak_at_least_average():
    """fastio and the S3 readers clock a finished snapshot at the last byte (t_last), not at the poll: a poll
    after the last byte but before the workers exited reports a longer elapsed_s than the final snapshot."""
    for _prev, s, live in feed([snap(0.25, PLANNED), snap(0.245, PLANNED, finished=True)]):
        assert live["peak_gbps"] >= live["avg_gbps"] - 1e-12, (s, live)


def test_the_fresh_memory_rate_met_so_far_is_per_core_and_none_until_there_is_enough_to_time():
    from dataclasses import replace

    from ckptbench.system import floor as fl

    rates = LiveRates()
    little = replace(snap(0.5, 1 << 30), populated_bytes=fl.MET_MIN_BYTES - 1, populate_cpu_s=0.01)
    assert rates.update(little)["fresh_gbps_per_core"] is None
    enough = replace(snap(1.0, 2 << 30), populated_bytes=2 << 30, populate_cpu_s=0.8)
    assert rates.update(enough)["fresh_gbps_per_core"] == pytest.approx((2 << 30) / 0.8 / 1e9)
    assert rates.update(snap(1.5, 3 << 30))["fresh_gbps_per_core"] is None  # O_DIRECT: nothing populated
