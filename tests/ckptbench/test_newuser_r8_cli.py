"""What the eighth new-user pass found on the command line.

`--pick .` is the checkpoint at the top: its files and its sub-folders that hold no checkpoint of their own (a
Trainer's dataloader state, listed by the manifest at the top). It read the top files alone: the run FAILED with
the sub-folder's files "missing", its header counted them as restored, and with `--hash none` the load reached for
one and raised KeyError (a traceback). A manifest's file missing with `--hash none` is missing, not a traceback."""

from __future__ import annotations

import json
import os

import pytest
from clirun import run_cli


@pytest.fixture(scope="module")
def trainer_dir(tmp_path_factory):
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import generate

    root = tmp_path_factory.mktemp("pick") / "ckpt"
    generate(profiles.load("small").scaled(0.02), str(root), force=True)
    assert any(n.startswith("dataloader/") for n in _files(root))  # the sub-folder this is about
    return root


def _files(root) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, _, ns in os.walk(root) for n in ns)


@pytest.mark.parametrize("hash_", ["crc32c", "none"])
def test_pick_dot_restores_the_checkpoint_at_the_top_with_its_own_sub_folders(trainer_dir, hash_):
    r = run_cli("run", trainer_dir, "--pick", ".", "--repeat", "1", "--results", "", "--hash", hash_, "--json")
    assert r.rc == 0 and "Traceback" not in r.err, r.err
    doc = json.loads(r.out)
    assert doc["status"] in ("ok", "unverified") and not doc["errors"], doc["errors"]
    assert doc["files"] == len(_files(trainer_dir))  # every file of it, each read
    assert doc["bytes"] == sum(os.path.getsize(trainer_dir / f) for f in _files(trainer_dir))
    assert doc["verified"] is (hash_ == "crc32c")


def test_pick_dot_passes_over_a_sub_folder_that_is_a_checkpoint_of_its_own(trainer_dir, tmp_path):
    import shutil

    outer = tmp_path / "outer"
    shutil.copytree(trainer_dir, outer)
    shutil.copytree(trainer_dir, outer / "checkpoint-5")
    r = run_cli("run", outer, "--pick", ".", "--repeat", "1", "--results", "", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["files"] == len(_files(trainer_dir))
    assert {"path": "checkpoint-5", "why": "not picked (--pick .)"} in doc["layout"]["not_read"], doc["layout"]


def test_a_file_the_manifest_lists_that_is_gone_is_missing_without_a_hash_too(trainer_dir, tmp_path):
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(trainer_dir, copy)
    gone = next(f for f in _files(copy) if f.startswith("dataloader/"))
    os.unlink(copy / gone)
    r = run_cli("run", copy, "--repeat", "1", "--results", "", "--hash", "none")
    assert r.rc == 1 and "Traceback" not in r.err, r.err
    assert "FAILED" in r.out and f"{gone}: listed in the manifest but not read" in r.out + r.err


def test_the_sweep_floor_says_a_clause_once(trainer_dir):
    """`sweep` said "bound by storage (… read into reused buffers)" and, on the next line, "into reused buffers (no
    fresh memory to populate)"."""
    from ckptbench.cli.show import sweep_floor_lines

    lines = sweep_floor_lines({"floor_gbps": 2.0, "binding_gbps": 2.0, "binding": "storage",
                               "binding_how": "read into reused buffers",
                               "floor_note": "into reused buffers (no fresh memory to populate); ceilings measured "
                                             "1 h ago"})
    assert sum("into reused buffers" in ln for ln in lines) <= 1, lines
    assert any("ceilings measured 1 h ago" in ln for ln in lines)


def test_a_tensor_glob_that_matches_nothing_says_what_the_names_look_like(trainer_dir):
    """The README's `inspect DIR --tensors 'model.*'` on the generated sample said "tensors matching 'model.*': 0",
    and nothing else: its names start blocks.0."""
    r = run_cli("inspect", trainer_dir, "--tensors", "model.*")
    assert r.rc == 0, r.err
    line = next(ln for ln in r.out.splitlines() if ln.startswith("tensors matching"))
    assert line.startswith("tensors matching 'model.*': 0 (its names look like blocks.0."), line
    doc = json.loads(run_cli("inspect", trainer_dir, "--tensors", "blocks.0.*", "--json").out)
    assert doc["tensors"] and doc["tensor_names_like"] == []
