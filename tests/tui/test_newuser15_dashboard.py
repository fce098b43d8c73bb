"""New-user pass 15, the dashboard's header: a path is shown as text, never read as markup."""

from __future__ import annotations

import shutil


async def test_a_source_path_with_brackets_is_shown_as_it_is(make_app, small_ckpt, tmp_path, h):
    ck = tmp_path / "[red]ck[/red]"
    shutil.copytree(small_ckpt, ck)
    app = make_app(str(ck))
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.pause()
        header = str(app.screen.query_one("#source").render())
        assert str(ck) in header and " files, " in header, header
