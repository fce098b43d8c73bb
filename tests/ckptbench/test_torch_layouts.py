"""torch.save checkpoints other trainers write, saved here by plain torch calls: DeepSpeed's step directories with
`latest`, Hugging Face's .bin shards with their index, nested dicts with plain leaves, legacy (pre-zip) files.
Each restores, in fused and staged mode alike, to the values saved; hostile `latest`, index and pickles are one
line and a non-zero exit."""

from __future__ import annotations

import io
import json
import os
import pickle
import shlex

import pytest
import torch

from clirun import run_cli

MODES = ("fused", "staged")


# ---- what the tests save, and what they expect back ------------------------------------------------------------


def _flat(obj, prefix: str = "") -> dict:
    """Flat key -> leaf, dict keys and list indices joined with dots; an empty container below the top a leaf (a
    load_state_dict may read it: LambdaLR pops lr_lambdas)."""
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        items = enumerate(obj)
    else:
        return {prefix: obj}
    if not len(obj) and prefix:
        return {prefix: obj}
    out: dict = {}
    for k, v in items:
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def _assert_same(got: dict, want: dict) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor) and g.dtype == w.dtype and torch.equal(g, w), k
        else:
            assert type(g) is type(w) and g == w, k


def _rand(g, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def _ds_step(d: str, step: int, n: int, ranks: int = 2) -> dict:
    """One DeepSpeed ZeRO-2 step directory as DeepSpeed lays it out; returns what was saved, by file."""
    g = torch.Generator().manual_seed(step)
    os.makedirs(d)
    module = {"wte.weight": _rand(g, 48, n), "h.0.attn.c_attn.weight": _rand(g, n, n, dtype=torch.bfloat16),
              "h.0.ln_1.bias": _rand(g, n), "ln_f.weight": _rand(g, n)}
    model_states = {
        "module": module, "buffer_names": [], "optimizer": None,
        "lr_scheduler": {"last_epoch": step, "base_lrs": [3e-4], "_step_count": step + 1},
        "sparse_tensor_module_names": [], "skipped_steps": 0, "global_steps": step, "global_samples": step * 16,
        "dp_world_size": ranks, "mp_world_size": 1, "ds_version": "0.14.0",
        "ds_config": {"train_batch_size": 16, "bf16": {"enabled": True}, "zero_optimization": {"stage": 2}},
        "param_shapes": [{k: v.shape for k, v in module.items()}],
    }
    saved = {"mp_rank_00_model_states.pt": model_states}
    part = sum(t.numel() for t in module.values()) // ranks
    for r in range(ranks):
        saved[f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt"] = {
            "optimizer_state_dict": {
                "base_optimizer_state": {
                    "state": {0: {"step": torch.tensor(float(step)), "exp_avg": _rand(g, part),
                                  "exp_avg_sq": _rand(g, part).abs()}},
                    "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1,
                                      "params": [0]}]},
                "single_partition_of_fp32_groups": [_rand(g, part)],
                "zero_stage": 2, "partition_count": ranks, "loss_scaler": None, "dynamic_loss_scale": False,
                "overflow": False, "clip_grad": 1.0},
            "ds_config": {"train_batch_size": 16}, "ds_version": "0.14.0"}
    for name, obj in saved.items():
        torch.save(obj, os.path.join(d, name))
    return saved


def _ds_expected(saved: dict) -> tuple[dict, dict]:
    """(model, extra) a restore of one DeepSpeed step must give: the weights without `module.`, everything else
    by flat key, each ZeRO partition under its rank tag."""
    model_states = saved["mp_rank_00_model_states.pt"]
    extra = _flat({k: v for k, v in model_states.items() if k != "module"})
    for name, obj in saved.items():
        if name.startswith("zero_pp_rank_"):
            tag = name.split("_mp_rank_")[0]
            extra.update({f"{tag}.{k}": v for k, v in _flat(obj).items()})
    return dict(model_states["module"]), extra


@pytest.fixture
def ds_tree(tmp_path):
    """global_step100 (larger tensors, and a torn partition: loading it would fail) and global_step200, with
    `latest` naming 200; returns (root, what step 200 saved)."""
    root = tmp_path / "ds"
    root.mkdir()
    _ds_step(str(root / "global_step100"), 100, n=24)
    (root / "global_step100" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").write_bytes(b"PK\x03\x04torn" * 50)
    saved = _ds_step(str(root / "global_step200"), 200, n=16)
    (root / "latest").write_text("global_step200\n")
    (root / "zero_to_fp32.py").write_text("# DeepSpeed's conversion script\n")
    return str(root), saved


def _run(root, mode: str, tmp_path):
    return run_cli("run", root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / f"R-{mode}.csv")


def _one_line(r, *needles) -> str:
    assert r.rc != 0 and r.out == ""
    assert "Traceback" not in r.err, r.err
    assert len(r.err_lines) == 1, r.err
    line = r.err_lines[0]
    assert line.startswith("ckptbench: error: "), line
    for n in needles:
        assert n in line, line
    return line


def _sizes(root: str, rels) -> int:
    return sum(os.path.getsize(os.path.join(root, r)) for r in rels)


def _buffers(paths) -> dict:
    """Each file's bytes in a writable buffer, as the fused read leaves them."""
    return {p: bytearray(open(p, "rb").read()) for p in paths}


def _both(root: str):
    """The state loaded from the files (staged) and from buffers of their bytes (fused, in place)."""
    from ckptbench.restore import load as restore

    shards = restore.shard_files(root, "torch")
    from_files = restore.load_state(root, "torch")
    from_buffers = restore.load_state(root, "torch", buffers=_buffers(shards), shards=shards)
    return from_files, from_buffers


# ---- DeepSpeed ---------------------------------------------------------------------------------------------------

STEP200 = ["latest", "global_step200/mp_rank_00_model_states.pt",
           "global_step200/zero_pp_rank_0_mp_rank_00_optim_states.pt",
           "global_step200/zero_pp_rank_1_mp_rank_00_optim_states.pt"]  # zero_to_fp32.py: a script, never read


@pytest.mark.parametrize("mode", MODES)
def test_deepspeed_run_reads_and_restores_only_the_step_latest_names(ds_tree, tmp_path, mode):
    root, _ = ds_tree
    r = _run(root, mode, tmp_path)
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["status"] == "unverified" and doc["format"] == "torch"
    assert doc["files"] == len(STEP200) and doc["bytes"] == _sizes(root, STEP200)
    assert doc["bytes"] != _sizes(root, [s.replace("200", "100") if "/" in s else s for s in STEP200])


def test_deepspeed_values_match_what_was_saved_from_files_and_from_buffers(ds_tree):
    root, saved = ds_tree
    want_model, want_extra = _ds_expected(saved)
    for state in _both(root):
        _assert_same(state.model, want_model)
        _assert_same(state.extra, want_extra)
        assert state.optim == {}
        assert state.extra["global_steps"] == 200  # a scalar stays where the trainer put it


def test_deepspeed_layout_is_described_and_other_steps_are_not_selected(ds_tree):
    from ckptbench.checkpoint import layouts
    from ckptbench.checkpoint import tree

    root, _ = ds_tree
    lay = layouts.select(root, tree.rels(root))
    assert lay.name == "deepspeed" and lay.tag == "global_step200" and lay.ranks == (0, 1)
    assert sorted(lay.files) == sorted(STEP200)
    assert lay.model_files == ("global_step200/mp_rank_00_model_states.pt",)
    assert lay.optimizer_files == tuple(s for s in STEP200 if "optim_states" in s)
    assert lay.describe()["name"] == "deepspeed"
    assert "code, not state" in dict(lay.skipped)["zero_to_fp32.py"]


def test_deepspeed_read_and_verify_read_only_the_latest_step(ds_tree):
    root, _ = ds_tree
    r = run_cli("read", root, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["files_ok"] == len(STEP200) and doc["bytes"] == _sizes(root, STEP200)
    r = run_cli("verify", root, "--json")
    assert r.rc == 3, r.err  # no manifest: digests computed, nothing checked against them
    doc = json.loads(r.out)
    assert not doc["verified"] and sorted(doc["digests"]) == sorted(STEP200) and doc["bytes"] == _sizes(root, STEP200)


def test_inspect_counts_the_latest_step_with_partitions_as_optimizer_state(ds_tree):
    from ckptbench.checkpoint.formats import group_of

    root, saved = ds_tree
    r = run_cli("inspect", root, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    want_model, want_extra = _ds_expected(saved)
    assert doc["groups"]["model"]["tensors"] == len(want_model) == 4
    assert doc["groups"]["optimizer"]["tensors"] == sum(isinstance(v, torch.Tensor) for v in want_extra.values())
    assert doc["read_plan"]["files"] == len(STEP200) and doc["read_plan"]["bytes"] == _sizes(root, STEP200)
    assert group_of("zero_pp_rank_3.optimizer_state_dict.single_partition_of_fp32_groups.0") == "optimizer"
    assert group_of("zero_pp_rank_3_mp_rank_01.ds_config.x") == "other"
    assert group_of("zero_pp_rank_3") == "model"


def test_deepspeed_step_directory_pointed_at_directly_restores(ds_tree, tmp_path):
    from ckptbench.checkpoint import layouts
    from ckptbench.checkpoint import tree

    root, saved = ds_tree
    step = os.path.join(root, "global_step200")
    lay = layouts.select(step, tree.rels(step))
    assert lay.name == "deepspeed" and lay.tag is None and len(lay.files) == 3
    r = _run(step, "fused", tmp_path)
    assert r.rc == 0, r.err
    assert json.loads(r.out)["files"] == 3
    _assert_same(_both(step)[1].model, _ds_expected(saved)[0])


def test_deepspeed_directory_detects_as_torch(ds_tree):
    from ckptbench.checkpoint.detect import detect, detect_names

    root, _ = ds_tree
    assert detect(root) == "torch"
    # DeepSpeed resumes from its state files even where a Hugging Face trainer also wrote model.safetensors
    assert detect_names(["model.safetensors", "global_step5/mp_rank_00_model_states.pt", "latest"], "x") == "torch"
    assert detect_names(["model.safetensors", "config.json"], "x") == "safetensors"


def test_one_step_without_latest_is_that_step(tmp_path):
    root = tmp_path / "one"
    root.mkdir()
    saved = _ds_step(str(root / "global_step7"), 7, n=8)
    r = _run(root, "staged", tmp_path)
    assert r.rc == 0, r.err
    _assert_same(_both(str(root))[0].model, _ds_expected(saved)[0])


@pytest.mark.parametrize("content, needle", [
    (b"../x", "'../x'"),
    (b"global_step100/../../x", "not one directory name"),
    (b"/etc", "'/etc'"),
    (b"global_step999\n", "'global_step999', which is not a directory"),
    (b"", "names ''"),
    (b"global_step200" + b" " * 5000, "more than a DeepSpeed `latest` file holds"),
    (b"\xff\xfe\x00\x9cgarbage\x00", "not text"),
    (b"zero_to_fp32.py", "not a directory"),
])
def test_hostile_latest_is_one_line_in_every_command(ds_tree, tmp_path, content, needle):
    root, _ = ds_tree
    os.makedirs(os.path.join(root, "..", "x"), exist_ok=True)  # `../x` exists: its name alone is refused
    with open(os.path.join(root, "latest"), "wb") as f:
        f.write(content)
    for mode in MODES:
        _one_line(_run(root, mode, tmp_path), os.path.join(root, "latest"), needle)
    _one_line(run_cli("read", root), "latest", needle)
    _one_line(run_cli("verify", root), "latest", needle)
    _one_line(run_cli("load", root, "--no-verify"), "latest", needle)


def test_latest_through_a_symlink_out_of_the_checkpoint_is_refused(ds_tree, tmp_path):
    root, _ = ds_tree
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    os.symlink(outside, os.path.join(root, "escape"))
    (tmp_path / "ds" / "latest").write_text("escape")
    _one_line(_run(root, "fused", tmp_path), "'escape'", "outside the checkpoint")


def test_several_steps_and_no_latest_is_refused_not_guessed(ds_tree, tmp_path):
    root, _ = ds_tree
    os.unlink(os.path.join(root, "latest"))
    line = _one_line(_run(root, "fused", tmp_path), root, "2 DeepSpeed step directories", "no `latest`")
    assert "point at one step directory" in line


def test_code_running_pickle_in_a_deepspeed_step_is_refused_and_never_runs(ds_tree, tmp_path, h):
    root, saved = ds_tree
    marker = tmp_path / "MARKER-code-ran"
    obj = dict(saved["mp_rank_00_model_states.pt"], client_state={"sampler": RunsCode(str(marker))})
    torch.save(obj, os.path.join(root, "global_step200", "mp_rank_00_model_states.pt"))
    for mode in MODES:
        _one_line(_run(root, mode, tmp_path), "mp_rank_00_model_states.pt", "refused")
    _one_line(h.run_proc("run", root, "--repeat", "1", "--results", tmp_path / "P.csv"), "refused")
    assert not marker.exists()
    control = tmp_path / "control"  # the same payload does run code when unpickled unsafely
    pickle.loads(pickle.dumps(RunsCode(str(control))))
    assert control.exists()


class RunsCode:
    """Unpickling this calls os.system."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


# ---- Hugging Face .bin -------------------------------------------------------------------------------------------


@pytest.fixture
def hf_sharded(tmp_path):
    """Two .bin shards and their index, a stale shard the index no longer names (garbage: loading it would
    fail), a torch optimizer's state_dict and a trainer_state.json; returns (root, shards saved)."""
    root = tmp_path / "hf"
    root.mkdir()
    g = torch.Generator().manual_seed(3)
    shards = {"pytorch_model-00001-of-00002.bin": {"wte.weight": _rand(g, 40, 8), "h.0.w": _rand(g, 8, 8)},
              "pytorch_model-00002-of-00002.bin": {"h.1.w": _rand(g, 8, 8, dtype=torch.float16),
                                                   "lm_head.weight": _rand(g, 40, 8)}}
    for name, sd in shards.items():
        torch.save(sd, str(root / name))
    weight_map = {k: name for name, sd in shards.items() for k in sd}
    (root / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {"total_size": 1},
                                                                   "weight_map": weight_map}))
    (root / "pytorch_model-00001-of-00003.bin").write_bytes(b"stale " * 100)
    optim = {"state": {0: {"step": torch.tensor(4.0), "exp_avg": _rand(g, 4)}},
             "param_groups": [{"lr": 0.1, "params": [0]}]}
    torch.save(optim, str(root / "optimizer.pt"))
    (root / "trainer_state.json").write_text('{"global_step": 4}')
    return str(root), shards, optim


@pytest.mark.parametrize("mode", MODES)
def test_hf_index_layout_restores_the_shards_it_names(hf_sharded, tmp_path, mode):
    root, _, _ = hf_sharded
    r = _run(root, mode, tmp_path)
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    read = [n for n in os.listdir(root) if n != "pytorch_model-00001-of-00003.bin"]
    assert doc["status"] == "unverified" and doc["files"] == len(read) == 5 and doc["bytes"] == _sizes(root, read)


def test_hf_index_values_match_from_files_and_buffers(hf_sharded):
    root, shards, optim = hf_sharded
    want = {k: v for sd in shards.values() for k, v in sd.items()}
    for state in _both(root):
        _assert_same(state.model, want)  # a torch optimizer's state_dict holds no weights
        # a Trainer's optimizer.pt under its stem, its trainer_state.json under trainer_state
        _assert_same(state.extra, _flat({"optimizer": optim}) | {"trainer_state.global_step": 4})


def test_single_pytorch_model_bin_restores(tmp_path):
    root = tmp_path / "single"
    root.mkdir()
    g = torch.Generator().manual_seed(5)
    sd = {"embed.weight": _rand(g, 30, 6), "head.bias": _rand(g, 30, dtype=torch.bfloat16)}
    torch.save(sd, str(root / "pytorch_model.bin"))
    for mode in MODES:
        r = _run(root, mode, tmp_path)
        assert r.rc == 0, r.err
        assert json.loads(r.out)["bytes"] == os.path.getsize(root / "pytorch_model.bin")
    for state in _both(str(root)):
        _assert_same(state.model, sd)


def _edit_index(root: str, edit) -> None:
    path = os.path.join(root, "pytorch_model.bin.index.json")
    doc = json.load(open(path))
    edit(doc)
    with open(path, "w") as f:
        json.dump(doc, f)


def test_index_naming_a_missing_shard_is_one_line(hf_sharded, tmp_path):
    root, _, _ = hf_sharded
    _edit_index(root, lambda d: d["weight_map"].update({"extra.w": "pytorch_model-00009-of-00009.bin"}))
    for mode in MODES:
        _one_line(_run(root, mode, tmp_path), "pytorch_model-00009-of-00009.bin", "missing")
    _one_line(run_cli("load", root, "--no-verify"), "pytorch_model-00009-of-00009.bin", "missing")


def test_index_naming_a_file_outside_is_refused(hf_sharded, tmp_path):
    root, shards, _ = hf_sharded
    torch.save({"evil.w": torch.ones(2)}, str(tmp_path / "evil.bin"))  # it exists: the name alone is refused
    _edit_index(root, lambda d: d["weight_map"].update({"evil.w": "../evil.bin"}))
    for mode in MODES:
        _one_line(_run(root, mode, tmp_path), "'../evil.bin'", "refusing")
    _one_line(run_cli("read", root), "'../evil.bin'")


@pytest.mark.parametrize("raw, needle", [
    ("[1, 2]", "not an object"),
    ("{not json", "not valid UTF-8 JSON"),
    ('{"weight_map": {"w": 7}}', "not a file name"),
    ('{"metadata": {}}', "no weight_map"),
    pytest.param("[" * 100000 + "]" * 100000, "not valid UTF-8 JSON", id="nested-100000-deep"),
])
def test_garbage_index_is_one_line(hf_sharded, tmp_path, raw, needle):
    root, _, _ = hf_sharded
    with open(os.path.join(root, "pytorch_model.bin.index.json"), "w") as f:
        f.write(raw)
    _one_line(_run(root, "fused", tmp_path), "pytorch_model.bin.index.json", needle)


def test_tensor_in_another_shard_than_the_index_says_is_a_format_error(hf_sharded, tmp_path):
    from ckptbench.restore import load as restore
    from ckptbench.checkpoint.formats import FormatError

    root, _, _ = hf_sharded
    _edit_index(root, lambda d: d["weight_map"].update({"h.1.w": "pytorch_model-00001-of-00002.bin"}))
    for state_of in (lambda: _both(root)[0], lambda: _both(root)[1]):
        with pytest.raises(FormatError, match="maps 'h.1.w' to 'pytorch_model-00001-of-00002.bin', but only "
                                              "pytorch_model-00002-of-00002.bin holds it"):
            state_of()
    for mode in MODES:
        _one_line(_run(root, mode, tmp_path), "'h.1.w'", "disagree")
    _edit_index(root, lambda d: d["weight_map"].pop("h.1.w"))  # now the index names it nowhere
    with pytest.raises(FormatError, match="holds 'h.1.w', which pytorch_model.bin.index.json does not name"):
        restore.load_state(root, "torch")


# ---- nested dicts with plain leaves, legacy files -----------------------------------------------------------------


def _nested() -> dict:
    g = torch.Generator().manual_seed(11)
    return {
        "model": {"encoder": {"w": _rand(g, 6, 4), "b": _rand(g, 6)}, "head.w": _rand(g, 2, 6)},
        "optimizer": {"state": {0: {"step": torch.tensor(9.0), "exp_avg": _rand(g, 6, 4)}},
                      "param_groups": [{"lr": 0.01, "betas": (0.9, 0.999), "params": [0, 1, 2], "foreach": None}]},
        "epoch": 3, "loss": 0.25, "run": "exp-1", "resumed": True, "note": None, "blob": b"\x00\x01\xff",
        "rng": {"cpu": torch.arange(8, dtype=torch.uint8)}, "history": [1.5, 1.25, [0, 1]],
    }


def _nested_expected(obj: dict) -> tuple[dict, dict]:
    model = {k.removeprefix("model."): v for k, v in _flat(obj).items() if k.startswith("model.")}
    return model, {k: v for k, v in _flat(obj).items() if not k.startswith("model.")}


@pytest.mark.parametrize("legacy", [False, True])
def test_nested_dict_with_plain_leaves_loads_the_same_from_file_and_buffer(tmp_path, legacy):
    from ckptbench.checkpoint.formats.torch_format import load_buffer, load_file

    obj = _nested()
    path = tmp_path / "checkpoint.pt"
    torch.save(obj, str(path), _use_new_zipfile_serialization=not legacy)
    data = path.read_bytes()
    assert data.startswith(b"PK\x03\x04") is not legacy
    want_model, want_extra = _nested_expected(obj)
    for state in (load_file(str(path)), load_buffer(data, str(path)), load_buffer(bytearray(data), str(path))):
        _assert_same(state.model, want_model)
        _assert_same(state.extra, want_extra)
        assert state.optim == {} and state.step == 0


def test_ckptbench_own_shapes_keep_their_places():
    from ckptbench.checkpoint.formats.torch_format import load_buffer

    w = torch.arange(4.0)
    own = io.BytesIO()
    torch.save({"state": {"w": {"master": w, "exp_avg": w, "exp_avg_sq": w}}, "step": 5, "hparams": {"lr": 1}}, own)
    state = load_buffer(bytearray(own.getvalue()), "optim_rank000.pt")
    assert set(state.optim["w"]) == {"master", "exp_avg", "exp_avg_sq"} and state.step == 5 and not state.extra
    plain = io.BytesIO()
    torch.save({"w": w, "b": w}, plain)
    state = load_buffer(bytearray(plain.getvalue()), "model_rank000.pt")
    assert set(state.model) == {"w", "b"} and not state.extra and not state.optim
    mixed = io.BytesIO()
    torch.save({"w": w, "epoch": 2}, mixed)  # a top-level weight beside a scalar: weight in model, scalar in extra
    state = load_buffer(bytearray(mixed.getvalue()), "m.pt")
    assert set(state.model) == {"w"} and state.extra == {"epoch": 2}


@pytest.mark.parametrize("mode", MODES)
def test_legacy_files_restore_in_every_mode(tmp_path, mode):
    root = tmp_path / "legacy"
    root.mkdir()
    g = torch.Generator().manual_seed(2)
    sd = {"a.weight": _rand(g, 12, 5), "a.bias": _rand(g, 12, dtype=torch.float16)}
    torch.save(sd, str(root / "pytorch_model.bin"), _use_new_zipfile_serialization=False)
    obj = _nested()
    del obj["model"]  # the weights are in pytorch_model.bin; this one holds the rest
    torch.save(obj, str(root / "training_state.pt"), _use_new_zipfile_serialization=False)
    r = _run(root, mode, tmp_path)
    assert r.rc == 0, r.err
    assert json.loads(r.out)["files"] == 2
    for state in _both(str(root)):
        _assert_same(state.model, sd)
        _assert_same(state.extra, _flat(obj))


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.uint16])
def test_a_legacy_file_with_a_dtype_that_format_cannot_name_says_so_not_corrupt(tmp_path, dtype):
    """torch.save's legacy format writes a float8 or uint16 storage untyped, and torch.load fails on it (an
    AttributeError): the line said "the shard is corrupt or truncated" of a file torch wrote as it does."""
    root = tmp_path / "legacy"
    root.mkdir()
    torch.save({"w": torch.zeros(4, dtype=dtype), "b": torch.ones(3)}, str(root / "model.pt"),
               _use_new_zipfile_serialization=False)
    with pytest.raises(Exception):  # what the line claims: torch itself cannot read it back
        torch.load(str(root / "model.pt"), weights_only=True)
    for mode in MODES:
        line = _one_line(_run(str(root), mode, tmp_path), "model.pt", "legacy format", "torch.load cannot read back")
        assert "corrupt" not in line and "crafted" not in line


def test_two_files_disagreeing_on_a_key_is_a_format_error_naming_both(tmp_path):
    from ckptbench.restore import load as restore
    from ckptbench.checkpoint.formats import FormatError

    root = tmp_path / "clash"
    root.mkdir()
    torch.save({"model": {"w": torch.ones(3)}, "epoch": 1}, str(root / "a.pt"))
    torch.save({"model": {"w": torch.ones(3)}, "epoch": 1}, str(root / "b.pt"))  # agrees: one checkpoint
    assert set(restore.load_state(str(root), "torch").model) == {"w"}
    torch.save({"model": {"w": torch.zeros(3)}, "epoch": 1}, str(root / "b.pt"))
    with pytest.raises(FormatError, match=r"b\.pt: model 'w' is also in .*a\.pt, with a different value"):
        restore.load_state(str(root), "torch")
    torch.save({"model": {"w": torch.ones(3)}, "epoch": 2}, str(root / "b.pt"))
    for mode in MODES:
        _one_line(_run(str(root), mode, tmp_path), "b.pt", "entry 'epoch'", "a.pt")


def _step(e: int, k: float) -> float:
    return k ** e


def test_an_empty_container_is_restored_as_a_scheduler_needs_it(tmp_path):
    """LambdaLR saves lr_lambdas as [{}] for a functools.partial (its __dict__), and its load_state_dict pops the
    key: flattened to no leaf, it was missing from the restore, and a resume from it raised KeyError. Lightning's
    empty loop states and DeepSpeed's empty buffer_names went the same way."""
    import functools

    from ckptbench.checkpoint.formats.state import nest

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, [functools.partial(_step, k=0.9)])
    opt.step()
    sched.step()
    torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    torch.save({**sched.state_dict(), "none_yet": [], "no_groups": {}}, tmp_path / "scheduler.pt")
    for state in _both(str(tmp_path)):
        assert state.extra["scheduler.lr_lambdas.0"] == {} and state.extra["scheduler.none_yet"] == []
        assert state.extra["scheduler.no_groups"] == {}
        tree, clashes = nest(dict(state.extra), state.tuples)
        assert not clashes
        again = torch.optim.lr_scheduler.LambdaLR(opt, [functools.partial(_step, k=0.5)])
        again.load_state_dict({k: v for k, v in tree["scheduler"].items() if k not in ("none_yet", "no_groups")})
        assert again.state_dict()["lr_lambdas"] == [{}] and again.last_epoch == 1
