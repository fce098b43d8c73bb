"""The dashboard's header kept the file count it measured at start (and after the last run that finished) when the
checkpoint folder was deleted or emptied meanwhile: it now says so in one line, without a run, and after a run that
failed for it."""

from __future__ import annotations

import os
import shutil


def _header(app, h) -> str:
    return h.text_of(app.screen.query_one("#source"))


async def test_a_deleted_source_folder_shows_as_gone(make_app, small_ckpt, tmp_path, h):
    ck = tmp_path / "ck"
    shutil.copytree(small_ckpt, ck)
    files = sum(len(names) for _, _, names in os.walk(ck))
    app = make_app(str(ck))
    async with app.run_test(size=h.SIZE) as pilot:
        await h.wait_until(pilot, lambda: f"{files} files" in _header(app, h), "the file count")
        shutil.rmtree(ck)
        await h.wait_until(pilot, lambda: "folder gone" in _header(app, h), "the header to say the folder is gone")
        assert _header(app, h) == f"{ck}  ·  folder gone: no such directory; point at a checkpoint directory"
        await pilot.press("r")  # the run fails for it, and the header stays as it is
        await h.wait_until(pilot, lambda: [m for m, s in app.notes if s == "error"], "the run to fail")
        await app.workers.wait_for_complete()
        assert "folder gone" in _header(app, h) and "files" not in _header(app, h)
        shutil.copytree(small_ckpt, ck)  # put back: counted again
        await h.wait_until(pilot, lambda: f"{files} files" in _header(app, h), "the count again")


async def test_an_emptied_source_folder_shows_no_files(make_app, small_ckpt, tmp_path, h):
    ck = tmp_path / "ck"
    shutil.copytree(small_ckpt, ck)
    app = make_app(str(ck))
    async with app.run_test(size=h.SIZE) as pilot:
        await h.wait_until(pilot, lambda: " files, " in _header(app, h), "the file count")
        for entry in os.scandir(ck):
            shutil.rmtree(entry.path) if entry.is_dir() else os.unlink(entry.path)
        await h.wait_until(pilot, lambda: "0 files" in _header(app, h), "the header to say it holds no files")
        assert _header(app, h) == f"{ck}  ·  0 files: the folder holds none now"


async def test_a_run_that_fails_for_a_deleted_folder_says_so_at_once(make_app, small_ckpt, tmp_path, h, monkeypatch):
    """Without waiting for the folder check: the failed run measures the source again, as a finished one does."""
    from tui.screens import dashboard

    monkeypatch.setattr(dashboard, "SOURCE_S", 3600.0, raising=False)
    ck = tmp_path / "ck"
    shutil.copytree(small_ckpt, ck)
    app = make_app(str(ck))
    async with app.run_test(size=h.SIZE) as pilot:
        await h.wait_until(pilot, lambda: " files, " in _header(app, h), "the file count")
        shutil.rmtree(ck)
        await pilot.press("r")
        await h.wait_until(pilot, lambda: [m for m, s in app.notes if s == "error"], "the run to fail")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert _header(app, h) == f"{ck}  ·  folder gone: no such directory; point at a checkpoint directory"
