"""A new user's bad input and hostile files through the CLI, where the other hostile tests do not go: one line on
stderr and a non-zero exit, never a traceback or a hang; nothing lost, nothing written where it should not be."""

from __future__ import annotations

import os

from clirun import assert_one_line_error, run_cli


def _tree(root) -> dict:
    """Every path under root with its size and mtime: what "unchanged" compares."""
    out = {}
    for dirpath, dirs, names in os.walk(root):
        for n in dirs + names:
            st = os.lstat(os.path.join(dirpath, n))
            out[os.path.relpath(os.path.join(dirpath, n), root)] = (st.st_size, st.st_mtime_ns)
    return out


def test_save_never_prunes_its_own_source(h, ckpt, tmp_path):
    """`save T/step-000001 T --keep 1` would write step-000002 and prune the source it was saving."""
    src = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "saves" / "step-000001")
    before = _tree(tmp_path)
    r = run_cli("save", src, tmp_path / "saves", "--count", "1", "--keep", "1", "--results", "")
    assert_one_line_error(r, "is the save step-000001 in the target")
    assert _tree(tmp_path) == before
