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


# ---- FSDP's sharded state dict (the real one, written by Accelerate's own save: tests/compat trainer_fsdp_sharded) --


def _fsdp_folder(root, optimizer_metadata: bool = True, extra_dcp: bool = False):
    """A Trainer checkpoint of an FSDP run laid out as Accelerate's save_fsdp_model / save_fsdp_optimizer lay it
    out, written by DCP itself: {"model": …} in pytorch_model_fsdp_0, {"optimizer": …} in optimizer_0."""
    import warnings

    import torch.distributed.checkpoint as dcp

    m = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(m.parameters())
    m(torch.randn(2, 4)).sum().backward()
    opt.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": m.state_dict()}, checkpoint_id=str(root / "pytorch_model_fsdp_0"), no_dist=True)
        dcp.save({"optimizer": opt.state_dict()}, checkpoint_id=str(root / "optimizer_0"), no_dist=True)
        if extra_dcp:
            dcp.save({"w": torch.zeros(2)}, checkpoint_id=str(root / "exported"), no_dist=True)
    if not optimizer_metadata:
        (root / "optimizer_0" / ".metadata").unlink()
    torch.save({"last_epoch": 1}, root / "scheduler.pt")
    (root / "trainer_state.json").write_text('{"global_step": 1}')
    return m


def test_an_fsdp_trainer_checkpoint_is_one_checkpoint_of_two_dcp_folders(tmp_path, h):
    """It was refused as 'weight files at the top beside 2 folder(s) of checkpoints': the model and optimizer folders
    and scheduler.pt are one resume's state."""
    root = tmp_path / "checkpoint-1"
    root.mkdir()
    m = _fsdp_folder(root, extra_dcp=True)
    r = h.run_cli("inspect", root, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["layout"]["name"] == "hf-trainer"
    assert doc["layout"]["dcp_dirs"] == ["optimizer_0", "pytorch_model_fsdp_0"]
    assert any(n["path"].startswith("exported/") for n in doc["layout"]["not_read"])
    from ckptbench.restore import load as restore

    state = restore.load_state(str(root), "dcp")
    assert torch.equal(state.model["weight"], m.weight.detach())
    assert "optimizer.state.0.exp_avg" in state.extra and state.extra["scheduler.last_epoch"] == 1
    assert not any(k.startswith("w") and k != "weight" for k in state.model)  # exported/ is not read


def test_an_fsdp_optimizer_folder_cut_short_is_one_line(tmp_path, h):
    root = tmp_path / "checkpoint-1"
    root.mkdir()
    _fsdp_folder(root, optimizer_metadata=False)
    r = h.run_cli("run", root, "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 2 and len(r.err_lines) == 1, r.err
    assert "optimizer_0: DCP shards without their .metadata" in r.err_lines[0]


def _state_run_restores(root, monkeypatch):
    """The repeat's result and the state `run`'s own repeat hands its check (None when it did not get there)."""
    from ckptbench.restore import runner
    from ckptbench.restore.repeat import RunOptions

    seen, check = [], runner._check
    monkeypatch.setattr(runner, "_check", lambda restored, state, *a, **k: seen.append(state) or check(
        restored, state, *a, **k))
    reps = runner.run(str(root), RunOptions(), repeats=1)
    return reps[0], (seen[0] if seen else None)


def test_an_fsdp_restore_lands_both_folders_chunks_by_range(tmp_path, monkeypatch):
    """Both folders were read whole and every chunk copied out of them, a second fresh copy of the state; now their
    chunks land by range, as a lone DCP folder's do, and the state is the whole-file load's."""
    from ckptbench.restore import load as restore

    root = tmp_path / "checkpoint-1"
    root.mkdir()
    _fsdp_folder(root)
    rep, state = _state_run_restores(root, monkeypatch)
    assert rep.status in ("ok", "unverified"), rep.problems
    assert rep.read_why.startswith("byte ranges"), rep.read_why
    assert "read by range" in rep.notes.get("load", ""), rep.notes
    want = restore.load_state(str(root), "dcp")
    got = {n: t for _, n, t in state.tensors()}
    assert set(got) == {n for _, n, t in want.tensors()} and got
    for g, n, t in want.tensors():
        assert torch.equal(got[n], t), n
    assert state.extra["scheduler.last_epoch"] == 1


@pytest.mark.parametrize("key", ["model.weight", "weight"])
def test_two_fsdp_folders_naming_one_tensor_fail_the_restore_by_range_too(tmp_path, monkeypatch, key):
    """A tensor two folders both hold is refused by the whole-file load (a resume takes one of the two); read by
    range it must be too: the same key keeps the whole-file read, another key for the same name ('weight' beside
    'model.weight', both the model's weight) is merged apart from the pieces."""
    import warnings

    import torch.distributed.checkpoint as dcp

    root = tmp_path / "checkpoint-1"
    root.mkdir()
    _fsdp_folder(root)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = {"model": {"weight": torch.full((3, 4), 7.0)}} if key == "model.weight" else \
            {"weight": torch.full((3, 4), 7.0)}
        dcp.save(state, checkpoint_id=str(root / "optimizer_0"), no_dist=True)
    from ckptbench.checkpoint.formats import FormatError

    with pytest.raises(FormatError, match="pytorch_model_fsdp_0 holds 'weight', also in optimizer_0"):
        _state_run_restores(root, monkeypatch)
