"""The parts of one checkpoint that are loaded apart and merged (Megatron's common.pt beside its DCP files; FSDP's
pytorch_model_fsdp_N and optimizer_N folders) may not hold one name twice: the merge let the later win, so a common.pt
holding a NaN tensor under a weight's name failed a sound checkpoint (and a sound one would pass a damaged weight),
and a second model folder (or an optimizer folder that was a copy of the model's) shadowed the first, restored
'ok'. Each is now one line naming both. A pytorch_model_fsdp_00 beside _0 (Accelerate writes no leading zero) is
not read as part of the checkpoint."""

from __future__ import annotations

import os
import shutil

import torch
from clirun import one_error_line, run_cli

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "compat", "fixtures")
MEGATRON = os.path.join(FIXTURES, "megatron_torch_dist", "iter_0000005")
FSDP = os.path.join(FIXTURES, "trainer_fsdp_sharded", "checkpoint-2")


def common_pt_clash(tmp_path):
    """A copy of the megatron-core torch_dist fixture whose common.pt holds a NaN tensor under a weight's name; (the
    iteration folder, that name)."""
    from ckptbench.checkpoint.formats.dcp_metadata import SafeReader

    d = tmp_path / "iter_0000005"
    shutil.copytree(MEGATRON, d)
    meta = SafeReader(str(d)).read_metadata()
    name, md = next((n, m) for n, m in meta.state_dict_metadata.items() if hasattr(m, "chunks"))
    torch.save({name: torch.full(tuple(md.size), float("nan")), "iteration": 5}, d / "common.pt")
    return d, name


def test_a_common_pt_tensor_named_as_a_weight_is_refused(tmp_path):
    d, name = common_pt_clash(tmp_path)
    for cmd in (("load",), ("run", "--repeat", "1", "--results", "")):
        one_error_line(run_cli(*cmd[:1], d, *cmd[1:]), f"common.pt holds {name!r}, also in its weights")


def test_the_megatron_checkpoint_as_written_still_loads():
    r = run_cli("load", MEGATRON)
    assert r.rc == 0, r.err


def test_a_second_fsdp_model_folder_with_the_same_names_is_refused(tmp_path):
    d = tmp_path / "checkpoint-2"
    shutil.copytree(FSDP, d)
    shutil.copytree(d / "pytorch_model_fsdp_0", d / "pytorch_model_fsdp_1")
    one_error_line(run_cli("load", d), "pytorch_model_fsdp_1 holds", "also in optimizer_0 or pytorch_model_fsdp_0")


def test_an_optimizer_folder_that_holds_the_model_is_refused(tmp_path):
    d = tmp_path / "checkpoint-2"
    shutil.copytree(FSDP, d)
    shutil.rmtree(d / "optimizer_0")
    shutil.copytree(d / "pytorch_model_fsdp_0", d / "optimizer_0")
    one_error_line(run_cli("load", d), "pytorch_model_fsdp_0 holds", "also in optimizer_0")


def test_a_model_folder_with_a_leading_zero_is_not_read(tmp_path):
    d = tmp_path / "checkpoint-2"
    shutil.copytree(FSDP, d)
    shutil.copytree(d / "pytorch_model_fsdp_0", d / "pytorch_model_fsdp_00")
    r = run_cli("inspect", d)
    assert r.rc == 0, r.err
    assert "not read: pytorch_model_fsdp_00/.metadata (not part of the FSDP checkpoint" in r.out + r.err
    assert run_cli("load", d).rc == 0
