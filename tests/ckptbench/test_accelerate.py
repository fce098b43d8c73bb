"""Accelerate's save_state directory (model.safetensors or pytorch_model.bin, optimizer.bin, scheduler.bin,
random_states_0.pkl): the optimizer and scheduler are torch.save files a resume deserializes, so the restore loads
them, under their stems, in fused and staged mode (they used to be read and never loaded: two thirds of the bytes
left out of the load stage); the plain-pickle random states are read, never unpickled."""

from __future__ import annotations

import json
import pickle
import random

import pytest
import torch
from safetensors.torch import save_file

MODES = ("fused", "staged")


def _save_state(root, weights: str) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 32)).sum().backward()
    opt.step()
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if weights == "safetensors":
        save_file(sd, str(root / "model.safetensors"))
    else:
        torch.save(sd, root / "pytorch_model.bin")
    torch.save(opt.state_dict(), root / "optimizer.bin")
    torch.save({"last_epoch": 1, "_step_count": 2}, root / "scheduler.bin")
    (root / "random_states_0.pkl").write_bytes(pickle.dumps({"step": 0, "random_state": random.getstate()}))
    return {"model": sd, "optimizer": opt.state_dict()}


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
@pytest.mark.parametrize("mode", MODES)
def test_the_optimizer_and_scheduler_are_loaded_under_their_stems(tmp_path, h, weights, mode):
    root = tmp_path / "acc"
    root.mkdir()
    saved = _save_state(root, weights)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["status"] == "unverified"

    from ckptbench.restore import load as restore
    from ckptbench.sources.local import LocalSource

    listing = LocalSource(str(root), checkpoint=True).list()
    shards = [f.path for f in listing.files if f.path.endswith(restore.SHARD_EXT[listing.format])]
    state = restore.load_state(listing.source, listing.format, shards=shards)
    for k, t in saved["model"].items():
        assert torch.equal(state.model[k], t), k
    for i, parts in saved["optimizer"]["state"].items():
        for part in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state.extra[f"optimizer.state.{i}.{part}"], parts[part])
    assert state.extra["scheduler.last_epoch"] == 1


def test_inspect_counts_the_optimizer(tmp_path, h):
    root = tmp_path / "acc"
    root.mkdir()
    saved = _save_state(root, "safetensors")
    doc = json.loads(h.run_cli("inspect", root, "--json").out)
    moments = [t for parts in saved["optimizer"]["state"].values() for k, t in parts.items() if k != "step"]
    steps = [parts["step"] for parts in saved["optimizer"]["state"].values()]
    assert doc["groups"]["optimizer"]["bytes"] == sum(t.nbytes for t in moments + steps)
