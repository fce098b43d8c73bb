"""`save` of a checkpoint whose optimizer is a torch optimizer's own state_dict (keyed by parameter index): a training
loop's torch.save, a Hugging Face Trainer's optimizer.pt, DCP's by-name state. Every moment is saved under its
weight's name and equals the source's, read back with safetensors and torch directly; where the indices cannot be
matched to names for certain, the note says what was left out and why, and the figures are the writes'."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
from clirun import run_cli
from safetensors import safe_open
from test_hf_trainer import _write_trainer_dir

MOMENTS = ("exp_avg", "exp_avg_sq")


def _stepped(model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int = 1, inputs=None) -> None:
    """Real optimizer steps on a real loss: every moment moves off zero."""
    torch.manual_seed(1)
    for _ in range(steps):
        opt.zero_grad()
        x = inputs() if inputs else torch.randn(4, model[0].in_features)
        model(x).square().mean().backward()
        opt.step()


def _loop_checkpoint(root, model: torch.nn.Module, opt: torch.optim.Optimizer) -> str:
    """What a plain training loop writes: one torch.save of model, optimizer and step."""
    src = root / "src"
    src.mkdir()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1}, src / "ckpt.pt")
    return str(src)


def _mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))


def _save(src, target, *args) -> dict:
    r = run_cli("save", src, target, "--count", "2", "--results", "", "--json", *args)
    assert r.rc == 0, r.err
    return json.loads(r.out)


def _saved(target, doc) -> str:
    return os.path.join(target, doc["saves"][-1]["name"])


def _optimizer_file(folder) -> tuple[dict[str, torch.Tensor], dict]:
    """The safetensors optimizer shard as safetensors reads it: tensors and ckptbench's metadata."""
    with safe_open(os.path.join(folder, "optimizer-00001-of-00001.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["ckptbench_optimizer"])


def _assert_moments(saved: dict[str, torch.Tensor], opt_sd: dict, names: dict[int, str], parts=MOMENTS) -> None:
    """Every moment of the source, by index, present under its weight's name and equal; nothing else saved."""
    want = {f"{names[i]}.{k}": st[k] for i, st in opt_sd["state"].items() for k in parts}
    assert sorted(saved) == sorted(want)
    for key, t in want.items():
        assert saved[key].dtype == t.dtype and torch.equal(saved[key], t), key
        assert saved[key].abs().sum() > 0, key  # a real step: an all-zero moment would pass for a lost one


def _param_names(model: torch.nn.Module) -> dict[int, str]:
    return dict(enumerate(n for n, _ in model.named_parameters()))


def test_a_training_loops_torch_save_keeps_every_moment_under_its_weights_name(tmp_path):
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters())
    _stepped(model, opt)
    src = _loop_checkpoint(tmp_path, model, opt)
    doc = _save(src, tmp_path / "t")
    tensors, meta = _optimizer_file(_saved(tmp_path / "t", doc))
    _assert_moments(tensors, opt.state_dict(), _param_names(model))
    assert meta["step"] == 1  # AdamW's per-parameter step tensors, all 1, are the save's step
    assert not any("not saved" in n or "NOT saved" in n for n in doc["notes"]), doc["notes"]
    assert any("saved under their weights' names" in n for n in doc["notes"]), doc["notes"]
    moments = sum(t.numel() * t.element_size() for st in opt.state_dict()["state"].values() for t in st.values()
                  if t.dim())
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    assert doc["bytes"] > weights + moments  # the figures cover the optimizer too
    files = sum(os.path.getsize(os.path.join(_saved(tmp_path / "t", doc), n))
                for n in os.listdir(_saved(tmp_path / "t", doc)) if n != "ckptbench.json")
    assert doc["bytes"] == files


def test_the_torch_format_saves_the_moments_too(tmp_path):
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters())
    _stepped(model, opt)
    doc = _save(_loop_checkpoint(tmp_path, model, opt), tmp_path / "t", "--format", "torch")
    saved = torch.load(os.path.join(_saved(tmp_path / "t", doc), "optim_rank000.pt"), weights_only=True)
    flat = {f"{n}.{k}": t for n, parts in saved["state"].items() for k, t in parts.items()}
    _assert_moments(flat, opt.state_dict(), _param_names(model))
    assert saved["step"] == 1


def test_a_trainers_optimizer_pt_beside_pytorch_model_bin_is_saved_by_name(tmp_path):
    root = tmp_path / "checkpoint-1"
    saved = _write_trainer_dir(str(root), "bin", tmp_path / "MARKER")
    doc = _save(root, tmp_path / "t")
    tensors, meta = _optimizer_file(_saved(tmp_path / "t", doc))
    names = dict(enumerate(saved["weights"]))  # Tiny's state dict: its parameters, in the order AdamW got them
    _assert_moments(tensors, saved["optimizer.pt"], names)
    assert meta["step"] == 1
    # the RNG state is not a moment: it stays out, and is said to
    assert any("outside model and optimizer" in n and "rng_state" in n for n in doc["notes"]), doc["notes"]
    # safetensors holds no tensor beside its JSON: the note says which formats keep the RNG state
    assert any("RNG state, which --format torch or dcp keeps" in n for n in doc["notes"]), doc["notes"]
    assert not (tmp_path / "MARKER").exists()


def test_beside_model_safetensors_the_order_is_lost_so_the_optimizer_is_left_out_and_said_to_be(tmp_path):
    """safetensors lists the weights by name (embed, lm_head, proj.bias, proj.weight), not in the model's order:
    by position, same-shaped layers would take each other's moments."""
    root = tmp_path / "checkpoint-1"
    saved = _write_trainer_dir(str(root), "safetensors", tmp_path / "MARKER")
    doc = _save(root, tmp_path / "t")
    tensors, meta = _optimizer_file(_saved(tmp_path / "t", doc))
    assert tensors == {} and "optimizer" not in meta["trainer_state"]  # left out: its param_groups go with it
    # the numpy RNG state beside it has its own note now (non-tensor values not saved): not counted here
    left = [n for n in doc["notes"] if "NOT saved" in n and "non-tensor value" not in n]
    assert len(left) == 1 and "optimizer.state" in left[0] and "no parameter names" in left[0], doc["notes"]
    assert any("left out" in n and "not the checkpoint's" in n for n in doc["notes"]), doc["notes"]
    weights = sum(t.numel() * t.element_size() for t in saved["weights"].values())
    carried = len(json.dumps(meta))  # the scheduler, scaler and Python RNG state now travel in the metadata
    assert weights < doc["bytes"] < weights + carried + 4096  # the weights and the files' headers: no moments


def test_a_trainers_decay_and_no_decay_groups_are_matched_group_by_group(tmp_path):
    """Trainer.create_optimizer: weights in one group, biases and LayerNorm weights in another, each in the model's
    order; by position alone group 0's weights would meet the model's biases."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8))
    no_decay = {n for n, _ in model.named_parameters() if n.endswith("bias") or n.startswith("1.")}
    groups = [{"params": [p for n, p in model.named_parameters() if n not in no_decay], "weight_decay": 0.01},
              {"params": [p for n, p in model.named_parameters() if n in no_decay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups)
    _stepped(model, opt)
    doc = _save(_loop_checkpoint(tmp_path, model, opt), tmp_path / "t")
    order = [n for n, _ in model.named_parameters() if n not in no_decay] + [n for n, _ in model.named_parameters()
                                                                            if n in no_decay]
    tensors, _ = _optimizer_file(_saved(tmp_path / "t", doc))
    _assert_moments(tensors, opt.state_dict(), dict(enumerate(order)))
    assert any("group by group" in n for n in doc["notes"]), doc["notes"]


def _batchnorm_mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.BatchNorm1d(128), torch.nn.Linear(128, 32))


def test_param_names_match_where_float_buffers_break_the_order(tmp_path):
    model = _batchnorm_mlp()
    opt = torch.optim.AdamW(model.named_parameters())  # torch then saves param_names in param_groups
    _stepped(model, opt)
    doc = _save(_loop_checkpoint(tmp_path, model, opt), tmp_path / "t")
    tensors, _ = _optimizer_file(_saved(tmp_path / "t", doc))
    _assert_moments(tensors, opt.state_dict(), _param_names(model))


def test_an_optimizer_that_cannot_be_matched_is_said_to_be_left_out_and_the_figures_are_the_writes(tmp_path):
    model = _batchnorm_mlp()  # running_mean and running_var: 8 floating tensors for 6 parameters, no names saved
    opt = torch.optim.AdamW(model.parameters())
    _stepped(model, opt)
    src = _loop_checkpoint(tmp_path, model, opt)
    doc = _save(src, tmp_path / "t", "--interval", "0.5")
    tensors, _ = _optimizer_file(_saved(tmp_path / "t", doc))
    assert tensors == {}
    left = [n for n in doc["notes"] if "NOT saved" in n]
    assert len(left) == 1 and "optimizer.state" in left[0] and "6 parameter(s)" in left[0] \
        and "8 floating tensor(s)" in left[0], doc["notes"]
    assert any("left out" in n and "not the checkpoint's" in n for n in doc["notes"]), doc["notes"]
    assert not any("outside model and optimizer" in n for n in doc["notes"])  # said once, not twice
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    moments = sum(t.numel() * t.element_size() for st in opt.state_dict()["state"].values() for t in st.values())
    assert weights < doc["bytes"] < weights + moments  # what was written: the model (and headers), no moments
    last = doc["saves"][-1]
    assert doc["sustained_gbps"] == pytest.approx(last["bytes"] / last["durable_s"] / 1e9)
    assert doc["needed_gbps"] == pytest.approx(doc["bytes"] / 0.5 / 1e9)


def test_groups_that_fit_the_model_more_than_one_way_are_not_guessed(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(32, 32, bias=False) for _ in range(4)])
    p = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [p[0], p[2]]}, {"params": [p[1], p[3]], "lr": 1e-4}])
    _stepped(model, opt)
    doc = _save(_loop_checkpoint(tmp_path, model, opt), tmp_path / "t")
    assert _optimizer_file(_saved(tmp_path / "t", doc))[0] == {}
    assert any("NOT saved" in n and "not certain" in n for n in doc["notes"]), doc["notes"]


def test_sgd_momentum_and_steps_that_differ_are_saved_as_they_are(tmp_path):
    """A part that is not AdamW's (momentum_buffer) and per-parameter steps that differ (a weight first used in
    the second step) are written, not dropped."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _stepped(model, sgd)
    doc = _save(_loop_checkpoint(tmp_path, model, sgd), tmp_path / "sgd")
    tensors, _ = _optimizer_file(_saved(tmp_path / "sgd", doc))
    _assert_moments(tensors, sgd.state_dict(), _param_names(model), parts=("momentum_buffer",))
    # read back as the optimizer's, not as more weights
    from ckptbench.restore.load import load_state

    back = load_state(str(_saved(tmp_path / "sgd", doc)), "safetensors")
    assert set(back.model) == set(_param_names(model).values()) and all(set(p) == {"momentum_buffer"}
                                                              for p in back.optim.values()), back.optim.keys()

    adam = torch.optim.AdamW(model.parameters())
    model.zero_grad()
    model[0].weight.grad = torch.ones_like(model[0].weight)  # one weight stepped alone, then all of them
    adam.step()
    _stepped(model, adam)
    steps = {float(st["step"]) for st in adam.state_dict()["state"].values()}
    assert steps == {1.0, 2.0}
    doc = _save(_loop_checkpoint(tmp_path / "sgd", model, adam), tmp_path / "adam")
    tensors, _ = _optimizer_file(_saved(tmp_path / "adam", doc))
    _assert_moments(tensors, adam.state_dict(), _param_names(model), parts=MOMENTS + ("step",))


def test_dcp_optimizer_state_keyed_by_name_is_saved(tmp_path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    model = _mlp()
    opt = torch.optim.AdamW(model.parameters())
    _stepped(model, opt)
    osd = get_optimizer_state_dict(model, opt)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"model": get_model_state_dict(model), "optimizer": osd}, checkpoint_id=str(tmp_path / "src"),
                 no_dist=True)
    doc = _save(tmp_path / "src", tmp_path / "t")
    tensors, meta = _optimizer_file(_saved(tmp_path / "t", doc))
    want = {f"{n}.{k}": st[k] for n, st in osd["state"].items() for k in MOMENTS}
    assert sorted(tensors) == sorted(want) and all(torch.equal(tensors[k], t) for k, t in want.items())
    assert meta["step"] == 1
