"""A new user's pass over the TUI (round 8): the sweep screen reads as `ckptbench sweep` reads, the help and the
dashboard's keys stay readable in an 80x24 terminal."""

from __future__ import annotations

from textual.widgets import Static

from ckptbench.sources import ReadOptions
from test_floor_dashboard import _held_s, floor_cached, stage_text  # noqa: F401  (a fixture)
from tui.screens.help import HelpScreen
from tui.screens.sweep import SweepScreen


def _spy_sweep(monkeypatch) -> list[ReadOptions]:
    """Records the ReadOptions each sweep is given, and runs the real one."""
    import ckptbench.restore.sweep as sweep_mod

    seen: list[ReadOptions] = []
    real = sweep_mod.sweep

    def spy(source, levels, *, opts=None, **kw):
        seen.append(opts)
        return real(source, levels, opts=opts, **kw)

    monkeypatch.setattr(sweep_mod, "sweep", spy)
    return seen


async def test_the_sweep_screen_reads_the_way_ckptbench_sweep_does(make_app, small_ckpt, monkeypatch, h):
    # it read pread, "as asked", where nobody asked: the dashboard's read was auto and `ckptbench sweep` read direct
    seen = _spy_sweep(monkeypatch)
    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("s")
        screen = app.screen
        assert isinstance(screen, SweepScreen)
        await h.wait_until(pilot, lambda: screen.result is not None, "the sweep to finish", 60)
        await pilot.pause()
        summary = h.text_of(screen.query_one("#sweep-summary", Static))
    (opts,) = seen
    assert opts is not None and opts.read == "auto" and opts.hash == "none", opts
    assert "as asked" not in summary, summary


async def test_the_sweep_screen_reads_with_the_read_mode_the_dashboard_set(make_app, small_ckpt, monkeypatch, h):
    seen = _spy_sweep(monkeypatch)
    app = make_app(small_ckpt, read="mmap")
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("s")
        screen = app.screen
        await h.wait_until(pilot, lambda: screen.result is not None, "the sweep to finish", 60)
        await pilot.pause()
        summary = h.text_of(screen.query_one("#sweep-summary", Static))
    assert seen[0].read == "mmap", seen
    assert "read path mmap (as asked)" in summary, summary


async def test_the_help_fits_an_80x24_terminal(make_app, small_ckpt, h):
    # it was 90 columns wide whatever the terminal: at 80 every long line lost its end ("cache (as-is/cold/hot",
    # "sha256,", "against the li", "--jso")
    from tui.screens.help import HELP

    app = make_app(small_ckpt)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        box = app.screen.query_one("#help", Static)
        assert box.region.right <= 80 and box.region.bottom <= 24, box.region
        shown = "\n".join(line.rstrip() for line in box.render().plain.splitlines())
        for word in ("(as-is/cold/hot)", "sha256, none)", "against the limits", "sysinfo --json", "escape closes"):
            assert word in " ".join(shown.split()), (word, shown)
        assert box.content_region.width >= max(len(x) for x in HELP.splitlines() if "[b]" not in x), \
            "a key's line wraps under the next key's column"


async def test_the_live_figures_are_all_on_screen(make_app, small_ckpt, h):
    # the figures had two rows whatever the width: beside the system panel the left column is 72 wide in a
    # 120-column terminal (34 in 80), the first row (88 columns) wrapped into the second and workers, errors and
    # retries were cut off
    from tui.screens.dashboard import Dashboard

    app = make_app(small_ckpt)
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        assert isinstance(dash, Dashboard)
        await pilot.press("r")
        await app.workers.wait_for_complete()
        await h.wait_until(pilot, lambda: not dash.running, "the run to end")
        await pilot.pause()
        figures = dash.query_one("#figures", Static)
        text = h.text_of(figures)
        assert "retries 0" in text and "latency p50" in text, text
        width = figures.content_region.width
        needed = figures.get_content_height(figures.content_region.size, app.size, width)
        assert needed <= figures.content_region.height, (needed, figures.content_region, text)
        left = dash.query_one("#left")
        assert figures.region.bottom <= left.region.bottom, (figures.region, left.region)


async def test_the_efficiency_after_a_run_names_the_time_it_is_over(make_app, small_ckpt, floor_cached, h):
    # it said "efficiency 91 % (floor / RTO)" beside "floor 0.203 s" and "RTO 0.302s" (67 %): the run's efficiency
    # is over the RTO less the model's first step, as `ckptbench run` and `history` say it
    app = make_app(small_ckpt, cache="cold")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        await h.wait_until(pilot, lambda: "bound by" in stage_text(dash), "the floor before a run")
        await h.run_once(pilot, app)
        await h.wait_until(pilot, lambda: "efficiency" in stage_text(dash), "the run's efficiency")
        await pilot.pause()
        doc = app.session.doc
        text = " ".join(stage_text(dash).split())
    assert doc["check"] == "model step" and doc["efficiency"], doc["check"]
    assert "(floor / RTO)" not in text, text
    assert f"(floor / the RTO less the model's first step, {_held_s(doc):.3f} s)" in text, text
