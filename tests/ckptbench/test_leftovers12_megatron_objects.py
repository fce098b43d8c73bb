"""A DCP folder whose metadata.json names the torch_dist backend had the one-item lists in all its byte entries
unwrapped, as megatron-core hands a ShardedObject to its resume: a metadata.json is anyone's file. Only a real
Megatron layout (common.pt beside it) has its ShardedObjects (keyed KEY/shard_OFFSET_SHAPE) unwrapped now; another
byte entry, and any other DCP's, comes back as it was saved."""

from __future__ import annotations

import os
import shutil

import torch
import torch.distributed.checkpoint as dcp

from ckptbench.checkpoint.formats import dcp_format

MEGATRON = os.path.join(os.path.dirname(__file__), "..", "compat", "fixtures", "megatron_torch_dist", "iter_0000005")
SHARDED = "rng_state/shard_0.0_1.1"  # as megatron-core keys a ShardedObject
TORCH_DIST = '{"sharded_backend": "torch_dist", "sharded_backend_version": 1}'


def _save(d, common: bool):
    # lists of plain values: one byte entry each (DCP's save walks into a list that holds a dict)
    dcp.save({"w": torch.ones(4), SHARDED: [("seed", 1)], "mine": [7]}, checkpoint_id=str(d), no_dist=True)
    (d / "metadata.json").write_text(TORCH_DIST)
    if common:
        torch.save({"iteration": 5}, d / "common.pt")
    return dcp_format.load_dir(str(d)).extra


def test_a_torch_dist_metadata_json_without_common_pt_unwraps_nothing(tmp_path):
    extra = _save(tmp_path, common=False)
    assert extra[SHARDED] == [("seed", 1)] and extra["mine"] == [7]


def test_in_a_megatron_layout_only_sharded_objects_are_unwrapped(tmp_path):
    extra = _save(tmp_path, common=True)
    assert extra[SHARDED] == ("seed", 1) and extra["mine"] == [7]


def test_the_real_megatron_checkpoint_hands_its_rng_state_over_unwrapped(tmp_path):
    d = tmp_path / "iter"
    shutil.copytree(MEGATRON, d)
    held = dcp_format.load_dir(str(d)).extra[SHARDED]
    assert isinstance(held, list) and isinstance(held[0], dict) and "random_rng_state" in held[0]
    os.remove(d / "common.pt")  # the same folder, not Megatron's layout: the list as saved
    kept = dcp_format.load_dir(str(d)).extra[SHARDED]
    assert len(kept) == 1 and isinstance(kept[0], list) and kept[0][0].keys() == held[0].keys()
