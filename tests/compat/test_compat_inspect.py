"""What inspect, staged mode and the pick say about checkpoints the libraries wrote: true labels, the tensor table,
the whole state of a Trainer folder, no second checkpoint read, the choice a user makes with --pick."""

from __future__ import annotations

import json
import os

import pytest
from compat_helpers import fixture_names

NAMES = fixture_names()
LABELS = {"hf_safetensors": "hf-safetensors", "hf_sharded": "hf-safetensors", "hf_bin": "hf-bin",
          "trainer_outdir": "hf-trainer", "trainer_outdir_final": "hf-trainer", "accelerate_state": "accelerate",
          "accelerate_two_models": "accelerate", "accelerate_two_models_bin": "accelerate",
          "lightning_ckpt": "lightning", "lightning_ckpt_max": "lightning", "torchtitan_dump": "dcp",
          "deepspeed_zero2": "deepspeed", "deepspeed_zero3": "deepspeed", "peft_lora": "hf-safetensors",
          "megatron_torch_dist": "megatron", "trainer_fsdp_sharded": "hf-trainer"}


def _inspect(cli, root, *args) -> dict:
    r = cli("inspect", root, "--json", *args)
    assert r.rc == 0, r.err
    return json.loads(r.out)


@pytest.mark.parametrize("name", NAMES)
def test_inspect_labels_the_layout_and_lists_every_tensor_the_library_loads(name, compat, cli):
    c = compat(name)
    doc = _inspect(cli, c.root)
    assert doc["layout"]["name"] == LABELS[name]
    rows = {t["name"]: t for t in doc["tensors"]}
    assert len(rows) == len(doc["tensors"]) == sum(g["tensors"] for g in doc["groups"].values())
    assert doc["params"] == doc["groups"].get("model", {}).get("params", 0)  # the model's, not its optimizer's
    # every tensor the library loads, under the name the restore gives it, with its dtype and shape
    for key, want in {**c.expected["model"], **c.expected["extra"]}.items():
        # torch tensors (numpy arrays in RNG state are values, not table rows); one inside a Megatron ShardedObject
        # (key/shard_…: its RNG states) is pickled in a DCP byte entry, which inspect, reading headers, never opens
        if "tensor" in want and "/shard_" not in key:
            assert key in rows, f"{key} is not in the table"
            assert rows[key]["shape"] == list(want["shape"]) and rows[key]["dtype"] in want["tensor"], key
    assert doc["read_plan"]["read_why"], "the read path's reason is never empty"
    if doc["format"] != "dcp":  # one process wrote these: shard numbers are not ranks
        assert doc["layout"]["ranks"] in (None, 1) or name.startswith("deepspeed")


def test_accelerate_pickles_are_told_apart_by_what_accelerate_keeps_in_them(compat, cli):
    """random_states_N.pkl is a plain pickle, read and never loaded; custom_checkpoint_N.pkl, a registered object's
    state_dict, is a torch.save its resume loads: it was called RNG states, then left unloaded, and the restore
    missed an SWALR's state (test_compat_restore compares its values with what Accelerate loads)."""
    from ckptbench.sources import open_source

    root = compat("accelerate_two_models").root
    doc = _inspect(cli, root)
    why = {u["path"]: u["why"] for u in doc["layout"]["unloaded"]}
    assert set(why) == {"random_states_0.pkl"} and "RNG states" in why["random_states_0.pkl"]
    assert "custom_checkpoint_0.pkl" in open_source(root).list().layout.state_files


@pytest.mark.parametrize("name", ["accelerate_two_models", "accelerate_two_models_bin"])
def test_a_second_model_and_its_optimizer_are_listed_as_the_first_ones_are(name, compat):
    """The layout (check's and run's JSON) listed both models' files and only the first optimizer's:
    optimizer_1.bin, which the restore loads, was missing from optimizer_files."""
    from ckptbench.sources import open_source

    lay = open_source(compat(name).root).list().layout.describe()
    assert lay["optimizer_files"] == ["optimizer.bin", "optimizer_1.bin"], lay
    assert len(lay["model_files"]) == 2, lay


def test_inspect_tensors_glob_filters_the_table_in_json_and_text(compat, cli):
    c = compat("hf_sharded")
    doc = _inspect(cli, c.root, "--tensors", "*embed*")
    assert doc["tensors"] and all("embed" in t["name"] for t in doc["tensors"])
    r = cli("inspect", c.root, "--tensors", "*embed*")
    assert r.rc == 0 and "tensors matching '*embed*': " in r.out
    row = next(t for t in doc["tensors"])
    assert row["name"] in r.out and row["file"] in r.out


def test_zero3_placeholders_are_called_placeholders(compat, cli):
    doc = _inspect(cli, compat("deepspeed_zero3").root)
    assert doc["groups"]["model"]["params"] == 0
    assert any("placeholders" in n and "optim_states" in n for n in doc["layout"]["notes"])
    two = _inspect(cli, compat("deepspeed_zero2").root)
    assert two["groups"]["model"]["params"] > 0 and not two["layout"]["notes"]


def test_trainer_output_dir_restores_the_whole_state_of_the_last_checkpoint_in_staged_mode_too(compat, cli, tmp_path):
    c = compat("trainer_outdir_final")
    for mode in ("fused", "staged"):
        r = cli("run", c.root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
        assert r.rc == 0, r.err
        doc = json.loads(r.out)
        assert doc["source"] == c.picked and doc["layout"]["root"] == "checkpoint-10"
        assert "get_last_checkpoint" in doc["layout"]["why"] and "--pick ." in doc["layout"]["why"]
        skipped = {s["path"] for s in doc["layout"]["not_read"]}
        assert {"checkpoint-3", "checkpoint-6", "checkpoint-9", "model.safetensors"} <= skipped
    r = cli("run", c.root, "--pick", ".", "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)  # the final model alone: its weights and nothing of any checkpoint-N
    assert doc["source"] == c.root and doc["layout"]["why"] == "--pick ."
    assert doc["bytes"] < sum(os.path.getsize(os.path.join(c.picked, n)) for n in os.listdir(c.picked))


def test_accelerate_rng_pickle_is_said_to_be_read_and_not_loaded(compat, cli, tmp_path):
    c = compat("accelerate_state")
    r = cli("run", c.root, "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    assert "read, not loaded: random_states_0.pkl" in r.out


def test_lightning_inf_bookkeeping_is_named_normal_in_the_check(compat, cli, tmp_path):
    c = compat("lightning_ckpt")
    r = cli("run", c.root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    note = json.loads(r.out)["notes"]["check"]
    assert "bookkeeping value(s) hold NaN/Inf on purpose" in note and "kth_value" in note


def test_torchtitan_dump_folder_loads_and_verifies_the_same_step_as_run(compat, cli, tmp_path):
    c = compat("torchtitan_dump")
    r = cli("load", c.root, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["source"] == c.picked and doc["layout"]["root"] == "checkpoint/step-10"
    r = cli("verify", c.root, "--json")
    assert r.rc == 3 and json.loads(r.out)["source"] == c.picked
    r = cli("run", c.root, "--pick", "checkpoint/step-5", "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0 and json.loads(r.out)["source"].endswith("checkpoint/step-5"), r.err
