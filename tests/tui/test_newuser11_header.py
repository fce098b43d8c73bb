"""From a new user's pass (newuser11): given a trainer's output folder, the dashboard's header named the folder alone
(its count, the chosen checkpoint's) while `run` said "restored checkpoint-10"; it names the checkpoint now (sysinfo
says it headless: tests/ckptbench/test_newuser11_cli.py)."""

from __future__ import annotations

import os
import shutil


def _header(app, h) -> str:
    return h.text_of(app.screen.query_one("#source"))


async def test_the_header_names_the_checkpoint_of_a_folder_of_several(make_app, small_ckpt, tmp_path, h):
    out = tmp_path / "out"
    for n in (3, 7):
        shutil.copytree(small_ckpt, out / f"checkpoint-{n}")
    files = sum(len(names) for _, _, names in os.walk(out / "checkpoint-7"))
    app = make_app(str(out))
    async with app.run_test(size=h.SIZE) as pilot:
        await h.wait_until(pilot, lambda: "files" in _header(app, h), "the file count")
        assert _header(app, h).startswith(f"{out} → checkpoint-7  ") and f"·  {files} files, " in _header(app, h)
    alone = make_app(str(out / "checkpoint-7"))
    async with alone.run_test(size=h.SIZE) as pilot:
        await h.wait_until(pilot, lambda: "files" in _header(alone, h), "the file count")
        assert "→" not in _header(alone, h)

