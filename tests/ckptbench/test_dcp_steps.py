"""A folder of DCP checkpoints, as torchtitan keeps them (checkpoint/step-N): the largest step is restored, as
torchtitan's resume picks it, and no other is read; a folder of differently named DCP checkpoints is ambiguous and
says so in one line (it used to read every step's files)."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed.checkpoint as dcp


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
    from ckptbench import restore

    state = restore.load_state(doc["source"], "dcp")
    assert torch.equal(state.model["w"], torch.full((32, 32), 100.0))


def test_differently_named_dcp_checkpoints_are_ambiguous(tmp_path, h):
    root = tmp_path / "runs"
    _save(root / "a", 1.0)
    _save(root / "b", 2.0)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc != 0 and r.out == "" and len(r.err_lines) == 1, r.err
    assert "holds 2 DCP checkpoints (a, b) and nothing saying which to restore" in r.err_lines[0]
