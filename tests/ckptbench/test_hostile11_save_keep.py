"""`save --keep` removes only saves it wrote, whole: a step-NNNNNN folder holding a ckptbench.json was taken as one,
so a '{}' planted beside the user's files, or a file the user put into an earlier save since, was deleted with the
rest when the series pruned it. Now such a folder is the user's: one line naming what is not listed, nothing
touched (as gen --force, 877c304)."""

from __future__ import annotations

import os

import pytest
from clirun import assert_one_line_error, run_cli

SCALE = "0.02"


def _save(target, *more: str):
    return run_cli("save", "small", target, "--scale", SCALE, "--no-fsync", "--results", "", *more)


def test_a_file_put_into_an_earlier_save_is_not_pruned_with_it(tmp_path):
    target = tmp_path / "t"
    r = _save(target, "--count", "1")
    assert r.rc == 0, r.err
    (target / "step-000001" / "notes.txt").write_text("mine\n")
    r = _save(target, "--count", "2", "--keep", "1")
    assert_one_line_error(r, "step-000001/notes.txt")
    assert os.listdir(target) == ["step-000001"]
    assert (target / "step-000001" / "notes.txt").read_text() == "mine\n"
    os.unlink(target / "step-000001" / "notes.txt")  # the save as it wrote it: pruned as before
    r = _save(target, "--count", "2", "--keep", "1")
    assert r.rc == 0, r.err
    assert os.listdir(target) == ["step-000003"]


@pytest.mark.parametrize("manifest", ["{}", "not json", None])
def test_a_step_folder_of_the_users_with_a_planted_manifest_is_not_pruned(tmp_path, manifest):
    target = tmp_path / "t"
    mine = target / "step-000007"
    (mine / "data").mkdir(parents=True)
    (mine / "data" / "weights.bin").write_bytes(b"\0" * 64)
    if manifest is not None:
        (mine / "ckptbench.json").write_text(manifest)
    r = _save(target, "--count", "2", "--keep", "1")
    assert_one_line_error(r, "(step-000007)")
    assert sorted(os.listdir(target)) == ["step-000007"]
    assert (mine / "data" / "weights.bin").read_bytes() == b"\0" * 64


@pytest.mark.parametrize("force", [False, True])
def test_a_file_put_into_the_target_while_gen_writes_is_not_deleted(tmp_path, force):
    """gen checked the target when it started and replaced it, whole, when done (minutes later for a large profile):
    a file the user put into it meanwhile was deleted with it, --force or not (an empty target needs none)."""
    from ckptbench.checkpoint import profiles
    from ckptbench.checkpoint.generate import generate
    from ckptbench.core.errors import CkptbenchError

    target = tmp_path / "ck"
    if force:
        assert run_cli("gen", "small", target, "--scale", SCALE).rc == 0
    else:
        target.mkdir()

    def meanwhile(msg: str) -> None:
        if msg.startswith("hashing"):
            (target / "notes.txt").write_text("mine\n")

    with pytest.raises(CkptbenchError, match="holds 'notes.txt', which its ckptbench.json does not list"):
        generate(profiles.load("small").scaled(float(SCALE)), str(target), force=force, progress=meanwhile)
    assert (target / "notes.txt").read_text() == "mine\n"
    assert os.listdir(tmp_path) == ["ck"]  # the staging folder removed, the target back where it was
