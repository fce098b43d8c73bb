"""Round 12 of trying ckptbench as a new user: a watch on record, then `compare`."""

from __future__ import annotations

import csv

from ckptbench.system import env as envmod
from ckptbench.watch import results


def _doc(count_note: str) -> dict:
    return {"bytes": 62 << 20, "io_span_s": 0.27, "files": {"/ck/model.safetensors": 128 << 20},
            "loader_gbps": 0.24, "peak_rss_bytes": 300 << 20, "cpu_s": 1.8, "exit_code": 0, "count_note": count_note}


def test_a_watch_whose_count_is_a_lower_bound_records_no_read_rate(tmp_path):
    """A job that maps its files faster than the watch samples them is counted short ("read at least 62 MiB ...
    at least 0.24 GB/s"); recorded as the read rate, compare called two such lower bounds of one job, 0.24 and
    0.19 GB/s, a REGRESSION. The row keeps its window and leaves the rate out; a whole count keeps its rate."""
    path = str(tmp_path / "results.csv")
    env = envmod.snapshot(str(tmp_path))
    results.record(path, "aaaaaaaaaaaa", _doc("the job maps its files faster than the watch samples them"), env)
    results.record(path, "bbbbbbbbbbbb", _doc(""), env)
    with open(path, newline="") as f:
        rows = {r["run_id"]: r for r in csv.DictReader(f)}
    assert rows["aaaaaaaaaaaa"]["read_gbps"] == "" and float(rows["aaaaaaaaaaaa"]["rto_s"]) == 0.27
    assert float(rows["bbbbbbbbbbbb"]["read_gbps"]) == 0.24


def test_a_watchs_floor_line_says_the_efficiency_as_runs_does():
    """`watch --no-verdict` printed "floor: 0.123 s, bound by storage (...)" and no efficiency anywhere in its text,
    while history gave the same watch "efficiency 19 %": the floor line says it, as run's does."""
    from ckptbench.cli.watch import floor_lines

    doc = {"floor_s": 0.123, "efficiency": 0.19, "binding": "storage", "binding_gbps": 1.1, "binding_how":
           "read into fresh memory", "floor_times_s": {"storage": 0.123}, "floor_note": "ceilings measured 1 min ago"}
    assert floor_lines(doc)[0].endswith(" · 19 % of it"), floor_lines(doc)
    assert "% of it" not in floor_lines({**doc, "efficiency": None})[0]


def test_the_verdicts_storage_rate_says_into_which_memory():
    """The verdict said "this storage gives 2.16 GB/s to ckptbench (cold (verified))" beside the floor's "bound by
    storage (1.28 GB/s read into fresh memory)", both of the same files: the probe reads into reused buffers, as
    `read` does, and says so, as the floor says each of its storage rates."""
    from ckptbench.watch import sampler as watch
    from ckptbench.watch import verdict
    from ckptbench.watch.phases import Interval

    def iv(k, nbytes, phase):
        return Interval(k * 0.25, (k + 1) * 0.25, nbytes, nbytes, 0.3, 0.3, 0, 0.0, 1 << 28, phase, 1)

    intervals = [iv(0, 0, "starting")] + [iv(k, 32 << 20, "reading") for k in range(1, 5)]
    report = watch.WatchReport(pid=1, command="job", wall_s=1.25, bytes=128 << 20, disk_bytes=128 << 20,
                               files={"/ckpt/model.safetensors": 128 << 20}, intervals=intervals, phases=[],
                               exit_code=0, source="/ckpt", files_bytes=128 << 20, interval_s=0.25)
    v = verdict.judge(report, verdict.StorageProbe(2.16, "cold (verified)", 1, 128 << 20), cpus=2, mem_total=64 << 30)
    said = v.why + " " + v.fix + " " + str(getattr(v, "summary", ""))
    assert "2.16 GB/s to ckptbench read into reused buffers, cold (verified)" in said, said
