"""Which checkpoints get a model step: a config.json names a shape, but only weights that are ckptbench's GPT's of
that shape make one. A Hugging Face GPT-2 directory (the same config fields over other weights) gets the
structural check and says why, in fused and staged mode and in inspect alike; ckptbench's own checkpoint with its
manifest gone still gets its model step from config.json, in both modes (fused mode used to miss the config: it
sat in a read buffer that json could not parse)."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from safetensors.torch import save_file

MODES = ("fused", "staged")


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """The layout and key names of a Hugging Face GPT-2 (2 layers, width 64), with its config.json."""
    root = tmp_path_factory.mktemp("gpt2")
    layers, width, vocab, positions = 2, 64, 1000, 128
    sd = {"wte.weight": torch.randn(vocab, width), "wpe.weight": torch.randn(positions, width),
          "ln_f.weight": torch.ones(width), "ln_f.bias": torch.zeros(width)}
    for i in range(layers):
        p = f"h.{i}."
        sd |= {p + "ln_1.weight": torch.ones(width), p + "attn.c_attn.weight": torch.randn(width, 3 * width),
               p + "attn.c_proj.weight": torch.randn(width, width), p + "mlp.c_fc.weight": torch.randn(width, 4 * width),
               p + "mlp.c_proj.weight": torch.randn(4 * width, width)}
    save_file(sd, str(root / "model.safetensors"), metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps({
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_layer": layers, "n_embd": width, "n_head": 4,
        "vocab_size": vocab, "n_positions": positions}))
    return str(root)


@pytest.mark.parametrize("mode", MODES)
def test_a_gpt2_directory_gets_the_structural_check_and_says_why(gpt2_dir, h, tmp_path, mode):
    r = h.run_cli("run", gpt2_dir, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err  # staged mode used to fail: "checkpoint does not fit the model"
    doc = json.loads(r.out)
    assert doc["check"] == "structural"
    assert "these weights are another model's, not the GPT `ckptbench gen` writes" in doc["notes"]["load"]
    assert doc["notes"]["check"].startswith("structural check, no model step")


def test_inspect_agrees_with_the_run(gpt2_dir, h):
    r = h.run_cli("inspect", gpt2_dir, "--json")
    assert r.rc == 0, r.err
    check = json.loads(r.out)["check"]
    assert check.startswith("structural, no model step (config.json gives a model shape, but these weights are another")


@pytest.fixture(scope="module")
def no_manifest(ckpt, tmp_path_factory):
    """ckptbench's own safetensors checkpoint with its manifest removed: config.json is all that gives the shape."""
    root = tmp_path_factory.mktemp("nomanifest") / "ck"
    shutil.copytree(ckpt("safetensors", 1), root)
    os.remove(root / "ckptbench.json")
    assert (root / "config.json").exists()
    return str(root)


@pytest.mark.parametrize("mode", MODES)
def test_our_own_weights_with_config_json_get_a_model_step_in_both_modes(no_manifest, h, tmp_path, mode):
    r = h.run_cli("run", no_manifest, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["check"] == "model step", doc["notes"]
    assert "load" not in doc["notes"] or "another model's" not in doc["notes"]["load"]
    r = h.run_cli("inspect", no_manifest, "--json")
    assert json.loads(r.out)["check"].startswith("model step")


def test_weights_shipped_twice_are_read_once_from_the_safetensors(gpt2_dir, h, tmp_path):
    """Hugging Face repos often carry pytorch_model.bin beside model.safetensors: transformers reads only the
    latter, and so does the restore (reading both would double the weights' bytes)."""
    from safetensors.torch import load_file

    root = tmp_path / "both"
    shutil.copytree(gpt2_dir, root)
    torch.save(load_file(str(root / "model.safetensors")), root / "pytorch_model.bin")
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["format"] == "safetensors"
    assert doc["bytes"] == sum(os.path.getsize(root / n) for n in ("model.safetensors", "config.json"))
    r = h.run_cli("inspect", root, "--json")
    skipped = json.loads(r.out)["layout"]["not_read"]
    assert [s["path"] for s in skipped] == ["pytorch_model.bin"] and "safetensors copy is read" in skipped[0]["why"]


def test_a_trainer_directory_with_both_loads_the_safetensors_weights_alone():
    from ckptbench.checkpoint import layouts

    rels = ["model.safetensors", "pytorch_model.bin", "optimizer.pt", "scheduler.pt", "trainer_state.json"]
    lay = layouts.select("/nonexistent", rels)
    assert lay.name == "hf-trainer"
    assert lay.model_files == ("model.safetensors",) and "pytorch_model.bin" not in lay.files
    assert [p for p, _ in lay.skipped] == ["pytorch_model.bin"]
