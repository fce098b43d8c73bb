"""Error text and paths on screen are text, never markup: an error naming "ckpt[/bold]" went to notify() as markup,
and the toast raised MarkupError when it rendered, taking the app down (the Pilot tests never saw it: run_test hides
notifications unless asked). These run with notifications shown, as a user has them."""

from __future__ import annotations

import subprocess
import sys

from textual.widgets import Label, Static
from textual.widgets._toast import Toast

from tui.watch_app import WatchApp


def _toasts(app) -> list[str]:
    return [str(t.render()) for t in app.screen.query(Toast)]


async def test_a_watch_error_naming_a_bracketed_path_is_shown_as_it_is(tmp_path, h):
    source = tmp_path / "ckpt[/bold]"  # not there: the watch fails naming it once the job has ended
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    app = WatchApp(proc.pid, proc=proc, interval=0.1, source=str(source))
    try:
        async with app.run_test(size=h.SIZE, notifications=True) as pilot:
            verdict = app.screen.query_one("#watch-verdict", Static)
            await h.wait_until(pilot, lambda: "watch failed" in h.text_of(verdict), "the watch to fail", 60)
            assert f"watch failed: {source}: no such directory" in h.text_of(verdict)
            await h.wait_until(pilot, lambda: _toasts(app), "the error's toast")
            await pilot.pause(0.2)  # drawn, not only mounted
            assert any(f"{source}: no such directory" in t for t in _toasts(app)), _toasts(app)
            assert app.is_running
    finally:
        proc.kill()
        proc.wait()


async def test_a_restore_failure_and_the_save_prompt_show_a_bracketed_path_as_it_is(make_app, tmp_path, h):
    import torch
    from safetensors.torch import save_file

    ck = tmp_path / "bad[/bold]"  # a folder "bad[" holding "bold]"
    ck.mkdir(parents=True)
    save_file({"w": torch.ones(1 << 20)}, str(ck / "model.safetensors"))
    with open(ck / "model.safetensors", "r+b") as f:
        f.truncate(1 << 20)
    app = make_app(str(ck))
    async with app.run_test(size=h.SIZE, notifications=True) as pilot:
        await pilot.press("r")
        await h.wait_until(pilot, lambda: [m for m, s in app.notes if s == "error"], "the failure's toast")
        await pilot.pause(0.2)
        assert any("bad[/bold]" in t for t in _toasts(app)), _toasts(app)
        await pilot.press("w")  # the save prompt names the source
        await h.wait_until(pilot, lambda: app.screen.query(Label), "the save prompt")
        assert f"Save {ck} into" in str(app.screen.query_one(Label).render())
        assert app.is_running


async def test_the_save_screen_shows_a_bracketed_target_and_its_failure_as_they_are(make_app, tmp_path, h):
    from ckptbench.save.report import SaveOptions
    from tui.screens.save import SaveScreen

    blocker = tmp_path / "in[/bold]"  # a folder "in[" holding a file "bold]"
    blocker.parent.mkdir()
    blocker.write_text("a file where the target's parent should be")  # the save fails naming the target
    app = make_app(None)
    async with app.run_test(size=h.SIZE, notifications=True) as pilot:
        screen = SaveScreen("small", str(blocker / "saves"), SaveOptions(count=1), scale=0.02)
        await app.push_screen(screen)
        summary = screen.query_one("#save-summary", Static)
        await h.wait_until(pilot, lambda: "failed" in h.text_of(summary), "the save to fail", 120)
        assert f"saving small → {blocker / 'saves'}" in h.text_of(screen.query_one("#save-what", Static))
        assert "in[/bold]" in h.text_of(summary)
        await h.wait_until(pilot, lambda: _toasts(app), "the error's toast")
        await pilot.pause(0.2)
        assert any("in[/bold]" in t for t in _toasts(app)) and app.is_running
