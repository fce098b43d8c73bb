"""torch.save files whose pickles name classes beyond torch's allowlist (a Lightning .ckpt's hyper_parameters, a
script's own config class): restored with those objects kept as plain data, the classes never imported or run;
names that only a crafted file holds are refused in one line; the stand-ins do not outlive the load.

The user's classes live in a module written here whose import and whose __setstate__ leave marker files, and which
stays importable (on sys.path) while ckptbench loads: an import or a call would show."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import sys
from collections import OrderedDict

import pytest
import torch

MODES = ("fused", "staged")

USERCFG = '''
import pathlib
pathlib.Path(__file__).with_name("IMPORTED").touch()


class AttributeDict(dict):
    """As Lightning keeps hyper_parameters: a dict subclass (pickled with its items set on it)."""


class Config:
    """A script's own config object (pickled with its attributes as BUILD state)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __setstate__(self, state):
        pathlib.Path(__file__).with_name("RAN").touch()
        self.__dict__.update(state)


class Tags(list):
    """A list subclass: its items are appended to what the pickle made."""
'''


@pytest.fixture
def usercfg(tmp_path, monkeypatch):
    """The user's module, imported to save with, then forgotten: still on sys.path, its markers removed."""
    mod_dir = tmp_path / "mod"
    mod_dir.mkdir()
    (mod_dir / "usercfg.py").write_text(USERCFG)
    monkeypatch.syspath_prepend(str(mod_dir))
    module = importlib.import_module("usercfg")
    yield module, mod_dir
    sys.modules.pop("usercfg", None)


def _forget(mod_dir) -> None:
    sys.modules.pop("usercfg", None)
    for marker in ("IMPORTED", "RAN"):
        (mod_dir / marker).unlink(missing_ok=True)


def _lightning(u) -> dict:
    weights = OrderedDict((f"model.layers.{i}.weight", torch.randn(32, 16)) for i in range(3))
    weights["model.head.bias"] = torch.randn(16)
    names = list(weights)
    adam = {"state": {i: {"step": torch.tensor(5.0), "exp_avg": torch.randn_like(w), "exp_avg_sq": torch.rand_like(w)}
                      for i, w in enumerate(weights.values())},
            "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "params": list(range(len(names)))}]}
    return {
        "epoch": 3, "global_step": 1200, "pytorch-lightning_version": "2.4.0",
        "state_dict": weights,
        "optimizer_states": [adam],
        "lr_schedulers": [{"last_epoch": 3, "_last_lr": [1e-3]}],
        "callbacks": {"ModelCheckpoint{'monitor': 'val_loss'}": {"best_model_score": torch.tensor(0.25),
                                                                 "dirpath": pathlib.PurePosixPath("/ckpts")}},
        "hparams_name": "kwargs",
        "hyper_parameters": u.AttributeDict(lr=1e-3, cfg=u.Config(width=64), ns=argparse.Namespace(seed=7)),
    }


@pytest.fixture
def lightning_dir(tmp_path, usercfg):
    u, mod_dir = usercfg
    root = tmp_path / "ckpt"
    root.mkdir()
    saved = _lightning(u)
    torch.save(saved, root / "epoch=3-step=1200.ckpt")
    _forget(mod_dir)
    return str(root), saved, mod_dir


KEPT = ["argparse.Namespace", "pathlib.PurePosixPath", "usercfg.AttributeDict", "usercfg.Config"]


@pytest.mark.parametrize("mode", MODES)
def test_a_lightning_ckpt_restores_with_its_objects_kept_as_data(lightning_dir, h, tmp_path, mode):
    root, saved, mod_dir = lightning_dir
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["status"] == "unverified" and doc["format"] == "torch"
    note = doc["notes"]["load"]
    assert note.startswith("kept as plain data, their classes never imported or run: ")
    assert note.endswith(", ".join(sorted(KEPT)))
    assert not (mod_dir / "IMPORTED").exists() and not (mod_dir / "RAN").exists()
    assert "usercfg" not in sys.modules


def test_every_tensor_and_the_plain_values_come_back(lightning_dir):
    from ckptbench.restore import load as restore

    root, saved, mod_dir = lightning_dir
    path = os.path.join(root, "epoch=3-step=1200.ckpt")
    from_file = restore.load_state(root, "torch")
    from_buffer = restore.load_state(root, "torch", buffers={path: bytearray(open(path, "rb").read())},
                                     shards=[path])
    for state in (from_file, from_buffer):
        assert set(state.model) == set(saved["state_dict"])
        for k, t in saved["state_dict"].items():
            assert torch.equal(state.model[k], t), k
        for i, parts in saved["optimizer_states"][0]["state"].items():
            for part, t in parts.items():
                assert torch.equal(state.extra[f"optimizer_states.0.state.{i}.{part}"], t)
        # the stand-ins' items and attributes, as plain values under their keys
        assert state.extra["hyper_parameters.lr"] == 1e-3
        assert state.extra["hyper_parameters.cfg.width"] == 64
        assert state.extra["hyper_parameters.ns.seed"] == 7
        cb = "callbacks.ModelCheckpoint{'monitor': 'val_loss'}"
        assert "/".join(v for k, v in state.extra.items() if k.startswith(f"{cb}.dirpath.args.")).lstrip("/") == "ckpts"
        assert torch.equal(state.extra[f"{cb}.best_model_score"], torch.tensor(0.25))
        assert sorted(state.inert) == sorted(KEPT)
    assert not (mod_dir / "IMPORTED").exists() and not (mod_dir / "RAN").exists()


def test_inspect_finds_the_ckpt_and_names_what_it_keeps_as_data(lightning_dir, h):
    root, saved, _ = lightning_dir
    r = h.run_cli("inspect", root, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["format"] == "torch" and doc["layout"]["shards"] == 1
    assert doc["layout"]["kept_as_data"] == sorted(KEPT)
    assert doc["groups"]["model"]["bytes"] >= sum(t.nbytes for t in saved["state_dict"].values())
    text = h.run_cli("inspect", root)
    assert "kept as plain data, their classes never imported or run: " + ", ".join(sorted(KEPT)) in text.out


def test_the_stand_ins_do_not_outlive_the_load(lightning_dir):
    from torch import serialization as ts

    from ckptbench.checkpoint.formats import torch_format

    root, _, _ = lightning_dir
    path = os.path.join(root, "epoch=3-step=1200.ckpt")
    torch_format.load_file(path)  # torch registers some globals of its own lazily: settle them first
    before = set(map(repr, ts.get_safe_globals()))
    torch_format.load_file(path)
    assert set(map(repr, ts.get_safe_globals())) == before
    with pytest.raises(Exception, match="Unsupported global"):  # torch's own loader still refuses the file
        torch.load(path, weights_only=True)


class Evaluates:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (eval, (f"open({str(self.marker)!r}, 'w')",))


def _save(tmp_path, obj):
    root = tmp_path / "bad"
    root.mkdir()
    torch.save({"w": torch.zeros(4), "extra": obj}, root / "last.ckpt")
    return root


def _refused(h, tmp_path, root, needle: str, mode: str = "fused") -> str:
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
    assert r.rc != 0 and r.out == "", r.out
    assert "Traceback" not in r.err and len(r.err_lines) == 1, r.err
    line = r.err_lines[0]
    assert line.startswith("ckptbench: error: ") and "last.ckpt" in line and "refused" in line, line
    assert needle in line, line
    return line


@pytest.mark.parametrize("mode", MODES)
def test_a_pickle_naming_eval_keeps_it_as_data_and_never_runs_it(h, tmp_path, mode):
    marker = tmp_path / "MARKER"
    root = _save(tmp_path, Evaluates(marker))
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["notes"]["load"].endswith("builtins.eval")
    assert not marker.exists()


def test_torch_classes_torch_does_not_allow_are_refused_not_stood_in(h, tmp_path):
    _refused(h, tmp_path, _save(tmp_path, torch.nn.Linear(2, 2)),
             "torch.nn.modules.linear.Linear, which torch's weights_only unpickler does not allow")


def test_a_list_subclass_is_refused_in_one_line(h, tmp_path, usercfg):
    u, mod_dir = usercfg
    root = _save(tmp_path, u.Tags(["a", "b"]))
    _forget(mod_dir)
    _refused(h, tmp_path, root, "cannot keep as data")
    assert not (mod_dir / "IMPORTED").exists()
