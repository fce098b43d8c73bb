"""The save screen (w on the dashboard): real saves by ckptbench.save.series in its worker, cancelled with x, a failure
as a notification; and an SVG snapshot fed real WritebackSample and SaveTiming objects with fixed numbers."""

from __future__ import annotations

import os

from textual.widgets import DataTable, Input, Static

from ckptbench.save.report import SaveOptions, SaveTiming
from ckptbench.system.writeback import WritebackSample
from tui.messages import SaveFinished, SaveTimed
from tui.screens.prompt import TextPrompt
from tui.screens.save import SaveScreen
from tui.widgets.chart import ThroughputChart
from tui.widgets.dirtychart import DirtyChart

MIB, GIB = 1 << 20, 1 << 30


def steps(target) -> list[str]:
    return sorted(n for n in os.listdir(target) if n.startswith("step-"))


async def test_saves_fill_the_table_charts_and_summary(make_app, tmp_path, h):
    app = make_app(None)
    target = tmp_path / "saves"
    async with app.run_test(size=h.SIZE) as pilot:
        screen = SaveScreen("small", str(target), SaveOptions(count=2, keep=1), scale=0.02)
        await app.push_screen(screen)
        await h.wait_until(pilot, lambda: screen.report is not None or not screen.saving, "the saves to end",
                           timeout=120)
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert screen.report is not None, h.text_of(screen.query_one("#save-summary", Static))
        table = screen.query_one("#save-table", DataTable)
        assert table.row_count == 2 and [t.index for t in screen.timings] == [1, 2]
        row = table.get_row_at(1)
        assert row[1] == screen.timings[1].name and row[5] == f"{screen.timings[1].durable_s:.3f}"
        assert len(screen.report["saves"]) == 2
        dirty = screen.query_one("#save-dirty", DirtyChart)
        assert dirty.samples and dirty.samples[-1][3] == screen.report["samples"][-1]["dirty_limit_bytes"]
        assert "2 saves of" in h.text_of(screen.query_one("#save-summary", Static))
        assert steps(target) == [screen.timings[1].name]  # keep=1: the older save was pruned


async def test_w_asks_for_a_target_and_saves_the_source_directory(make_app, small_ckpt, tmp_path, h):
    app = make_app(small_ckpt)
    target = str(tmp_path / "from-source")
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("w")
        await h.wait_until(pilot, lambda: isinstance(app.screen, TextPrompt), "the target prompt")
        app.screen.query_one("#text", Input).value = target
        await pilot.press("enter")
        await h.wait_until(pilot, lambda: isinstance(app.screen, SaveScreen), "the save screen")
        screen = app.screen
        assert screen.what == small_ckpt and screen.target == target
        await h.wait_until(pilot, lambda: not screen.saving, "the saves to end", timeout=120)
        await app.workers.wait_for_complete()
        assert screen.report is not None and len(steps(target)) == SaveOptions().keep
        await pilot.press("escape")
        assert not isinstance(app.screen, SaveScreen)


async def test_escape_at_the_prompt_saves_nothing(make_app, h):
    app = make_app(None)
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("w")
        await h.wait_until(pilot, lambda: isinstance(app.screen, TextPrompt), "the target prompt")
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, (TextPrompt, SaveScreen))


async def test_x_cancels_between_saves(make_app, tmp_path, h):
    app = make_app(None)
    async with app.run_test(size=h.SIZE) as pilot:
        screen = SaveScreen("small", str(tmp_path / "saves"), SaveOptions(count=500, keep=1, interval_s=0.2),
                            scale=0.02)
        await app.push_screen(screen)
        await h.wait_until(pilot, lambda: screen.timings, "the first save", timeout=120)
        await pilot.press("x")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert not screen.saving and screen.report is None and len(screen.timings) < 500
        assert "cancelled" in h.text_of(screen.query_one("#save-summary", Static))


async def test_a_failing_save_is_a_notification_not_a_traceback(make_app, tmp_path, h):
    app = make_app(None)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    async with app.run_test(size=h.SIZE) as pilot:
        screen = SaveScreen("small", str(blocker / "saves"), SaveOptions(count=1), scale=0.02)
        await app.push_screen(screen)
        await app.workers.wait_for_complete()
        await h.wait_until(pilot, lambda: not screen.saving, "the failure")
        assert app.screen is screen and screen.report is None
        assert any(sev == "error" and str(blocker) in msg for msg, sev in app.notes), app.notes
        assert "failed" in h.text_of(screen.query_one("#save-summary", Static))


SAMPLES = [WritebackSample(t=i * 0.25, dirty_bytes=min(i, 12) * 150 * MIB, writeback_bytes=(i % 5) * 40 * MIB,
                           dirty_limit_bytes=4 * GIB, dirty_background_bytes=2 * GIB,
                           write_mbps=float(200 + (i * 37) % 900), util_pct=80.0, w_await_ms=3.0)
           for i in range(40)]
TIMINGS = [SaveTiming(1, "step-000001", 1600 * MIB, 2.5, 2.1, 3.4, False),
           SaveTiming(2, "step-000002", 1600 * MIB, 2.7, 2.2, 3.9, True)]
REPORT = {"saves": [{}, {}], "bytes": 1600 * MIB, "sustained_gbps": 0.47, "needed_gbps": 0.5,
          "shortest_safe_interval_s": 4.9, "dirty_peak_fraction": 0.44, "throttled": False, "notes": []}


def test_save_screen_snapshot(snap_compare, h):
    from ckptbench.restore.runner import RunOptions
    from tui.app import CkptbenchApp

    app = CkptbenchApp(None, RunOptions(), results_path="/nonexistent/results.csv")
    app.animation_level = "none"

    async def feed(pilot):
        screen = SaveScreen("small", "/data/saves", SaveOptions(count=2, interval_s=3.5), autostart=False)
        await pilot.app.push_screen(screen)
        for s in SAMPLES:
            screen.add_sample(s)
        for t in TIMINGS:
            screen.post_message(SaveTimed(t))
        screen.post_message(SaveFinished(REPORT))
        await pilot.pause()
        assert screen.query_one("#save-write", ThroughputChart).samples == [(s.t, s.write_mbps / 1000) for s in SAMPLES]
        assert screen.query_one("#save-dirty", DirtyChart).samples[-1] == (9.75, 12 * 150 * MIB, 4 * 40 * MIB,
                                                                           4 * GIB, 2 * GIB)

    assert snap_compare(app, terminal_size=h.SIZE, run_before=feed)


async def test_a_target_without_a_block_device_says_so_on_the_write_chart(make_app, h):
    app = make_app(None)
    async with app.run_test(size=h.SIZE) as pilot:
        screen = SaveScreen("small", "/data/saves", autostart=False)
        await app.push_screen(screen)
        screen.add_sample(WritebackSample(0.25, 10 * MIB, 0, 4 * GIB, 2 * GIB, None, None, None))
        await pilot.pause()
        chart = screen.query_one("#save-write", ThroughputChart)
        assert not chart.samples and "no block device under the target" in h.text_of(chart)
        assert screen.query_one("#save-dirty", DirtyChart).samples  # Dirty is the kernel's, known on any target
