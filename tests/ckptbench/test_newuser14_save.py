"""`save` into a directory that already holds a checkpoint save did not write (`gen`'s, a trainer's torch.save or
safetensors file, a user's own step folder) is refused in one line, exit 2, --force or not, and the directory is left
byte for byte as it was: a step-NNNNNN beside it would become what inspect, verify and a resume pick. A target save
wrote before (its results file beside its saves included) still takes more saves."""

from __future__ import annotations

import os

import pytest
import torch
from clirun import assert_one_line_error, run_cli
from safetensors.torch import save_file

SCALE = "0.02"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --results is ./results.csv: never the repository's


def _save(target, *extra):
    return run_cli("save", "small", target, "--scale", SCALE, "--no-fsync", "--count", "1", *extra)


def _state(root) -> dict:
    """Every entry under root and the root itself: kind, bytes of a file, mtime_ns (a create or delete inside a
    directory changes its mtime, so a probe file written and removed shows too)."""
    out = {".": ("dir", None, os.stat(root).st_mtime_ns)}
    for dirpath, dirs, names in os.walk(root):
        for n in dirs + names:
            full = os.path.join(dirpath, n)
            st = os.lstat(full)
            data = open(full, "rb").read() if os.path.isfile(full) else None
            out[os.path.relpath(full, root)] = ("dir" if n in dirs else "file", data, st.st_mtime_ns)
    return out


def _refused(target, *extra) -> None:
    before = _state(target)
    r = _save(target, *extra)
    assert_one_line_error(r, str(target))
    assert "empty or new directory" in r.err and "save wrote before" in r.err
    assert _state(target) == before
    assert not os.path.exists("results.csv")  # nothing measured, nothing recorded


def _torch(target) -> None:
    torch.save({"model": {"w": torch.arange(12.0).reshape(3, 4)}, "step": 7}, target / "checkpoint.pt")


def _safetensors(target) -> None:
    save_file({"w": torch.ones(4, 4), "b": torch.zeros(4)}, str(target / "model.safetensors"))


@pytest.mark.parametrize("force", [(), ("--force",)], ids=["plain", "force"])
def test_a_gen_checkpoint_is_refused_and_left_as_it_was(tmp_path, force):
    target = tmp_path / "ckpt"
    assert run_cli("gen", "small", target, "--scale", SCALE).rc == 0
    _refused(target, *force)
    assert run_cli("verify", target).rc == 0  # still the checkpoint every command picks


@pytest.mark.parametrize("write", [_torch, _safetensors], ids=["torch.save", "safetensors"])
@pytest.mark.parametrize("force", [(), ("--force",)], ids=["plain", "force"])
def test_a_library_written_checkpoint_is_refused_and_left_as_it_was(tmp_path, write, force):
    target = tmp_path / "ckpt"
    target.mkdir()
    write(target)
    _refused(target, *force)


def test_a_users_own_step_folder_is_refused(tmp_path):
    target = tmp_path / "ckpt"
    (target / "step-000005").mkdir(parents=True)
    _safetensors(target / "step-000005")
    _refused(target)


def test_a_link_named_like_a_save_is_not_ours(tmp_path):
    target, elsewhere = tmp_path / "ckpt", tmp_path / "elsewhere"
    assert _save(elsewhere, "--results", tmp_path / "R.csv").rc == 0
    target.mkdir()
    os.symlink(elsewhere / "step-000001", target / "step-000001")
    _refused(target)


def test_a_target_save_wrote_before_takes_more_saves(tmp_path):
    target = tmp_path / "t"
    assert _save(target, "--results", tmp_path / "R.csv").rc == 0
    r = _save(target, "--results", tmp_path / "R.csv", "--keep", "2")
    assert r.rc == 0, r.err
    assert sorted(os.listdir(target)) == ["step-000001", "step-000002"]
    assert run_cli("verify", target).rc == 0


def test_saving_into_the_working_directory_records_beside_the_saves_and_goes_on(tmp_path, monkeypatch):
    target = tmp_path / "here"
    target.mkdir()
    monkeypatch.chdir(target)  # `save small .`: the default results.csv lands in the target
    assert _save(".").rc == 0
    r = _save(".", "--keep", "2")
    assert r.rc == 0, r.err
    assert sorted(os.listdir(target)) == ["results.csv", "results.csv.jsonl", "step-000001", "step-000002"]


def test_an_empty_lost_and_found_of_a_mount_root_is_not_the_users_checkpoint(tmp_path):
    target = tmp_path / "mnt"
    (target / "lost+found").mkdir(parents=True)
    r = _save(target, "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    assert sorted(os.listdir(target)) == ["lost+found", "step-000001"]


def test_the_refusal_is_the_same_through_the_domain_call(tmp_path):
    """The TUI calls run_save directly: the same refusal, before anything is loaded or written."""
    from ckptbench.core.errors import CkptbenchError
    from ckptbench.save.series import SaveOptions, run_save

    target = tmp_path / "ckpt"
    target.mkdir()
    _torch(target)
    before = _state(target)
    with pytest.raises(CkptbenchError, match="save did not write") as exc:
        run_save("small", str(target), SaveOptions(count=1, fsync=False), scale=float(SCALE), force=True)
    assert exc.value.exit_code == 2
    assert _state(target) == before
