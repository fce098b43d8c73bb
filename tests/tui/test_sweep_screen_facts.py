"""The sweep screen says what `ckptbench sweep` says of the same sweep, from the sweep's own result: the read path
and why (pread, direct or mmap: a level read with O_DIRECT and one through the page cache are not one measurement),
the hash, and each level's efficiency against this box's floor with what binds it; with no floor measured, that."""

from __future__ import annotations

from textual.widgets import Static

from ckptbench.core.units import human_pct
from ckptbench.system import binding, readmode
from ckptbench.system.floor import SMALL_SWEEP_WHY, says_little
from test_floor_dashboard import STORAGE_GBPS, floor_cached, no_floor  # noqa: F401  (fixtures)
from tui.screens.sweep import LEVELS, SweepScreen


async def _swept(app, pilot, h) -> tuple[dict, str, str]:
    """(the sweep's result, the chart's text, the summary's text) once the sweep screen's sweep has finished."""
    await pilot.press("s")
    screen = app.screen
    assert isinstance(screen, SweepScreen)
    await h.wait_until(pilot, lambda: screen.result is not None, "the sweep to finish", 60)
    await pilot.pause()
    return (screen.result, h.text_of(screen.query_one("#sweep-chart", Static)),
            h.text_of(screen.query_one("#sweep-summary", Static)))


def _level_line(chart: str, level: int) -> str:
    (line,) = [x for x in chart.splitlines() if x.split("│")[0].strip() == str(level)]
    return line


async def test_the_sweep_screen_names_the_read_path_and_each_levels_share_of_the_floor(make_app, small_ckpt,
                                                                                       floor_cached, h):
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        res, chart, summary = await _swept(app, pilot, h)
        assert res["read"] in ("pread", "direct", "mmap") and res["read_why"]
        assert f"read path {res['read']} ({readmode.short(res['read_why'])})" in summary, summary
        assert f"hash {res['hash']}" in summary, summary
        assert res["binding_gbps"] == STORAGE_GBPS  # the floor planted: a cold read is bound by storage
        assert f"bound by {binding.text(res)}" in summary and "floor: " in summary, summary
        effs = res["efficiency_by_level"]
        for lv in LEVELS:
            assert f"{human_pct(effs[lv])} of the floor" in _level_line(chart, lv), chart
        # about 18 MiB at the planted 2 GB/s: a floor under the fixed costs, where `ckptbench sweep` adds that its
        # knee is no storage's; the screen recommended the same knee bare
        assert says_little(res["floor_s"]), res["floor_s"]
        assert SMALL_SWEEP_WHY in summary, summary


async def test_with_no_floor_the_sweep_screen_says_so(make_app, small_ckpt, no_floor, h):
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        res, chart, summary = await _swept(app, pilot, h)
        assert res.get("floor_s") is None and res["floor_note"]
        assert f"floor: {res['floor_note']}" in summary, summary
        assert f"read path {res['read']}" in summary, summary
        assert "of the floor" not in chart, chart
