"""inspect of a checkpoint whose parts, loaded apart and merged, hold one name twice (Megatron's common.pt holding a
tensor under a weight's name; a second pytorch_model_fsdp_N copying the first) counted both copies, where load and
run refuse it (load.merge_apart): inspect now says the same one line."""

from __future__ import annotations

import os
import shutil

from clirun import one_error_line, run_cli
from test_hostile11_merge import common_pt_clash

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "compat", "fixtures")
MEGATRON = os.path.join(FIXTURES, "megatron_torch_dist", "iter_0000005")
FSDP = os.path.join(FIXTURES, "trainer_fsdp_sharded", "checkpoint-2")


def test_inspect_refuses_a_common_pt_tensor_named_as_a_weight_as_load_does(tmp_path):
    d, name = common_pt_clash(tmp_path)
    line = one_error_line(run_cli("inspect", d))
    assert f"common.pt holds {name!r}, also in its weights" in line
    assert line == one_error_line(run_cli("load", d))


def test_inspect_refuses_a_second_fsdp_model_folder_as_load_does(tmp_path):
    d = tmp_path / "checkpoint-2"
    shutil.copytree(FSDP, d)
    shutil.copytree(d / "pytorch_model_fsdp_0", d / "pytorch_model_fsdp_1")
    line = one_error_line(run_cli("inspect", d))
    assert "pytorch_model_fsdp_1 holds" in line and line == one_error_line(run_cli("load", d))


def test_the_checkpoints_as_written_still_inspect():
    for d in (MEGATRON, FSDP):
        r = run_cli("inspect", d)
        assert r.rc == 0, r.err
