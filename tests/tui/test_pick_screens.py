"""`--pick` in the dashboard, the watch screen and sysinfo: their error for a folder of several checkpoints said to
choose one with --pick, and none of them took it (a Lightning folder of several .ckpt files could not be shown at
all). The two .ckpt files here are the compat tier's, written by Lightning itself, under two names."""

from __future__ import annotations

import os

from lightning_pair import two_ckpts
from tui.app import CkptbenchApp

from ckptbench.restore.runner import RunOptions


async def test_the_dashboard_restores_the_checkpoint_picked(tmp_path, h):
    folder = two_ckpts(tmp_path)
    app = CkptbenchApp(folder, RunOptions.make(), results_path=str(tmp_path / "R.csv"), pick="b.ckpt")
    async with app.run_test(size=h.SIZE) as pilot:
        header = lambda: h.text_of(app.screen.query_one("#source"))  # noqa: E731
        await h.wait_until(pilot, lambda: "file" in header(), "the file count")
        assert header().startswith(f"{folder} → b.ckpt  ") and "1 file," in header(), header()
        await h.run_once(pilot, app)
        doc = app.session.doc
        assert doc["status"] in ("ok", "unverified"), doc.get("problems")
        assert doc["files"] == 1 and doc["bytes"] == os.path.getsize(os.path.join(folder, "b.ckpt"))
