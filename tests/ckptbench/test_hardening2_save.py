"""`save --keep` numbers from and prunes only the saves ckptbench wrote (a step-NNNNNN folder with its manifest,
ASCII digits); a target holding a user's own step-like folders or files is refused, and left as it was."""

from __future__ import annotations

import errno
import json
import os

import pytest
from clirun import run_cli

SCALE = "0.02"


def _save(target, *extra):
    return run_cli("save", "small", target, "--scale", SCALE, "--no-fsync", *extra)


def _tree(root) -> dict:
    return {str(p.relative_to(root)): (p.is_dir(), p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*"))}


def test_a_target_holding_the_users_step_like_folders_is_refused_and_left_as_it_was(tmp_path):
    """They were named once and saved beside; a later inspect or resume then picked ckptbench's step over the
    user's, so a target holding anything save did not write is refused (--force included)."""
    target = tmp_path / "t"
    target.mkdir()
    (target / "step-000005").mkdir()
    (target / "step-000005" / "evals.txt").write_text("the user's evals\n")
    (target / "step-１２３４５７").mkdir()  # fullwidth digits: \d matched them
    before = _tree(target)
    for extra in ((), ("--force",)):
        r = _save(target, "--count", "3", "--keep", "1", *extra)
        assert r.rc == 2, r.out + r.err
        lines = [ln for ln in r.err.splitlines() if ln.strip()]
        assert len(lines) == 1 and str(target) in lines[0] and "Traceback" not in r.err, r.err
        assert _tree(target) == before


def test_a_file_named_like_a_save_is_refused_and_left_as_it_was(tmp_path):
    target = tmp_path / "t"
    target.mkdir()
    (target / "step-000001").write_text("not a folder")
    r = _save(target, "--count", "2", "--keep", "1")
    assert r.rc == 2 and "step-000001" in r.err, r.out + r.err
    assert sorted(os.listdir(target)) == ["step-000001"] and (target / "step-000001").read_text() == "not a folder"


def test_a_save_whose_name_another_save_took_says_so_in_one_line(tmp_path, monkeypatch):
    from ckptbench.save import write as save_write

    target = tmp_path / "t"
    real_rename = os.rename

    def racing_rename(src, dst):
        if os.path.basename(str(dst)) == "step-000001":  # a concurrent save finished first under the same name
            os.makedirs(os.path.join(dst, "x"), exist_ok=True)
        return real_rename(src, dst)

    monkeypatch.setattr(save_write.os, "rename", racing_rename)
    r = _save(target, "--count", "1")
    assert r.rc == 1, r.out + r.err
    lines = [ln for ln in r.err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "step-000001" in lines[0] and "another" in lines[0], r.err
    assert "Directory not empty" not in r.err
    assert sorted(os.listdir(target)) == ["step-000001"]  # the other save's, untouched; no partial save left


def _empty_save_manifest(folder) -> None:
    from ckptbench.checkpoint.manifest import Manifest

    Manifest(format="safetensors", profile="small", dims={}, param_count=0, weights_dtype="float32",
             optimizer_dtype="float32", world_size=1, seed=0, hash="crc32c", files=()).write(str(folder))


def test_existing_steps_are_only_manifest_folders_with_ascii_digits(tmp_path):
    from ckptbench.save.series import existing_steps, foreign_entries, prune

    for name, manifest in (("step-000001", True), ("step-000002", False), ("step-٠٠٠٠٠٣", True),
                           ("step-000004", True)):
        (tmp_path / name).mkdir()
        if manifest:  # a valid one, listing all the folder holds (itself): a '{}' is no save's (hostile11)
            _empty_save_manifest(tmp_path / name)
    (tmp_path / "step-000009").write_text("")
    assert existing_steps(str(tmp_path)) == [(1, "step-000001"), (4, "step-000004")]
    assert foreign_entries(str(tmp_path)) == ["step-000002", "step-000009", "step-٠٠٠٠٠٣"]
    assert prune(str(tmp_path), 1) == ["step-000001"]
    assert sorted(os.listdir(tmp_path)) == ["step-000002", "step-000004", "step-000009", "step-٠٠٠٠٠٣"]


@pytest.mark.parametrize("code", [errno.ENOTEMPTY, errno.EEXIST])
def test_rename_errors_of_a_taken_name_are_told_as_such(tmp_path, monkeypatch, code):
    from ckptbench.save import write as save_write
    from ckptbench.core.errors import CkptbenchError

    def taken(src, dst):
        raise OSError(code, os.strerror(code), src, None, dst)

    monkeypatch.setattr(save_write.os, "rename", taken)
    with pytest.raises(CkptbenchError, match="another save"):
        save_write._publish(str(tmp_path / ".s.tmp"), str(tmp_path / "step-000001"))
