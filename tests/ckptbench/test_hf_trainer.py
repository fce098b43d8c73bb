"""A Hugging Face Trainer's checkpoint-N directory, written here by plain torch, safetensors and numpy calls as
transformers' Trainer writes it: the weights (model.safetensors, sharded with an index, or pytorch_model.bin),
optimizer.pt (a real AdamW state_dict after one step), scheduler.pt (a real LambdaLR), rng_state.pth (python,
numpy and torch RNG state), scaler.pt, trainer_state.json, and training_args.bin (a pickled object that runs code
when unpickled). It restores whole in fused and staged mode alike; training_args.bin is never read."""

from __future__ import annotations

import json
import os
import pickle
import random
import shlex
import shutil

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

MODES = ("fused", "staged")
VARIANTS = ("safetensors", "sharded", "bin")
FORMAT = {"safetensors": "safetensors", "sharded": "safetensors", "bin": "torch"}


class RunsCode:
    """Stands in for TrainingArguments: unpickling it calls os.system, which creates the marker file."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8)
        self.proj = torch.nn.Linear(8, 8)
        self.lm_head = torch.nn.Linear(8, 16, bias=False)

    def forward(self, x):
        return self.lm_head(torch.relu(self.proj(self.embed(x))))


def _train_one_step():
    """A tiny model, AdamW and LambdaLR after one real step: (weights, optimizer, scheduler state_dicts)."""
    torch.manual_seed(0)
    model = Tiny()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))
    x = torch.randint(0, 16, (2, 5))
    torch.nn.functional.cross_entropy(model(x).reshape(-1, 16), x.reshape(-1)).backward()
    opt.step()
    sched.step()
    weights = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    return weights, opt.state_dict(), sched.state_dict()


def _write_trainer_dir(root, variant: str, marker) -> dict:
    """checkpoint-1 as the Trainer saves it; returns what each state file holds, by file name."""
    os.makedirs(root)
    weights, optim, sched = _train_one_step()
    random.seed(7)
    np.random.seed(7)
    rng = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if variant == "safetensors":
        save_file(weights, os.path.join(root, "model.safetensors"), metadata={"format": "pt"})
    elif variant == "sharded":
        names = sorted(weights)
        shards = {"model-00001-of-00002.safetensors": names[:2], "model-00002-of-00002.safetensors": names[2:]}
        for shard, keys in shards.items():
            save_file({k: weights[k] for k in keys}, os.path.join(root, shard), metadata={"format": "pt"})
        with open(os.path.join(root, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": 1}, "weight_map": {k: s for s, ks in shards.items() for k in ks}}, f)
        with open(os.path.join(root, "model-00001-of-00003.safetensors"), "wb") as f:  # stale: loading it would fail
            f.write(b"stale " * 100)
    else:
        torch.save(weights, os.path.join(root, "pytorch_model.bin"))
    saved = {"optimizer.pt": optim, "scheduler.pt": sched, "rng_state.pth": rng,
             "scaler.pt": torch.amp.GradScaler("cpu").state_dict()}
    for name, obj in saved.items():
        torch.save(obj, os.path.join(root, name))
    trainer_state = {"global_step": 1, "epoch": 0.01, "log_history": [{"loss": 2.77, "step": 1}]}
    with open(os.path.join(root, "trainer_state.json"), "w") as f:
        json.dump(trainer_state, f)
    with open(os.path.join(root, "config.json"), "w") as f:  # a Llama-style config: no shape ckptbench can build
        json.dump({"model_type": "llama", "hidden_size": 8, "vocab_size": 16}, f)
    torch.save(RunsCode(str(marker)), os.path.join(root, "training_args.bin"))  # what Trainer does with its args
    return dict(saved, weights=weights, **{"trainer_state.json": trainer_state})


@pytest.fixture
def trainer(tmp_path):
    """trainer(variant) -> (root, what was saved); the marker path is tmp_path / MARKER."""

    def make(variant: str):
        root = str(tmp_path / f"checkpoint-1-{variant}")
        return root, _write_trainer_dir(root, variant, tmp_path / "MARKER")

    return make


def _flat(obj, prefix: str = "") -> dict:
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    else:
        return {prefix: obj}
    out: dict = {}
    for k, v in items:
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _expected_extra(saved: dict) -> dict:
    """Each state file's values under its stem, flattened: optimizer.state.0.exp_avg, rng_state.numpy.1, ...,
    trainer_state.log_history.0.loss (the JSON a resume reads with TrainerState.load_from_json)."""
    out = {}
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "scaler.pt", "trainer_state.json"):
        out.update(_flat({name.rsplit(".", 1)[0]: saved[name]}))
    return out


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor) and g.dtype == w.dtype and g.shape == w.shape, k
            assert torch.equal(g, w), k
        elif isinstance(w, np.ndarray):
            assert isinstance(g, np.ndarray) and g.dtype == w.dtype and np.array_equal(g, w), k
        else:
            assert type(g) is type(w) and g == w, k


def _selected(root: str) -> list[str]:
    return sorted(n for n in os.listdir(root) if n != "training_args.bin" and n != "model-00001-of-00003.safetensors")


def _sizes(root: str, names) -> int:
    return sum(os.path.getsize(os.path.join(root, n)) for n in names)


def _run(h, root, mode: str, tmp_path):
    return h.run_cli("run", root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / f"R-{mode}.csv")


def _fused_and_staged(root: str):
    """The state as each mode loads it: fused from the buffers of the files the listing selected (as the pipeline
    passes them), staged from the files."""
    from ckptbench.restore import load as restore
    from ckptbench.sources.local import LocalSource

    listing = LocalSource(root, checkpoint=True).list()
    buffers = {f.path: bytearray(open(f.path, "rb").read()) for f in listing.files}
    shards = [p for p in buffers if p.endswith(restore.SHARD_EXT[listing.format])]
    return (restore.load_state(listing.source, listing.format, buffers=buffers, shards=shards),
            restore.load_state(root, listing.format))


# ---- the restore ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("mode", MODES)
def test_run_restores_the_trainer_dir_reading_all_but_training_args(trainer, h, tmp_path, variant, mode):
    root, _ = trainer(variant)
    r = _run(h, root, mode, tmp_path)
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    read = _selected(root)
    assert "optimizer.pt" in read and "rng_state.pth" in read and "trainer_state.json" in read
    assert doc["status"] == "unverified" and doc["format"] == FORMAT[variant]
    assert doc["files"] == len(read) and doc["bytes"] == _sizes(root, read)
    assert doc["bytes"] < _sizes(root, os.listdir(root))  # training_args.bin (and a stale shard) not read
    assert not (tmp_path / "MARKER").exists()


@pytest.mark.parametrize("variant", VARIANTS)
def test_loaded_values_match_what_was_saved_in_both_modes(trainer, variant):
    root, saved = trainer(variant)
    want = _expected_extra(saved)
    assert want["scheduler.last_epoch"] == 1 and isinstance(want["rng_state.numpy.1"], np.ndarray)
    fused, staged = _fused_and_staged(root)
    for state in (fused, staged):
        _assert_same(state.model, saved["weights"])
        _assert_same(state.extra, want)
        assert state.optim == {}
    # the optimizer's moments are tensors of the optimizer group, the RNG state of the other group
    groups = {name: g for g, name, _ in fused.tensors()}
    assert groups["optimizer.state.0.exp_avg_sq"] == "optimizer" and groups["rng_state.cpu"] == "other"
    assert not any(torch.equal(fused.extra[f"optimizer.state.{i}.exp_avg"], torch.zeros_like(
        fused.extra[f"optimizer.state.{i}.exp_avg"])) for i in range(4))  # one real step moved every moment


def test_fused_loads_the_state_files_from_the_buffers_not_the_disk(trainer, tmp_path):
    from ckptbench.restore import load as restore
    from ckptbench.sources.local import LocalSource

    root, saved = trainer("safetensors")
    listing = LocalSource(root, checkpoint=True).list()
    buffers = {f.path: bytearray(open(f.path, "rb").read()) for f in listing.files}
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "scaler.pt"):
        with open(os.path.join(root, name), "wb") as f:  # what is on disk now would not load
            f.write(b"garbage")
    shards = [p for p in buffers if p.endswith(".safetensors")]
    state = restore.load_state(listing.source, "safetensors", buffers=buffers, shards=shards)
    _assert_same(state.extra, _expected_extra(saved))
    with pytest.raises(Exception, match="optimizer.pt"):
        restore.load_state(root, "safetensors")  # staged reads the files, and these are garbage now


def test_the_code_in_training_args_never_runs_even_in_a_fresh_interpreter(trainer, h, tmp_path):
    root, _ = trainer("bin")
    marker = tmp_path / "MARKER"
    for cmd in (("run", root, "--repeat", "1", "--results", tmp_path / "P.csv"), ("verify", root),
                ("inspect", root, "--json")):
        r = h.run_proc(*cmd)
        assert r.rc == (3 if cmd[0] == "verify" else 0), r.err  # verify: no manifest, so nothing checked (3)
    assert not marker.exists()
    torch.load(os.path.join(root, "training_args.bin"), weights_only=False)  # the payload is live when unpickled
    assert marker.exists()


# ---- the layout ----------------------------------------------------------------------------------------------------


def test_layout_names_the_trainer_files_and_says_why_training_args_is_skipped(trainer):
    from ckptbench.checkpoint import layouts
    from ckptbench.checkpoint import tree

    root, _ = trainer("sharded")
    lay = layouts.select(root, tree.rels(root))
    assert lay.name == "hf-trainer"
    assert lay.model_files == ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    assert lay.optimizer_files == ("optimizer.pt",)
    assert sorted(lay.state_files) == ["optimizer.pt", "rng_state.pth", "scaler.pt", "scheduler.pt",
                                       "trainer_state.json"]
    assert sorted(lay.files) == _selected(root)
    assert lay.skipped == (("training_args.bin", layouts.SKIP_WHY["training_args.bin"]),)
    assert "could run code" in lay.describe()["not_read"][0]["why"]


def test_save_model_output_with_only_training_args_beside_the_weights_restores(tmp_path, h):
    """trainer.save_model(): weights, config and training_args.bin, no optimizer; a .bin weight file makes the
    format torch, and training_args.bin (also .bin) must still not be loaded."""
    root = tmp_path / "saved"
    root.mkdir()
    weights, _, _ = _train_one_step()
    torch.save(weights, str(root / "pytorch_model.bin"))
    torch.save(RunsCode(str(tmp_path / "MARKER")), str(root / "training_args.bin"))
    for mode in MODES:
        r = _run(h, root, mode, tmp_path)
        assert r.rc == 0, r.err
        assert json.loads(r.out)["files"] == 1
    assert not (tmp_path / "MARKER").exists()


def test_detection_says_a_format_for_each_variant(trainer):
    from ckptbench.checkpoint.detect import detect

    for variant in VARIANTS:
        root, _ = trainer(variant)
        assert detect(root) == FORMAT[variant]


def test_inspect_shows_the_layout_and_the_optimizer_group(trainer, h):
    root, saved = trainer("bin")
    r = h.run_cli("inspect", root, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["format"] == "torch" and doc["layout"]["name"] == "hf-trainer"
    moments = [t for part in saved["optimizer.pt"]["state"].values() for t in part.values()]
    assert doc["groups"]["optimizer"]["tensors"] == len(moments) == 12
    assert doc["groups"]["optimizer"]["bytes"] == sum(t.numel() * t.element_size() for t in moments)
    assert doc["groups"]["model"]["bytes"] == sum(t.numel() * t.element_size() for t in saved["weights"].values())
    assert doc["read_plan"]["bytes"] == _sizes(root, _selected(root))
    root, saved = trainer("safetensors")
    r = h.run_cli("inspect", root, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["layout"]["name"] == "hf-trainer"
    moments = [t for part in saved["optimizer.pt"]["state"].values() for t in part.values()]
    assert doc["groups"]["optimizer"]["bytes"] == sum(t.numel() * t.element_size() for t in moments)
    assert "other" in doc["groups"]  # the scheduler's and RNG's tensors
    # the first line counts every file the read plan reads: the shards and the others (index, optimizer, configs)
    lay = doc["layout"]
    assert lay["shards"] + lay["other_files"] == doc["read_plan"]["files"] and lay["other_files"] > 0, lay
    text = h.run_cli("inspect", root).out.splitlines()[0]
    assert f"{lay['shards']} shard file(s) and {lay['other_files']} other file(s)" in text, text
    # the others' size said as theirs, and the checkpoint's whole beside it (the others' alone read as the whole)
    from ckptbench.core.units import human_bytes

    assert f"({human_bytes(lay['other_bytes'])} of them), {human_bytes(doc['read_plan']['bytes'])} in all" in text, text
    assert lay["other_bytes"] < doc["read_plan"]["bytes"]


# ---- the numpy allowance: numeric arrays and nothing else -------------------------------------------------------


class NoBuildDtype:
    """An object dtype made by its constructor alone (no BUILD step, which torch would check)."""

    def __reduce__(self):
        return (np.dtype, ("O8", False, True))


class ObjectArray:
    """A numpy array of Python objects, its dtype smuggled in without BUILD."""

    def __reduce__(self):
        return (np.ndarray((0,)).__reduce__()[0], (np.ndarray, (0,), b"b"), (1, (2,), NoBuildDtype(), False, [1, 2]))


def _hostile_rng(tmp_path) -> dict:
    marker = str(tmp_path / "MARKER")
    return {
        "os.system": {"cpu": torch.zeros(4, dtype=torch.uint8), "numpy": RunsCode(marker)},
        "numpy RandomState": {"numpy": np.random.RandomState(3)},
        "object array": {"numpy": np.array([1, "a"], dtype=object)},
        "object array, no BUILD": {"numpy": ObjectArray()},
        "structured array": {"numpy": np.zeros(2, dtype=[("a", "i4"), ("b", "f8")])},
    }


@pytest.mark.parametrize("case", ["os.system", "numpy RandomState", "object array", "object array, no BUILD",
                                  "structured array"])
@pytest.mark.parametrize("mode", MODES)
def test_rng_state_with_anything_but_numeric_arrays_is_refused_in_one_line(trainer, h, tmp_path, case, mode):
    root, _ = trainer("safetensors")
    torch.save(_hostile_rng(tmp_path)[case], os.path.join(root, "rng_state.pth"))
    r = _run(h, root, mode, tmp_path)
    assert r.rc != 0 and r.out == ""
    assert "Traceback" not in r.err and len(r.err_lines) == 1, r.err
    assert r.err_lines[0].startswith("ckptbench: error: ") and "rng_state.pth" in r.err_lines[0]
    assert "refused" in r.err_lines[0] or "not numbers" in r.err_lines[0], r.err_lines[0]
    assert "corrupt or truncated" not in r.err_lines[0]  # a refusal, not read as damage
    assert not (tmp_path / "MARKER").exists()


def test_the_numpy_allowance_is_scoped_to_the_load(trainer):
    from torch import serialization as ts

    from ckptbench.checkpoint.formats import torch_format

    root, saved = trainer("safetensors")
    path = os.path.join(root, "rng_state.pth")
    # torch registers some globals of its own lazily (DTensor placements, on first use): a first load settles
    # them, so the comparison below sees only what the load itself adds or leaves behind
    torch_format.load_file(path)
    before = ts.get_safe_globals()
    assert not any("numpy" in repr(g) for g in before)
    state = torch_format.load_file(path)
    assert np.array_equal(state.extra["rng_state.numpy.1"], saved["rng_state.pth"]["numpy"][1])
    # left as it was (compared as a set: torch keeps the allowlist in a set, so its list order varies): other
    # weights_only loads in the process see no numpy
    assert set(map(repr, ts.get_safe_globals())) == set(map(repr, before))
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)


def test_a_state_file_that_runs_code_is_refused_and_never_runs(trainer, h, tmp_path):
    root, saved = trainer("sharded")
    optim = dict(saved["optimizer.pt"], extra=RunsCode(str(tmp_path / "MARKER")))
    torch.save(optim, os.path.join(root, "optimizer.pt"))
    for mode in MODES:
        r = _run(h, root, mode, tmp_path)
        assert r.rc != 0 and len(r.err_lines) == 1 and "optimizer.pt" in r.err_lines[0], r.err
        assert "refused" in r.err_lines[0]
    assert not (tmp_path / "MARKER").exists()
    shutil.rmtree(root)
