"""`--pick` in the dashboard, the watch screen and sysinfo: their error for a folder of several checkpoints said to
choose one with --pick, and none of them took it (a Lightning folder of several .ckpt files could not be shown at
all). The two .ckpt files here are the compat tier's, written by Lightning itself, under two names."""

from __future__ import annotations

import os
import shutil

from tui.app import CkptbenchApp

from ckptbench.restore.runner import RunOptions

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "compat", "fixtures", "lightning_ckpt_max", "checkpoints")


def _two_ckpts(tmp_path) -> str:
    folder = tmp_path / "lt"
    folder.mkdir()
    (src,) = [os.path.join(FIXTURE, n) for n in os.listdir(FIXTURE) if n.endswith(".ckpt")]
    shutil.copy(src, folder / "a.ckpt")
    shutil.copy(src, folder / "b.ckpt")
    return str(folder)


async def test_the_dashboard_restores_the_checkpoint_picked(tmp_path, h):
    folder = _two_ckpts(tmp_path)
    app = CkptbenchApp(folder, RunOptions.make(), results_path=str(tmp_path / "R.csv"), pick="b.ckpt")
    async with app.run_test(size=h.SIZE) as pilot:
        header = lambda: h.text_of(app.screen.query_one("#source"))  # noqa: E731
        await h.wait_until(pilot, lambda: "file" in header(), "the file count")
        assert header().startswith(f"{folder} → b.ckpt  ") and "1 file," in header(), header()
        await h.run_once(pilot, app)
        doc = app.session.doc
        assert doc["status"] in ("ok", "unverified"), doc.get("problems")
        assert doc["files"] == 1 and doc["bytes"] == os.path.getsize(os.path.join(folder, "b.ckpt"))
