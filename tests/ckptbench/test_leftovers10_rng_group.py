"""A training loop's torch RNG state saved beside its weights (cpu_rng_state, cuda_rng_state, rng_state) is not a
model weight: a flat torch.save of weights and cpu_rng_state made it one (inspect counted it in `model`, and the
restore and `save` took it as a weight), and beside {"model", "optimizer"} inspect grouped it as `model`."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from clirun import run_cli

from ckptbench.checkpoint.formats import group_of
from ckptbench.restore.load import load_state


def _net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def _trained():
    torch.manual_seed(0)
    model = _net()
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    return model, opt


def _groups(path) -> tuple[dict, dict]:
    r = run_cli("inspect", path, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    return {t["name"]: t["group"] for t in doc["tensors"]}, doc["groups"]


RNG = {"cpu_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.get_rng_state(),
       "rng_state": torch.get_rng_state()}


def test_a_flat_state_dict_with_rng_states_keeps_them_out_of_the_weights(tmp_path):
    model, _ = _trained()
    sd = model.state_dict()
    src = tmp_path / "src"
    src.mkdir()
    torch.save({**sd, **RNG}, src / "checkpoint.pt")
    names, groups = _groups(src)
    assert {n for n, g in names.items() if g == "model"} == set(sd)
    assert {n for n, g in names.items() if g == "other"} == set(RNG)
    assert groups["model"]["tensors"] == len(sd) and groups["other"]["tensors"] == len(RNG)
    state = load_state(str(src), "torch")
    assert set(state.model) == set(sd) and set(RNG) <= set(state.extra)
    _net().load_state_dict(state.model)  # strict: an RNG state among the weights is an unexpected key
    r = run_cli("save", src, tmp_path / "t", "--count", "1", "--format", "torch")
    assert r.rc == 0, r.err
    step = tmp_path / "t" / "step-000001"
    assert set(torch.load(step / "model_rank000.pt", weights_only=True)) == set(sd)
    trainer = torch.load(step / "optim_rank000.pt", weights_only=True)["trainer_state"]
    assert torch.equal(trainer["cpu_rng_state"], RNG["cpu_rng_state"])


def test_a_loops_dict_groups_its_rng_state_as_other(tmp_path):
    model, opt = _trained()
    src = tmp_path / "src"
    src.mkdir()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "cpu_rng_state": torch.get_rng_state(),
                "numpy_rng_state": np.random.get_state()}, src / "checkpoint.pt")
    names, groups = _groups(src)
    assert names["cpu_rng_state"] == "other"
    assert groups["model"]["tensors"] == len(model.state_dict())
    assert set(load_state(str(src), "torch").model) == set(model.state_dict())


@pytest.mark.parametrize("key", ["cpu_rng_state", "cuda_rng_state", "rng_state", "rng_states", "rng_state_3",
                                 "numpy_random_state", "torch_rng.cpu", "zero_pp_rank_0.rng_state"])
def test_rng_state_names_are_other(key):
    assert group_of(key) == "other"


@pytest.mark.parametrize("key", ["strng.weight", "encoder.rng.weight", "ranges.weight", "random_proj.weight",
                                 "layers.0.mlp.weight"])
def test_weights_whose_names_only_look_alike_stay_model(key):
    assert group_of(key) == "model"
