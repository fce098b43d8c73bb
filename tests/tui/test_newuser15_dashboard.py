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


async def test_a_failure_naming_a_bracketed_path_is_shown_not_parsed(make_app, tmp_path, h):
    """The failure line names the file; "[/x]" in it was read as a closing tag and raised inside the screen."""
    import torch
    from safetensors.torch import save_file

    ck = tmp_path / "bad[/x]"  # a folder "bad[" holding "x]"
    ck.mkdir(parents=True)
    save_file({"w": torch.ones(1 << 20)}, str(ck / "model.safetensors"))
    with open(ck / "model.safetensors", "r+b") as f:
        f.truncate(1 << 20)
    app = make_app(str(ck))
    async with app.run_test(size=h.SIZE) as pilot:
        await pilot.press("r")
        figures = app.screen.query_one("#figures")
        await h.wait_until(pilot, lambda: "restore failed" in str(figures.render()), "the failure")
        assert "bad[/x]" in str(figures.render())
