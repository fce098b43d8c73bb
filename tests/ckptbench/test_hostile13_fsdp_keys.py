"""FSDP's model and optimizer folders may not hold one DCP key twice. The clash check compared the names the state
gives (a model weight loses DCP's `model.`, a byte entry keeps its whole key), so an optimizer_0 byte entry saved as
`model.model.embed_tokens.weight` passed beside the weight of that key: load, run and inspect all said ok. The
folders' keys as saved are now compared too, in the restore and in inspect."""

from __future__ import annotations

import os
import shutil
import warnings

import pytest
import torch
from clirun import run_cli

FSDP = os.path.join(os.path.dirname(__file__), "..", "compat", "fixtures", "trainer_fsdp_sharded", "checkpoint-2")
KEY = "model.model.embed_tokens.weight"


def _with_optimizer(tmp_path, state: dict):
    import torch.distributed.checkpoint as dcp

    d = tmp_path / "checkpoint-2"
    shutil.copytree(FSDP, d)
    shutil.rmtree(d / "optimizer_0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no process group: DCP says it saves in one process
        dcp.save(state, checkpoint_id=str(d / "optimizer_0"), no_dist=True)
    return d


@pytest.mark.parametrize("cmd", [("load",), ("inspect",), ("run", "--repeat", "1", "--results", "")])
def test_an_optimizer_byte_entry_under_a_model_weights_key_is_refused(tmp_path, cmd):
    d = _with_optimizer(tmp_path, {"optimizer": {"state": {"x": torch.ones(3)}}, KEY: "not the weight"})
    r = run_cli(cmd[0], d, *cmd[1:])
    assert r.rc != 0 and "Traceback" not in r.err, r.err
    errors = [ln for ln in r.err_lines if ln.startswith("ckptbench: error:")]
    assert len(errors) == 1, r.err
    assert f"holds {KEY!r}, also in" in errors[0] and "optimizer_0" in errors[0], errors[0]


def test_an_optimizer_folder_of_its_own_keys_still_loads(tmp_path):
    d = _with_optimizer(tmp_path, {"optimizer": {"state": {"x": torch.ones(3)}, "param_groups": [{"lr": 0.1}]}})
    assert run_cli("load", d).rc == 0


def test_an_optimizer_folder_of_another_models_shapes_fails_the_check(tmp_path):
    """The structural check held ckptbench's own optimizer parts to their weights' shapes, never a foreign one's
    (optimizer.state.<weight>.exp_avg, kept in `extra`): an optimizer_0 whose moments are another model's shapes
    restored 'ok' beside the model folder, where inspect promised optimizer parts checked against their weights."""
    st = {"model.embed_tokens.weight": {"exp_avg": torch.ones(3, 3), "exp_avg_sq": torch.ones(3, 3),
                                        "step": torch.tensor(2.0)}}
    d = _with_optimizer(tmp_path, {"optimizer": {"state": st, "param_groups": [{"lr": 0.1}]}})
    for cmd in (("load",), ("run", "--repeat", "1", "--results", "")):
        r = run_cli(cmd[0], d, *cmd[1:])
        assert r.rc == 1 and "Traceback" not in r.err, r.err
        assert "optimizer.state.model.embed_tokens.weight.exp_avg: shape (3, 3) != weight (64, 16)" in r.out + r.err


def test_optimizer_parts_not_in_their_weights_shape_by_design_pass_the_check(tmp_path):
    """Adafactor factors the second moment into a row and a column (torch's row_var/col_var, transformers'
    exp_avg_sq_row/_col), bitsandbytes' 8-bit Adam keeps a 256-entry qmap beside a uint8 state: a sound checkpoint of
    either is not another model's, and only the parts torch.optim keeps in the weight's shape are held to it."""
    st = {"model.embed_tokens.weight": {"row_var": torch.ones(64), "col_var": torch.ones(16), "qmap1": torch.ones(256),
                                        "exp_avg": torch.ones(64, 16), "step": torch.tensor(2.0)}}
    d = _with_optimizer(tmp_path, {"optimizer": {"state": st, "param_groups": [{"lr": 0.1}]}})
    r = run_cli("load", d)
    assert r.rc == 0 and "structural check passed" in r.out, r.out + r.err


def test_the_fsdp_checkpoint_as_written_passes_the_check():
    r = run_cli("load", FSDP)
    assert r.rc == 0 and "structural check passed" in r.out, r.out + r.err
