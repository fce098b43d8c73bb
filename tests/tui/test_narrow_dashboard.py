"""The dashboard in an 80x24 terminal, the size many terminals open at: every key the footer shows fits (help and
quit were cut off after "e Rea"), the settings line wraps rather than cutting off the hash setting, and the title
bar gives its row to the figures."""

from __future__ import annotations

from textual.widgets import Footer, Header, Static
from textual.widgets._footer import FooterKey, FooterLabel

from ckptbench.restore.runner import RunOptions
from tui.app import CkptbenchApp
from tui.screens.dashboard import Dashboard


def app():
    a = CkptbenchApp(None, RunOptions.make(concurrency=16, cache="cold"), results_path="/nonexistent/results.csv")
    a.animation_level = "none"
    return a


async def test_at_80_by_24_every_footer_key_and_every_setting_shows():
    a = app()
    async with a.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        dash = a.screen
        assert isinstance(dash, Dashboard) and dash.has_class("-short")
        keys = list(dash.query_one(Footer).query(FooterKey))
        shown = {k.key for k in keys}
        assert {"r", "x", "plus", "minus", "c", "m", "o", "e", "a", "k", "s", "h", "question_mark", "q"} <= shown, shown
        for w in [*keys, *dash.query_one(Footer).query(FooterLabel)]:
            assert w.region.right <= 80 and w.region.width > 0, (w, w.region)
        settings = dash.query_one("#settings", Static)
        assert settings.region.height == 2 and "hash" in str(settings.render())  # wrapped, not cut
        assert not dash.query_one(Header).display  # the title bar's row goes to the figures
        # a taller terminal has its title bar back
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert not dash.has_class("-short") and dash.query_one(Header).display
        assert dash.query_one("#settings", Static).region.height == 1
