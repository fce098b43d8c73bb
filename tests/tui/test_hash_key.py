"""The dashboard's `a` key cycles the digest a restore computes: every press changes it (and the settings line that
names it), the first one included; a full round visits each digest once and comes back to the manifest's."""

from __future__ import annotations

from textual.widgets import Static

from ckptbench.core import options
from ckptbench.restore.efficiency import hash_of
from tui.screens.dashboard import Dashboard


async def test_every_press_of_a_changes_the_digest_the_first_included(make_app, small_ckpt, h):
    app = make_app(small_ckpt)  # gen's manifest holds crc32c digests; --hash unset: the manifest's
    async with app.run_test(size=h.SIZE) as pilot:
        dash = app.screen
        assert isinstance(dash, Dashboard)
        await h.wait_until(pilot, lambda: dash.listing is not None, "the source listed")
        await pilot.pause()
        settings = dash.query_one("#settings", Static)
        assert "hash crc32c (the manifest's)" in h.text_of(settings)
        seen = [hash_of(app.opts.hash, dash.listing)]
        lines = [h.text_of(settings)]
        for _ in options.HASHES:
            await pilot.press("a")
            seen.append(hash_of(app.opts.hash, dash.listing))
            lines.append(h.text_of(settings))
            assert seen[-1] != seen[-2] and lines[-1] != lines[-2], (seen, lines[-1])
        assert sorted(seen[:-1]) == sorted(options.HASHES)  # each digest once a round
        assert app.opts.hash is None and lines[-1] == lines[0]  # and back to the manifest's
