"""New-user pass 16, the dashboard: history shows each run's efficiency as `ckptbench history` says it; a restore
that was not verified says so under its RTO, not only in a toast; the settings line names the digest the verify
stage computes and what it is checked against (nothing, without a manifest); the throughput chart's axis runs from 0.

Expected values come from the test's own numbers and the files (results.csv read with csv), or from the CLI's own
line for the same record, never from the widgets' code alone."""

from __future__ import annotations

import json
import os
import shutil

from rich.text import Text
from textual.app import App
from textual.widgets import DataTable, Static

from ckptbench.cli.history import run_line
from ckptbench.records.history import runs
from tui.screens.dashboard import Dashboard
from tui.screens.history import HistoryScreen, efficiency_cell
from tui.widgets.chart import ThroughputChart
from tui.widgets.stagebar import StageBar

OVER = "(over the floor: a ceiling measured low)"  # the CLI's mark, as tests/ckptbench/test_newuser15_records.py has it


async def restore_once(app, pilot, h) -> None:
    """r, and wait until the dashboard has handled the end of the run."""
    dash = app.screen
    assert isinstance(dash, Dashboard)
    before = len(h.read_results(app.results_path))
    await pilot.press("r")
    await app.workers.wait_for_complete()
    await h.wait_until(pilot, lambda: not dash.running and len(h.read_results(app.results_path)) > before,
                       "the run to end")
    await pilot.pause()


def without_manifest(small_ckpt, tmp_path) -> str:
    dst = shutil.copytree(small_ckpt, tmp_path / "no-manifest")
    os.remove(os.path.join(dst, "ckptbench.json"))
    return str(dst)


def set_efficiencies(path: str, by_run: dict[str, float]) -> None:
    """The run documents rewritten as a run with a floor leaves them: a floor and an efficiency (the tests' own cache
    directory has no floor, so a run records none)."""
    jsonl = path + ".jsonl"
    with open(jsonl) as f:
        docs = [json.loads(line) for line in f]
    with open(jsonl, "w") as f:
        for d in docs:
            if d.get("record") == "run" and d["run_id"] in by_run:
                d |= {"floor_s": 0.01, "efficiency": by_run[d["run_id"]]}
            f.write(json.dumps(d) + "\n")


def column(table: DataTable, label: str) -> list[str]:
    """A column's cells as they read on screen (a string cell is markup to the table)."""
    keys = [k for k, c in table.columns.items() if str(c.label) == label]
    assert keys, [str(c.label) for c in table.columns.values()]
    at = list(table.columns).index(keys[0])
    return [Text.from_markup(str(table.get_cell_at((i, at)))).plain for i in range(table.row_count)]


# -- 1. history: the efficiency, as the CLI says it --------------------------------------------------------------


async def test_history_shows_the_efficiency_as_the_cli_and_marks_one_past_the_floor(make_app, small_ckpt, h):
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        await restore_once(app, pilot, h)
        await restore_once(app, pilot, h)
        rows = h.read_results(app.results_path)
        ids = list(dict.fromkeys(r["run_id"] for r in rows))
        set_efficiencies(app.results_path, {ids[0]: 0.42, ids[1]: 1.5})
        await pilot.press("h")
        screen = app.screen
        assert isinstance(screen, HistoryScreen)
        table = screen.query_one("#runs", DataTable)
        cells = column(table, "efficiency")
        assert cells[0].startswith("42 % of ") and OVER not in cells[0], cells
        assert cells[1].startswith(f"150 % {OVER} of "), cells
        # over the RTO less the model's first step, as the CLI says beside the RTO: the table's RTO would not divide
        for cell, row in zip(cells, rows):
            held = float(row["rto_s"]) - float(row["check_s"])
            assert cell.endswith(f"of {held:.3f} s (the RTO less the model's first step)"), cell
        # the CLI's line for the same record says the same words
        for cell, r in zip(cells, runs(app.results_path)):
            assert f"efficiency {cell.split(' of ')[0]}  " in run_line(r), (cell, run_line(r))


async def test_history_shows_a_bracketed_source_as_it_is(make_app, small_ckpt, tmp_path, h):
    ck = tmp_path / "ck[/x]"  # a folder "ck[" holding "x]": a table cell is markup, and "[/x]" raised in the screen
    shutil.copytree(small_ckpt, ck)
    app = make_app(str(ck))
    async with app.run_test(size=h.SIZE) as pilot:
        await restore_once(app, pilot, h)
        await pilot.press("h")
        assert isinstance(app.screen, HistoryScreen)
        assert column(app.screen.query_one("#runs", DataTable), "source") == [str(ck)]


def test_an_efficiency_over_a_saves_time_names_it_and_none_is_a_dash():
    save = {"efficiency": 0.8, "figure": "durable_s", "figure_s": 2.5, "held_s": None, "steady": True}
    assert efficiency_cell(save) == "80 % of durable after the first save 2.500 s"
    assert efficiency_cell(save | {"efficiency": None}) == "-"


# -- 2. a restore not verified says so where its RTO is ----------------------------------------------------------


async def test_a_restore_without_a_manifest_says_not_verified_under_its_rto(make_app, small_ckpt, tmp_path, h):
    app = make_app(without_manifest(small_ckpt, tmp_path))
    async with app.run_test(size=h.SIZE) as pilot:
        await restore_once(app, pilot, h)
        assert h.read_results(app.results_path)[-1]["status"] == "unverified"
        bar = app.screen.query_one("#stages", StageBar)
        lines = h.text_of(bar).splitlines()
        rto = next(i for i, line in enumerate(lines) if line.startswith(" RTO "))
        assert lines[rto + 1].startswith(" NOT VERIFIED: no manifest"), lines
        assert bar.content_region.height >= len(lines), (bar.content_region, lines)  # on screen, not cut off
        app.clear_notifications()  # the toast goes; the stage box keeps saying it
        await pilot.pause()
        assert "NOT VERIFIED" in h.text_of(bar)


async def test_a_verified_restore_says_nothing_of_the_kind_and_a_new_run_clears_it(make_app, small_ckpt, h):
    app = make_app(small_ckpt, hash="none")  # the manifest's is crc32c: nothing is checked
    async with app.run_test(size=h.SIZE) as pilot:
        await restore_once(app, pilot, h)
        bar = app.screen.query_one("#stages", StageBar)
        assert " NOT VERIFIED: --hash none is not the manifest's crc32c" in h.text_of(bar)
        app.update_opts(hash=None)
        await restore_once(app, pilot, h)
        assert h.read_results(app.results_path)[-1]["status"] == "ok"
        assert "NOT VERIFIED" not in h.text_of(bar)


# -- 3. the settings line says what verify does ------------------------------------------------------------------


async def test_the_hash_setting_says_there_is_no_manifest_to_check_against(make_app, small_ckpt, tmp_path, h):
    app = make_app(without_manifest(small_ckpt, tmp_path))
    async with app.run_test(size=h.SIZE) as pilot:
        settings = app.screen.query_one("#settings", Static)
        await h.wait_until(pilot, lambda: "no manifest" in h.text_of(settings), "the source to be listed")
        assert "hash none (NOT VERIFIED: no manifest)" in h.text_of(settings)
        assert "hash manifest" not in h.text_of(settings)


async def test_the_hash_setting_names_the_manifests_digest_and_a_mismatch(make_app, small_ckpt, h):
    with open(os.path.join(small_ckpt, "ckptbench.json")) as f:
        digest = json.load(f)["hash"]  # what gen wrote
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        settings = app.screen.query_one("#settings", Static)
        await h.wait_until(pilot, lambda: "manifest's)" in h.text_of(settings), "the source to be listed")
        assert f"hash {digest} (the manifest's)" in h.text_of(settings)
        other = next(x for x in ("md5", "crc32c") if x != digest)
        app.update_opts(hash=other)
        app.screen.show_settings()
        assert f"hash {other} (NOT VERIFIED: --hash {other} is not the manifest's {digest})" in h.text_of(settings)


# -- 4. the throughput chart's axis runs from 0 ------------------------------------------------------------------


class ChartApp(App):
    CSS = "ThroughputChart { width: 60; height: 12; }"

    def compose(self):
        yield ThroughputChart()


async def test_a_flat_run_fills_the_chart_from_zero():
    app = ChartApp()
    async with app.run_test(size=(80, 20)) as pilot:
        chart = app.query_one(ThroughputChart)
        for i in range(40):  # 2.0-2.1 GB/s: flat, a 5 % wobble
            chart.add_sample(float(i), 2.0 + (i % 3) * 0.05, peak=2.1)
        await pilot.pause()
        lines = chart.render().plain.splitlines()[:-1]  # the rows, not the axis line
        labels = [line[:7].strip() for line in lines]
        assert labels[0] == "2.10" and labels[-1] == "0.00", labels  # the bottom row's label is where the axis starts
        assert all(not x for x in labels[1:-1]), labels
        bars = [line[7:] for line in lines]
        drawn = [c for c in range(len(bars[0])) if bars[-1][c] != " "]
        assert drawn
        for c in drawn:  # every sample reaches above 95 % of the height: no cliff
            assert all(row[c] == "█" for row in bars[1:]), [row[c] for row in bars]
