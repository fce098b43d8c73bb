"""Hostile checkpoints, sixth round: `save` from a crafted source and into a crafted target, profiles, and what the
fifth round left open. Each input is made by the real library (torch.save, safetensors, torch.distributed.checkpoint)
and then crafted; bad input is one line naming what and where, and a non-zero exit."""

from __future__ import annotations

import os

import pytest
import torch

from clirun import assert_one_line_error


@pytest.mark.parametrize("how", ["fifo", "link"])
def test_a_dcp_folder_whose_metadata_is_not_a_file_names_it(tmp_path, h, how):
    """Shards torch wrote beside a `.metadata` that is a FIFO (or a link) was 'no safetensors, torch or
    torch.distributed.checkpoint files found': the one file that makes it a DCP checkpoint was there, passed over and
    never read, and the line sent the user looking for files that are present."""
    ck, _ = h.dcp_saved(tmp_path / "ck", {"w": torch.randn(8, 8)})
    os.replace(os.path.join(ck, ".metadata"), tmp_path / "meta")
    if how == "fifo":
        os.mkfifo(os.path.join(ck, ".metadata"))
    else:
        os.symlink(tmp_path / "meta", os.path.join(ck, ".metadata"))
    more = {"run": ("--repeat", "1", "--results", ""), "save": (tmp_path / "target", "--count", "1")}
    for cmd in ("inspect", "run", "load", "save"):
        r = h.run_cli(cmd, ck, *more.get(cmd, ()))
        assert_one_line_error(r, ".metadata")
        assert "no safetensors" not in r.err and "never read" in r.err, (cmd, r.err)
        assert ("a FIFO" if how == "fifo" else "symbolic link") in r.err, (cmd, r.err)
    assert not (tmp_path / "target").exists()
