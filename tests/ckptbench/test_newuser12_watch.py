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
