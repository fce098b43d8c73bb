"""Two checkpoints in one folder, for the commands and screens that must be told which (`--pick`): the compat tier's
.ckpt file, written by Lightning itself, copied under two names. Shared by tests/ckptbench and tests/tui (pytest puts
this folder on sys.path for tests/conftest.py)."""

from __future__ import annotations

import os
import shutil

FIXTURE = os.path.join(os.path.dirname(__file__), "compat", "fixtures", "lightning_ckpt_max", "checkpoints")


def two_ckpts(tmp_path) -> str:
    """A folder holding a.ckpt and b.ckpt, the same Lightning checkpoint twice."""
    folder = tmp_path / "lt"
    folder.mkdir()
    (src,) = [os.path.join(FIXTURE, n) for n in os.listdir(FIXTURE) if n.endswith(".ckpt")]
    shutil.copy(src, folder / "a.ckpt")
    shutil.copy(src, folder / "b.ckpt")
    return str(folder)
