"""A folder of numbered checkpoints, as torchtitan keeps them (checkpoint/step-N, DCP) and as a Hugging Face
Trainer does (output_dir/checkpoint-N): the largest N is restored, as their resumes pick it, and no other is read;
a folder of differently named DCP checkpoints is ambiguous and says so in one line (both used to read every
checkpoint's files)."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file


def _save(path, value: float) -> dict:
    sd = {"model": {"w": torch.full((32, 32), value)}, "optimizer": {"state": {"w": {"exp_avg": torch.zeros(32, 32)}}}}
    dcp.save(sd, checkpoint_id=str(path))
    return sd


def test_the_largest_step_is_restored_and_no_other(tmp_path, h):
    root = tmp_path / "checkpoint"
    for step in (90, 100, 20):  # 100 > 90 as numbers, not as names
        _save(root / f"step-{step}", float(step))
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["source"] == str(root / "step-100") and doc["format"] == "dcp"
    assert doc["bytes"] == sum(os.path.getsize(p) for p in (root / "step-100").iterdir())
    from ckptbench.restore import load as restore

    state = restore.load_state(doc["source"], "dcp")
    assert torch.equal(state.model["w"], torch.full((32, 32), 100.0))


def test_differently_named_dcp_checkpoints_are_ambiguous(tmp_path, h):
    root = tmp_path / "runs"
    _save(root / "a", 1.0)
    _save(root / "b", 2.0)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc != 0 and r.out == "" and len(r.err_lines) == 1, r.err
    assert "2 DCP checkpoints (a, b) and nothing saying which a resume loads" in r.err_lines[0]
    assert "--pick" in r.err_lines[0]


def test_a_trainer_output_dir_restores_its_last_checkpoint(tmp_path, h):
    out = tmp_path / "output_dir"
    for n in (90, 100):
        d = out / f"checkpoint-{n}"
        d.mkdir(parents=True)
        save_file({"w": torch.full((16, 16), float(n))}, str(d / "model.safetensors"))
        torch.save({"state": {0: {"exp_avg": torch.zeros(16, 16)}}, "param_groups": [{"params": [0]}]},
                   d / "optimizer.pt")
        (d / "trainer_state.json").write_text(json.dumps({"global_step": n}))
    (out / "config.json").write_text("{}")
    r = h.run_cli("run", out, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["source"] == str(out / "checkpoint-100") and doc["format"] == "safetensors"
    assert doc["bytes"] == sum(os.path.getsize(p) for p in (out / "checkpoint-100").iterdir())


def test_pick_chooses_among_ambiguous_checkpoints_and_says_so(tmp_path, h):
    root = tmp_path / "runs"
    _save(root / "a", 1.0)
    _save(root / "b", 2.0)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--pick", "b", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["source"] == str(root / "b") and doc["layout"]["why"] == "--pick b"
    assert doc["bytes"] == sum(os.path.getsize(p) for p in (root / "b").iterdir())
    for bad in ("c", "../runs/a", "/etc"):
        r = h.run_cli("run", root, "--repeat", "1", "--pick", bad, "--results", tmp_path / "R.csv")
        assert r.rc == 2 and len(r.err_lines) == 1 and "--pick" in r.err_lines[0], r.err


def test_metadata_with_bytes_after_its_pickle_or_beyond_any_real_size_is_refused(tmp_path, h):
    root = tmp_path / "ck"
    _save(root, 1.0)
    with open(root / ".metadata", "ab") as f:
        f.write(b"\0" * 4096)
    for cmd in ("inspect", "load"):
        r = h.run_cli(cmd, root)
        assert r.rc != 0 and len(r.err_lines) == 1 and "bytes after the metadata's pickle" in r.err, r.err
    os.truncate(root / ".metadata", (1 << 30) + 1)  # sparse: refused by its size, before a byte is read
    r = h.run_cli("run", root, "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc != 0 and len(r.err_lines) == 1 and "more than DCP metadata holds" in r.err, r.err


def test_read_and_sweep_name_the_checkpoint_they_read(tmp_path, h):
    root = tmp_path / "runs"
    for n in (1, 2):
        _save(root / f"step-{n}", float(n))
    r = h.run_cli("read", root, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["layout"]["root"] == "step-2" and doc["layout"]["not_read"][0]["path"] == "step-1"
    r = h.run_cli("read", root, "--pick", "step-1")
    assert r.rc == 0 and r.out.startswith("read step-1 (dcp): --pick step-1"), r.out
    r = h.run_cli("sweep", root, "--levels", "1,2", "--repeat", "1", "--cache", "as-is", "--json")
    assert r.rc == 0 and json.loads(r.out)["layout"]["root"] == "step-2", r.err
    r = h.run_cli("read", root / "step-1", root / "step-2", "--pick", "step-1")
    assert r.rc == 2 and "one checkpoint directory" in r.err
