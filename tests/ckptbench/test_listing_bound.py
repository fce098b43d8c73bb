"""A local checkpoint's listing is bounded by tree.MAX_ENTRIES (a million empty files took 90 s to list, with no
bound): one more entry than that, files or folders, is refused in one line as soon as the walk reads it, by every
command that lists a folder. The bound is lowered here; the real one holds 100 steps of DeepSpeed at 4096 ranks."""

from __future__ import annotations

import os

import pytest
from clirun import run_cli

from ckptbench.checkpoint import tree
from ckptbench.core.errors import CkptbenchError

LIMIT = 50


@pytest.fixture
def low(monkeypatch):
    monkeypatch.setattr(tree, "MAX_ENTRIES", LIMIT)


def make(root, files: int, folders: int = 0):
    root.mkdir(exist_ok=True)
    for i in range(files):
        (root / f"f{i:05d}.bin").write_bytes(b"")
    for i in range(folders):
        (root / f"d{i:05d}").mkdir()
    return root


def test_the_real_bound_holds_deepspeed_at_4096_ranks():
    """A ZeRO step at 4096 ranks is a model and an optimizer shard a rank: 100 such steps fit."""
    assert tree.MAX_ENTRIES >= 100 * (2 * 4096 + 16)


def test_exactly_the_bound_is_listed(tmp_path, low):
    root = make(tmp_path / "ck", LIMIT - 3, 3)
    assert len(tree.files(str(root))) == LIMIT - 3


@pytest.mark.parametrize("files, folders", [(LIMIT + 1, 0), (LIMIT // 2, LIMIT // 2 + 1)])
def test_one_entry_more_is_refused(tmp_path, low, files, folders):
    """Files, or empty folders (which cost the walk as much and are never read), count alike."""
    root = make(tmp_path / "ck", files, folders)
    with pytest.raises(CkptbenchError) as info:
        tree.files(str(root))
    assert str(info.value) == (f"{root}: more than {LIMIT} entries (files and folders) below it; ckptbench reads "
                               f"checkpoints of up to {LIMIT} files: point at one checkpoint (one step's folder), "
                               "not a folder of many")


def test_the_walk_stops_at_the_bound(tmp_path, low, monkeypatch):
    """The work is bounded too: nested folders of 2000 files are not read past the entry that passes the bound."""
    root = make(tmp_path / "ck", 0, 0)
    for d in ("a", "b"):
        make(root / d, 1000)
    read = []
    real = os.scandir

    class Counting:
        def __init__(self, path):
            self.it = real(path)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.it.close()

        def __iter__(self):
            for e in self.it:
                read.append(e.name)
                yield e

    monkeypatch.setattr(tree.os, "scandir", Counting)
    with pytest.raises(CkptbenchError):
        tree.files(str(root))
    assert len(read) == LIMIT + 1


@pytest.mark.parametrize("cmd", [["read"], ["run", "--repeat", "1"], ["inspect"]])
def test_every_command_refuses_it_in_one_line(tmp_path, low, cmd):
    root = make(tmp_path / "ck", LIMIT + 1)
    r = run_cli(cmd[0], str(root), *cmd[1:], "--results", str(tmp_path / "r.csv")) if cmd[0] == "run" \
        else run_cli(cmd[0], str(root))
    assert "Traceback" not in r.err, r.err
    assert r.rc == 2, r.err
    assert len(r.err_lines) == 1 and r.err_lines[0].startswith("ckptbench: error: "), r.err
    assert f"more than {LIMIT} entries" in r.err and "point at one checkpoint" in r.err
    assert not (tmp_path / "r.csv").exists()


def test_upload_refuses_it_before_any_request(tmp_path, low):
    from ckptbench.sources import s3

    root = make(tmp_path / "ck", LIMIT + 1)
    with pytest.raises(CkptbenchError, match=f"more than {LIMIT} entries"):
        s3.upload(str(root), s3.parse("s3://b/ck"))
