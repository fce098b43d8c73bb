"""The dashboard's RTO after a restore is the run's median RTO, as `run` and `history` give it for the same run, and
each stage's share is over it as in `run`'s table: the sum of the stages' medians read 0.080 s on the screen where
history said 0.081 s."""

from __future__ import annotations

from ckptbench.core.units import human_pct
from ckptbench.records.history import runs
from tui.screens.dashboard import Dashboard
from tui.widgets.stagebar import StageBar


async def test_the_rto_shown_is_the_one_history_gives(make_app, small_ckpt, h):
    app = make_app(small_ckpt, cache="hot")
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        assert isinstance(dash, Dashboard)
        await pilot.press("r")
        await app.workers.wait_for_complete()
        await h.wait_until(pilot, lambda: not dash.running and h.read_results(app.results_path), "the run to end")
        await pilot.pause()
        row = h.read_results(app.results_path)[-1]
        rto = runs(app.results_path)[-1]["rto_s"]
        assert rto == float(row["rto_s"])
        bar = dash.query_one("#stages", StageBar)
        assert bar.rto == rto
        text = h.text_of(bar)
        assert f" RTO {rto:.3f}s" in text, text
        read = float(row["read_s"])
        assert f" read {read:.3f}s {human_pct(read / rto)} " in text, text  # run's share: over the RTO


async def test_the_history_screen_says_a_save_did_not_fsync(make_app, small_ckpt, tmp_path, h):
    import contextlib
    import io

    from rich.text import Text
    from textual.widgets import DataTable

    from ckptbench.cli import root as cli
    from tui.screens.history import HistoryScreen

    app = make_app(small_ckpt)
    for extra in ((), ("--no-fsync",)):
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert cli.main(["save", small_ckpt, str(tmp_path / "t"), "--count", "2", "--results", app.results_path,
                             *extra]) == 0
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("h")
        await pilot.pause()
        assert isinstance(app.screen, HistoryScreen)
        table = app.screen.query_one("#runs", DataTable)
        at = [str(c.label) for c in table.columns.values()].index("mode")
        modes = [Text.from_markup(str(table.get_cell_at((i, at)))).plain for i in range(table.row_count)]
        assert modes == ["sync", "sync, no fsync"], modes
