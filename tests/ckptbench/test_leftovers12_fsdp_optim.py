"""A Trainer's FSDP checkpoint (pytorch_model_fsdp_0 and optimizer_0, each a DCP folder) whose optimizer folder is a
plain file, empty, a link or missing restored the weights alone and said nothing. transformers' Trainer passes over
the optimizer and the scheduler when no optimizer is there (a file, or nothing: said in a note, scheduler.pt not
read), and loads optimizer_0 when a folder is named so (empty: it fails; one line). A model folder that is a link was
refused as "weight files ... beside 1 folder(s) of checkpoints (., optimizer_0)", the link never named."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from clirun import one_error_line, run_cli

from ckptbench.checkpoint import resume
from ckptbench.core.errors import CkptbenchError

FSDP = os.path.join(os.path.dirname(__file__), "..", "compat", "fixtures", "trainer_fsdp_sharded", "checkpoint-2")
NOTE = "the optimizer is not restored"


def _copy(tmp_path):
    d = tmp_path / "checkpoint-2"
    shutil.copytree(FSDP, d)
    return d


@pytest.mark.parametrize("how", ["file", "missing"])
def test_no_optimizer_folder_restores_the_weights_and_says_the_optimizer_is_not(tmp_path, how):
    d = _copy(tmp_path)
    shutil.rmtree(d / "optimizer_0")
    if how == "file":
        (d / "optimizer_0").write_bytes(b"not a folder")
    r = run_cli("load", d)
    assert r.rc == 0, r.err
    assert NOTE in r.out and ("optimizer_0 is a file" in r.out) == (how == "file"), r.out
    assert "not read: scheduler.pt (a Trainer resume loads the scheduler only beside an optimizer" in r.out
    doc = json.loads(run_cli("load", d, "--json").out)
    assert any(n.startswith(NOTE) for n in doc["layout"]["notes"])
    assert "scheduler.pt" not in doc["layout"]["state_files"]
    r = run_cli("run", d, "--repeat", "1", "--results", "")
    assert r.rc == 0 and NOTE in r.out, r.out + r.err
    assert NOTE in run_cli("inspect", d).out


def test_the_checkpoint_as_written_has_no_note():
    doc = json.loads(run_cli("load", FSDP, "--json").out)
    assert doc["layout"]["notes"] == [] and "scheduler.pt" in doc["layout"]["state_files"]


def test_an_empty_optimizer_folder_isone_error_line(tmp_path):
    d = _copy(tmp_path)
    shutil.rmtree(d / "optimizer_0")
    (d / "optimizer_0").mkdir()
    for cmd in (("load",), ("run", "--repeat", "1", "--results", ""), ("inspect",)):
        one_error_line(run_cli(*cmd[:1], d, *cmd[1:]), "optimizer_0: FSDP's sharded optimizer folder is empty",
                  "fails there")


def test_an_optimizer_folder_of_other_files_isone_error_line(tmp_path):
    d = _copy(tmp_path)
    for f in os.listdir(d / "optimizer_0"):
        os.remove(d / "optimizer_0" / f)
    (d / "optimizer_0" / "notes.txt").write_text("x")
    one_error_line(run_cli("load", d), "optimizer_0: a folder named for FSDP's sharded optimizer that holds no DCP")


@pytest.mark.parametrize("which", ["pytorch_model_fsdp_0", "optimizer_0"])
def test_a_linked_fsdp_folder_is_named(tmp_path, which):
    d = _copy(tmp_path)
    shutil.move(d / which, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", d / which)
    line = one_error_line(run_cli("load", d), f"{which}: FSDP's sharded", "is a symlink", "cp -rL")
    assert "weight files" not in line and "folder(s)" not in line


def test_a_model_folder_missing_beside_the_optimizer_isone_error_line(tmp_path):
    d = _copy(tmp_path)
    shutil.rmtree(d / "pytorch_model_fsdp_0")
    one_error_line(run_cli("load", d), "optimizer_0: FSDP's sharded optimizer without its model folder")


def test_state_files_beside_checkpoints_are_called_state_files_and_counted_as_listed():
    rels = ["scheduler.pt", "rng_state_0.pth", "dcp/.metadata", "dcp/__0_0.distcp"]
    with pytest.raises(CkptbenchError, match=r"state files at the top \(rng_state_0\.pth, scheduler\.pt\) beside 1 "
                                             r"folder of checkpoints: 2 candidates \(\., dcp\)"):
        resume.choose("/d", rels)
