"""The benchmark harness: medians and spreads of repeats, verdicts at and around a target's bound, the report
tables and files, the machine description."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

import _harness as h
from ckptbench.system import env


def series(key: str, samples: list[float], condition: str = "memory", **kw) -> h.Series:
    return h.Series(key, condition, "GB/s", samples=list(samples), **kw)


def by_key(*items: h.Series) -> dict[str, h.Series]:
    return {s.key: s for s in items}


@dataclass(kw_only=True)
class Checked(h.Series):
    passed: bool = True

    @property
    def ok(self) -> bool:
        return self.passed


def test_median_of_an_odd_count_is_the_middle_repeat():
    s = series("a", [5.0, 1.0, 3.0])
    assert (s.median, s.min, s.max) == (3.0, 1.0, 5.0)


def test_median_of_an_even_count_is_the_mean_of_the_middle_two():
    s = series("a", [10.0, 1.0, 3.0, 2.0])
    assert s.median == 2.5
    assert (s.min, s.max) == (1.0, 10.0)


def test_a_series_without_repeats_has_no_figures():
    s = series("a", [])
    assert (s.median, s.min, s.max) == (None, None, None)


@pytest.mark.parametrize("subject, status", [(49.0, "MISSED"), (50.0, "met"), (51.0, "met")])
def test_a_lower_bound_is_met_at_the_bound_and_above(subject, status):
    t = h.Target("half", "s", "p", low=0.5)
    v = h.judge(t, by_key(series("s", [subject]), series("p", [100.0])))
    assert v["status"] == status
    assert v["value"] == subject / 100.0


@pytest.mark.parametrize("subject, status", [(74.0, "met"), (75.0, "met"), (76.0, "MISSED")])
def test_an_upper_bound_is_met_at_the_bound_and_below(subject, status):
    v = h.judge(h.Target("three quarters", "s", "p", high=0.75), by_key(series("s", [subject]), series("p", [100.0])))
    assert v["status"] == status


@pytest.mark.parametrize("subject, status", [(0.94, "MISSED"), (0.95, "met"), (1.05, "met"), (1.06, "MISSED")])
def test_a_band_holds_both_ends(subject, status):
    t = h.Target("within 5 %", "s", "p", low=0.95, high=1.05)
    v = h.judge(t, by_key(series("s", [subject * 4]), series("p", [4.0])))
    assert v["status"] == status


def test_a_target_is_judged_on_medians_not_means():
    # median 10 against 10 meets 0.9x; the mean (7) would miss it
    v = h.judge(h.Target("t", "s", "p", low=0.9), by_key(series("s", [10.0, 10.0, 1.0]), series("p", [10.0])))
    assert (v["status"], v["value"]) == ("met", 1.0)


def test_invert_judges_a_speed_up_peer_over_subject():
    v = h.judge(h.Target("2x faster", "fast", "slow", low=2.0, invert=True),
                by_key(series("fast", [1.0, 1.5, 2.0]), series("slow", [4.0, 3.0, 3.5])))
    assert v["value"] == 3.5 / 1.5
    assert v["status"] == "met"


def test_paired_takes_the_median_of_per_repeat_ratios():
    s, p = series("s", [1.0, 4.0, 9.0]), series("p", [2.0, 2.0, 9.0])  # pairs 0.5, 2, 1; medians 4 / 2 = 2
    paired = h.judge(h.Target("band", "s", "p", low=0.95, high=1.05, paired=True), by_key(s, p))
    plain = h.judge(h.Target("band", "s", "p", low=0.95, high=1.05), by_key(s, p))
    assert (paired["value"], paired["status"]) == (1.0, "met")
    assert (plain["value"], plain["status"]) == (2.0, "MISSED")


def test_paired_falls_back_to_medians_when_the_counts_differ():
    v = h.judge(h.Target("band", "s", "p", paired=True), by_key(series("s", [1.0, 4.0, 9.0]), series("p", [2.0])))
    assert v["value"] == 2.0


def test_an_absolute_bound_on_the_worst_repeat():
    s = series("rss", [10.0, 90.0, 20.0])
    worst = h.judge(h.Target("rss", "rss", high=80.0, worst=True, shown="{:.1f} MiB"), by_key(s))
    median = h.judge(h.Target("rss", "rss", high=80.0), by_key(s))
    assert (worst["status"], worst["value"], worst["detail"]) == ("MISSED", 90.0, "90.0 MiB")
    assert (median["status"], median["value"]) == ("met", 20.0)


@pytest.mark.parametrize("present", [{}, {"s": [1.0]}, {"p": [1.0]}, {"s": [], "p": [1.0]}, {"s": [1.0], "p": [0.0]}])
def test_without_both_figures_a_target_is_not_measured(present):
    v = h.judge(h.Target("t", "s", "p", low=0.0), by_key(*(series(k, x) for k, x in present.items())))
    assert v["status"] == "not measured"
    assert v["value"] is None and "detail" not in v


@pytest.mark.parametrize("condition, residency, verified", [
    ("hot", [0.95, 1.0], True), ("hot", [1.0, 0.94], False), ("hot", [], False),
    ("cold", [0.0, 0.05], True), ("cold", [0.06], False), ("memory", [], True)])
def test_hot_and_cold_need_the_residency_they_name(condition, residency, verified):
    assert series("a", [1.0], condition, residency=residency).verified is verified


def test_an_unconfirmed_cache_state_is_said_in_the_label_and_the_verdict():
    s = series("s", [2.0], "hot", residency=[1.0, 0.4])
    assert s.condition_label() == "hot? NOT VERIFIED (residency 0.40)"
    v = h.judge(h.Target("t", "s", "p", low=1.0), by_key(s, series("p", [1.0], "hot", residency=[1.0])))
    assert (v["status"], v["value"]) == ("not verified (cache state)", 2.0)


def test_a_failed_check_is_not_judged_met():
    s = Checked("s", "memory", "s", samples=[2.0], passed=False)
    v = h.judge(h.Target("t", "s", "p", low=1.0), by_key(s, series("p", [1.0])))
    assert v["status"] == "FAILED its check"


def test_fmt():
    assert h.fmt(None) == "—"
    assert h.fmt(1.234) == "1.23"
    assert h.fmt(1.25, 1, "MiB") == "1.2 MiB"
    assert h.fmt(0.1234, 3) == "0.123"


def test_the_series_table_shows_median_and_spread_of_each_row():
    rows = h.series_table([series("a", [1.234, 3.75, 2.5]), series("b", [])],
                          ("condition", "what", "GB/s (median)", "min–max", "ratio"),
                          lambda s: f"tool {s.key}", lambda s, v: h.fmt(v), lambda s: [f"r{s.key}"])
    assert rows[0] == "| condition | what | GB/s (median) | min–max | ratio |"
    assert rows[1] == "|---|---|---:|---|---|"
    assert rows[2] == "| memory | tool a | 2.50 | 1.23–3.75 | ra |"
    assert rows[3] == "| memory | tool b | — | — | rb |"


def test_the_targets_section_carries_each_status_and_figure():
    verdicts = [h.judge(h.Target("fast enough", "s", "p", low=1.0, shown="{:.3f}×"),
                        by_key(series("s", [3.0]), series("p", [2.0]))),
                h.judge(h.Target("never ran", "x", "p"), by_key(series("p", [2.0])))]
    assert h.targets_section(verdicts) == ["", "## Targets", "", "- met: fast enough (1.500×)",
                                           "- not measured: never ran"]


def test_write_outputs_writes_the_report_and_the_record(tmp_path, monkeypatch):
    monkeypatch.setattr(h, "OUT_DIR", str(tmp_path / "out"))
    h.write_outputs("x_bench", "# report\n\n| 2.50 |\n", {"median": 2.5, "path": tmp_path})
    assert (tmp_path / "out" / "x_bench.md").read_text() == "# report\n\n| 2.50 |\n"
    assert json.loads((tmp_path / "out" / "x_bench.json").read_text()) == {"median": 2.5, "path": str(tmp_path)}


def test_the_preface_lists_every_machine_fact_under_one_date():
    assert h.preface("2026-01-01", {"date": "2026-01-02", "cpu_count": 2, "fio": "fio-3.33"}) == [
        "Date: 2026-01-01", "", "Machine:", "", "- cpu_count: 2", "- fio: fio-3.33", ""]


def test_machine_is_the_env_snapshot_plus_the_bench_facts(tmp_path):
    m = h.machine(str(tmp_path), fio="/nonexistent/fio")
    assert set(env.snapshot(str(tmp_path))) <= set(m)
    assert m["fio"].startswith("unknown (/nonexistent/fio")
    assert "crc32c_kernel" in m
    assert "fio" not in h.machine(str(tmp_path))


def test_missing_names_what_to_install():
    assert h.missing("x_bench", executables=("sh",), modules=("json",)) is None
    assert h.missing("x_bench", executables=("no-such-tool-here",)) == (
        "x_bench: no-such-tool-here not found; install it with `apt-get install no-such-tool-here`")
    line = h.missing("x_bench", modules=("json", "no_such_module_here"))
    assert line == ("x_bench: missing Python package(s) no_such_module_here; install with "
                    "`pip install no_such_module_here`")
    assert h.missing("x_bench", modules=("no_such_module_here",), install="pip install -e .[s3]").endswith(
        "`pip install -e .[s3]`")


def test_a_missing_fastio_says_to_build_it(monkeypatch):
    monkeypatch.setattr(h, "_importable", lambda m: m != "fastio")
    assert h.missing("x_bench", modules=("json", "fastio")) == (
        "x_bench: fastio is not built; run `make build` in the repo root")


def test_a_shape_counts_and_describes_its_file_set():
    s = h.Shape(8, 32 << 20, 100, 64 << 10)
    assert (s.files, s.total) == (108, 8 * (32 << 20) + 100 * (64 << 10))
    assert s.describe() == "8 × 32 MiB + 100 × 64 KiB = 262 MiB"


def test_cache_dir_and_child_env(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert h.cache_dir("bench-read") == os.path.join(str(tmp_path), "ckptbench", "bench-read")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    assert h.child_env()["PYTHONPATH"].split(os.pathsep) == [h.ROOT, "/elsewhere"]


def test_rotation_puts_each_item_first_once_per_cycle_and_keeps_the_cycle():
    items = ["ckptbench", "safetensors", "fastsafetensors", "runai"]
    orders = [h.rotated(items, i) for i in range(len(items))]
    assert sorted(o[0] for o in orders) == sorted(items)
    for o in orders:
        k = o.index("ckptbench")
        assert o[k:] + o[:k] == items
    assert h.rotated(items, len(items)) == items
    assert h.rotated([], 3) == []


def test_make_hot_leaves_the_files_resident_and_make_cold_says_what_is_left(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(1 << 20))
    assert h.make_hot([str(path)]) >= h.HOT_MIN
    assert 0.0 <= h.make_cold([str(path)]) <= 1.0
    assert h.disk_read_bytes() >= 0 and h.disk_read_bytes(children=True) >= 0


@pytest.mark.parametrize("condition, residency, ok", [
    ("hot", 0.95, True), ("hot", 0.9499, False), ("hot", None, False),
    ("cold", 0.05, True), ("cold", 0.0501, False), ("cold", None, False)])
def test_a_cache_condition_holds_within_its_residency_bound(condition, residency, ok):
    assert h.held(condition, residency) is ok
