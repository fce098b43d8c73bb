"""`save` of a checkpoint whose torch optimizer state is crafted: real torch.save files, each either saved right
(every moment under its own weight, equal to the source) or left out with a note that says why; never a traceback,
never a moment under another weight, and work bounded by the file (a million ids, thousands of groups or
optimizers)."""

from __future__ import annotations

import copy
import json
import os
import time

import torch
from clirun import run_cli
from safetensors import safe_open

from ckptbench.restore.load import load_state
from ckptbench.save import optimizer


def _same_shaped() -> tuple[dict, dict]:
    """Four 8x8 layers (position alone cannot tell them apart) and AdamW's state after one real step."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8, bias=False) for _ in range(4)])
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).square().mean().backward()
    opt.step()
    return model.state_dict(), opt.state_dict()


def _source(tmp_path, opt: dict, weights: dict, **more) -> str:
    src = tmp_path / "src"
    src.mkdir()
    torch.save({"model": weights, "optimizer": opt, "step": 1, **more}, src / "ckpt.pt")
    return str(src)


def _save(src: str, target, *args) -> tuple[dict, dict[str, torch.Tensor]]:
    """The save's JSON document and what its optimizer file holds, as safetensors reads it."""
    r = run_cli("save", src, target, "--count", "1", "--keep", "1", "--results", "", "--json", *args)
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    folder = os.path.join(target, doc["saves"][-1]["name"])
    with safe_open(os.path.join(folder, "optimizer-00001-of-00001.safetensors"), "pt") as f:
        return doc, {k: f.get_tensor(k) for k in f.keys()}


def _left_out(doc: dict) -> list[str]:
    return [n for n in doc["notes"] if "NOT saved" in n]


def test_a_parameter_listed_twice_puts_no_moment_under_another_weight(tmp_path):
    weights, sd = _same_shaped()
    sd["param_groups"][0]["params"] = [0, 1, 1, 3]  # torch refuses this; before, 1's moments went to layer 2
    doc, saved = _save(_source(tmp_path, sd, weights), tmp_path / "t")
    assert saved == {}
    assert any("more than once" in n for n in _left_out(doc)), doc["notes"]


def test_a_parameter_name_saved_twice_is_not_trusted(tmp_path):
    weights, sd = _same_shaped()
    sd["param_groups"][0]["param_names"] = ["0.weight", "0.weight", "2.weight", "3.weight"]
    doc, saved = _save(_source(tmp_path, sd, weights), tmp_path / "t")
    assert saved == {}  # before: id 1's moments replaced id 0's under 0.weight
    assert any("more than once" in n for n in _left_out(doc)), doc["notes"]


def test_saved_names_that_contradict_the_position_leave_the_state_out(tmp_path):
    weights, sd = _same_shaped()
    sd["param_groups"][0]["param_names"] = ["module.1.weight", "module.0.weight", "module.2.weight", "module.3.weight"]
    doc, saved = _save(_source(tmp_path, sd, weights), tmp_path / "t")
    assert saved == {}  # before: saved by position, though the file says index 0 is layer 1
    assert any("module.1.weight" in n and "not certain" in n for n in _left_out(doc)), doc["notes"]


def test_names_under_a_wrapper_prefix_in_the_models_order_are_saved(tmp_path):
    weights, sd = _same_shaped()
    sd["param_groups"][0]["param_names"] = [f"module.{n}" for n in weights]  # DDP's names, the model unwrapped
    doc, saved = _save(_source(tmp_path, sd, weights), tmp_path / "t")
    names = list(weights)
    want = {f"{names[i]}.{k}": t for i, st in sd["state"].items() for k, t in st.items() if k != "step"}
    assert sorted(saved) == sorted(want) and all(torch.equal(saved[k], t) for k, t in want.items())


def test_ids_mixing_indices_and_names_say_why_they_are_left_out(tmp_path):
    weights, sd = _same_shaped()
    sd["param_groups"][0]["params"] = ["0.weight", 1, 2, 3]
    doc, saved = _save(_source(tmp_path, sd, weights), tmp_path / "t")
    assert saved == {}
    left = _left_out(doc)
    assert len(left) == 1 and "mix indices and names" in left[0], doc["notes"]  # before: the reason was empty


def test_step_tensors_that_are_not_a_count_stay_beside_their_moments(tmp_path):
    weights, sd = _same_shaped()
    for st in sd["state"].values():
        st["step"] = torch.tensor(1 + 0j)  # before: float(complex) raised TypeError, a traceback
    doc, saved = _save(_source(tmp_path, sd, weights), tmp_path / "t")
    steps = [k for k in saved if k.endswith(".step")]
    assert len(steps) == 4 and all(saved[k].is_complex() for k in steps)
    assert any("not one count" in n for n in doc["notes"]), doc["notes"]


def test_a_step_past_2_53_is_kept_exactly_and_one_past_int64_is_not_folded(tmp_path):
    weights, sd = _same_shaped()
    big = (1 << 53) + 1  # a float would round it to 2**53
    for st in sd["state"].values():
        st["step"] = torch.tensor(big)
    (tmp_path / "a").mkdir()
    doc, _ = _save(_source(tmp_path / "a", sd, weights), tmp_path / "a" / "t")
    folder = os.path.join(tmp_path / "a" / "t", doc["saves"][-1]["name"])
    with safe_open(os.path.join(folder, "optimizer-00001-of-00001.safetensors"), "pt") as f:
        assert json.loads(f.metadata()["ckptbench_optimizer"])["step"] == big

    for st in sd["state"].values():
        st["step"] = torch.tensor(float(1 << 63))  # a whole float, but no reader takes it as a step
    (tmp_path / "b").mkdir()
    doc, saved = _save(_source(tmp_path / "b", sd, weights), tmp_path / "b" / "t")
    assert all(saved[f"{n}.step"].item() == float(1 << 63) for n in weights)


def test_a_state_key_two_optimizers_could_claim_is_neithers(tmp_path):
    t = torch.randn(8, 8)
    inner = {"param_groups": [{"params": [0]}], "state": {0: {"exp_avg": t}}}
    outer = {"param_groups": [{"params": ["x.state.0"]}], "state": {"x": inner}}  # one key, read two ways
    doc, saved = _save(_source(tmp_path, outer, {"x.state.0": torch.randn(8, 8)}), tmp_path / "t")
    assert saved == {}  # before: one adopted it, the other's note then raised KeyError
    assert len([n for n in _left_out(doc) if "another optimizer's too" in n]) == 2, doc["notes"]


def test_list_indices_written_as_no_list_writes_them_are_not_read(tmp_path):
    weights, sd = _same_shaped()
    sd["param_groups"] = {"1" * 5000: sd["param_groups"][0]}  # before: int() refused 5000 digits, a traceback
    doc, saved = _save(_source(tmp_path, sd, weights), tmp_path / "t")
    assert saved == {}
    assert any("outside model and optimizer" in n for n in doc["notes"]), doc["notes"]


def test_a_dtype_safetensors_cannot_store_is_one_line_before_any_write(tmp_path):
    weights, sd = _same_shaped()
    sd["state"][0]["exp_avg"] = sd["state"][0]["exp_avg"].to(torch.complex128)
    src = _source(tmp_path, sd, weights)
    r = run_cli("save", src, tmp_path / "t", "--count", "1", "--results", "")
    assert r.rc != 0 and len(r.err_lines) == 1 and "complex128" in r.err and "--format torch" in r.err, r.err
    assert not (tmp_path / "t").exists() or not any(n.startswith("step-") for n in os.listdir(tmp_path / "t"))
    assert run_cli("save", src, tmp_path / "u", "--count", "1", "--results", "", "--format", "torch").rc == 0


def test_names_with_terminal_escapes_reach_the_note_escaped(tmp_path):
    weights, sd = _same_shaped()
    sd["param_groups"][0]["param_names"] = ["\x1b]0;owned\x07\x1b[2J" + "A" * 500, *list(weights)[1:]]
    doc, saved = _save(_source(tmp_path, sd, weights), tmp_path / "t")
    assert saved == {}
    left = _left_out(doc)
    assert len(left) == 1 and "\x1b" not in left[0] and "\\x1b" in left[0] and len(left[0]) < 600, left


def _load(tmp_path, obj) -> object:
    path = tmp_path / "src"
    path.mkdir()
    torch.save(obj, path / "ckpt.pt")
    return load_state(str(path), "torch")


def test_a_hundred_thousand_listed_ids_are_left_out_quickly(tmp_path):
    weights, sd = _same_shaped()
    sd["param_groups"][0]["params"] = list(range(10**5))
    state = _load(tmp_path, {"model": weights, "optimizer": sd})
    start = time.monotonic()
    notes, left = optimizer.adopt(state, ordered=True)
    assert time.monotonic() - start < 2
    assert "100000 parameter(s)" in notes[0] and "NOT saved" in notes[0] and len(left) == 12, notes


def test_thousands_of_groups_are_matched_in_linear_time(tmp_path):
    n = 3000  # before: every tensor tried every group, 9 million fits
    weights = {f"w{k}": torch.zeros(0, k + 1) for k in range(n)}
    opt = {"state": {k: {"exp_avg": torch.zeros(0, k + 1)} for k in range(n)},
           "param_groups": [{"params": [k]} for k in reversed(range(n))]}  # groups in the other order: still one way
    state = _load(tmp_path, {"model": weights, "optimizer": opt})
    start = time.monotonic()
    notes, _ = optimizer.adopt(state, ordered=True)
    assert time.monotonic() - start < 2
    assert "group by group" in notes[0], notes
    assert all(state.optim[f"w{k}"]["exp_avg"].shape == (0, k + 1) for k in range(n))


def test_thousands_of_optimizers_cost_one_pass_and_a_few_notes(tmp_path):
    one = torch.zeros(1)
    obj = {"model": {"w": torch.zeros(1)}}
    for k in range(3000):
        obj[f"optimizer{k}"] = {"state": {0: {"exp_avg": one}}, "param_groups": [{"params": [0]}]}
    state = _load(tmp_path, obj)
    start = time.monotonic()
    notes, left = optimizer.adopt(state, ordered=True)
    assert time.monotonic() - start < 2
    assert len(notes) <= 6 and "2996 more optimizer state(s) NOT saved" in notes[-1], notes
    assert len(left) == 2999 and set(state.optim) == {"w"}


def test_the_mapping_is_unchanged_for_a_plain_training_loop(tmp_path):
    weights, sd = _same_shaped()
    doc, saved = _save(_source(tmp_path, copy.deepcopy(sd), weights), tmp_path / "t")
    names = list(weights)
    want = {f"{names[i]}.{k}": t for i, st in sd["state"].items() for k, t in st.items() if k != "step"}
    assert sorted(saved) == sorted(want) and all(torch.equal(saved[k], t) for k, t in want.items())
    assert not _left_out(doc)
