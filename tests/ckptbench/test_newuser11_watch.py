"""From a new user's pass (newuser11): a watch of safetensors' load_file over a 35 KiB checkpoint said its floor
"says little" and, in the next line, "loader-cpu-bound: your loader runs at 0.2 % of this box's floor", told to load
its shards in parallel: the one busy thread was the job importing torch."""

from __future__ import annotations

import pytest

from ckptbench.system.floor import FIXED_COSTS_S


def _one_thread_load(nbytes: int, peak_rss: int = 0):
    from ckptbench.watch import sampler as watch
    from ckptbench.watch import verdict

    reading = watch.Interval(0.0, 1.0, nbytes, 0, 1.0, 1.0, 1, 0.0, 1 << 30, "reading")
    report = watch.WatchReport(pid=1, command="job", wall_s=1.0, bytes=nbytes, disk_bytes=0,
                               files={"/ck/model.safetensors": nbytes}, intervals=[reading], phases=[],
                               peak_rss_bytes=peak_rss)
    return report, verdict.StorageProbe(2.0, "cold (verified)", 1, nbytes)


@pytest.mark.parametrize("floor_s, kind", [(FIXED_COSTS_S / 20, "unknown"), (FIXED_COSTS_S * 2, "loader-cpu-bound")])
def test_a_watch_names_no_bottleneck_of_a_checkpoint_under_the_fixed_costs(floor_s, kind):
    from ckptbench.watch import verdict

    report, probe = _one_thread_load(100 << 20)
    floor = {"floor_s": floor_s, "efficiency": floor_s / 1.0, "binding": "storage", "binding_gbps": 2.1}
    v = verdict.judge(report, probe, cpus=2, mem_total=64 << 30, floor=floor)
    assert v.verdict == kind, v.why
    if kind == "unknown":
        assert v.why.startswith("the checkpoint is too small to judge its loader by") and "loader-cpu-bound" in v.why
        assert v.fix == "watch the restore of a checkpoint of tens of MiB or more" and v.evidence["too_small"]
    else:
        assert "too_small" not in v.evidence


def test_a_small_checkpoint_keeps_a_verdict_the_rates_do_not_decide():
    from ckptbench.watch import verdict

    report, probe = _one_thread_load(100 << 20, peak_rss=63 << 30)
    floor = {"floor_s": FIXED_COSTS_S / 20, "efficiency": 0.01, "binding": "storage", "binding_gbps": 2.1}
    v = verdict.judge(report, probe, cpus=2, mem_total=64 << 30, floor=floor)  # its RSS at 63 GiB of 64
    assert v.verdict == "memory-pressure-bound"
