"""Hostile input, tenth round. Each input is made by the real library (torch.save, safetensors, DCP) and then
crafted where it must be; bad input is one line naming what and where and a non-zero exit, never a traceback."""

from __future__ import annotations

import warnings

import pytest
import torch
from clirun import assert_one_line_error, run_cli


@pytest.mark.parametrize("cmd", ["inspect", "load", "run"])
def test_dcp_quantized_tensor_is_one_line(tmp_path, h, cmd):
    """DCP saves a quantized tensor with only its dtype in the metadata (no scale or zero point): the empty tensor
    allocated for it had no quantizer, and its first narrow was torch's INTERNAL ASSERT as a traceback out of
    load (run wrapped it as 'could not be loaded')."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q = torch.quantize_per_tensor(torch.randn(4, 4), 0.1, 0, torch.qint8)
    src, _ = h.dcp_saved(tmp_path / "q", {"model": {"w": torch.randn(2, 2)}, "q": q})
    extra = ("--repeat", "1", "--results", "") if cmd == "run" else ()
    r = run_cli(cmd, src, *extra)
    assert_one_line_error(r, "entry 'q' is a torch.qint8 tensor")


@pytest.mark.parametrize("planted", ["empty-manifest", "added-file", "added-folder"])
def test_gen_force_keeps_what_the_manifest_does_not_list(tmp_path, h, planted):
    """gen --force took any ckptbench.json as proof that gen wrote the folder: a '{}' beside the user's own files, or
    a file the user added to a generated checkpoint since, was deleted with the rest. Now one line, nothing touched."""
    target = tmp_path / "t"
    if planted == "empty-manifest":
        target.mkdir()
        (target / "ckptbench.json").write_text("{}")
        (target / "notes.txt").write_text("keep me")
    else:
        assert h.run_cli("gen", "small", target, "--scale", h.SCALE).rc == 0
        extra = target / ("notes.txt" if planted == "added-file" else "mine/notes.txt")
        extra.parent.mkdir(exist_ok=True)
        extra.write_text("keep me")
    before = h.snapshot(target)
    r = h.run_cli("gen", "small", target, "--scale", h.SCALE, "--seed", "1", "--force")
    needle = "version is null" if planted == "empty-manifest" else "which its ckptbench.json does not list"
    assert_one_line_error(r, needle)
    assert h.snapshot(target) == before


@pytest.mark.parametrize("cmd", ["verify", "read", "run"])
def test_manifest_listing_a_file_twice_is_refused(tmp_path, h, ckpt, cmd):
    """A manifest listing one file N times had it read, hashed and counted N times (verify said 'OK: 22 files' of a
    folder of 21, the bytes summed twice): 64 MiB of manifest is 600,000 entries of one 10 GB shard, work far past
    the checkpoint's size. A path listed twice is refused in one line, before any read."""
    root = tmp_path / "ck"
    h.copy_ckpt(ckpt("safetensors", 1), root)
    doc = h.read_manifest(root)
    doc["files"].append(dict(doc["files"][0]))
    h.write_manifest(root, doc)
    extra = ("--repeat", "1", "--results", "") if cmd == "run" else ()
    r = run_cli(cmd, root, *extra)
    assert_one_line_error(r, f"files[{len(doc['files']) - 1}].path", rc=1)
    assert "is listed twice" in r.err


@pytest.mark.parametrize("cmd", ["inspect", "load", "run"])
def test_torch_zip_member_outside_the_archive_folder_is_one_verdict(tmp_path, cmd):
    """A torch.save archive with a member '../../evil' beside its own: inspect refused it (torch's reader, opening the
    file by path), run and load restored it 'ok' (the same reader over the read buffer took it)."""
    import zipfile

    root = tmp_path / "ck"
    root.mkdir()
    torch.save({"w": torch.randn(4, 4)}, root / "m.pt")
    with zipfile.ZipFile(root / "m.pt", "a", zipfile.ZIP_STORED) as z:
        z.writestr("../../evil", b"x")
    extra = ("--repeat", "1", "--results", "") if cmd == "run" else ()
    r = run_cli(cmd, root, *extra)
    assert_one_line_error(r, "zip member '../../evil' lies outside the archive's folder 'm/'")


@pytest.mark.parametrize("run_id", [["a"], {"a": 1}])
def test_history_an_ended_record_whose_run_id_is_not_text(tmp_path, ckpt, run_id):
    """An 'ended' line of the .jsonl whose run_id was a list or an object (a hand-edited or damaged file) was a
    TypeError traceback out of history (the set of ended runs hashed it); it ends no run, and history lists the rest."""
    import json

    results = tmp_path / "results.csv"
    assert run_cli("run", ckpt("safetensors", 1), "--repeat", "1", "--results", results).rc == 0
    with open(f"{results}.jsonl", "a") as f:
        f.write(json.dumps({"record": "ended", "kind": "restore", "schema": 3, "run_id": run_id}) + "\n")
    for args in ((), ("--json",)):
        r = run_cli("history", results, *args)
        assert r.rc == 0 and "Traceback" not in r.err, r.err
        assert "restore" in r.out


def test_a_nested_tensor_is_named_as_one(tmp_path):
    """A torch.save'd nested tensor was refused as "is torch.strided on cpu, not a CPU tensor" (a nested tensor's
    layout reads strided): the line contradicted itself and named nothing the user could recognise."""
    root = tmp_path / "ck"
    root.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.save({"w": torch.nested.nested_tensor([torch.randn(2), torch.randn(3)])}, root / "m.pt")
    r = run_cli("inspect", root)
    assert_one_line_error(r, "tensor 'w' is a nested tensor, not a plain CPU tensor")


def test_save_names_a_complex_rng_array_for_what_it_is(tmp_path):
    """A numpy RNG entry of complex numbers was turned into a list JSON cannot hold, and the note on what was not
    saved called it 'nested too deep'; it is named as the numpy array it is."""
    import numpy as np

    src = tmp_path / "src"
    src.mkdir()
    torch.save({"model": {"w": torch.randn(4, 4)}, "rng_state": np.array([1 + 2j, 3j])}, src / "checkpoint.pt")
    r = run_cli("save", src, tmp_path / "t", "--count", "1", "--results", "", "--format", "torch")
    assert r.rc == 0, r.err
    assert "rng_state: a numpy.ndarray, not plain data" in r.out + r.err
    assert "nested too deep" not in r.out + r.err


def _indexed_safetensors(d):
    """Two safetensors shards and their index, as save_pretrained(max_shard_size=…) lays them out."""
    import json

    from safetensors.torch import save_file

    d.mkdir()
    save_file({"a.weight": torch.ones(4, 4)}, d / "model-00001-of-00002.safetensors")
    save_file({"b.weight": torch.zeros(4, 4)}, d / "model-00002-of-00002.safetensors")
    index = {"metadata": {"total_size": 128}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                                                             "b.weight": "model-00002-of-00002.safetensors"}}
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return index


@pytest.mark.parametrize("cmd", ["run", "load"])
def test_a_safetensors_index_naming_a_weight_its_shard_lacks_is_one_line(tmp_path, cmd):
    """The index maps c.weight to a shard that does not hold it: from_pretrained would leave that weight at its
    random init (a warning in a log), and the restore said ok. The .bin index was checked so; now the safetensors
    one is too, in the fused and the staged load alike."""
    import json

    d = tmp_path / "ckpt"
    index = _indexed_safetensors(d)
    index["weight_map"]["c.weight"] = "model-00002-of-00002.safetensors"
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    args = [cmd, d] + (["--repeat", "1", "--results", tmp_path / "R.csv"] if cmd == "run" else [])
    assert_one_line_error(run_cli(*args), "maps 'c.weight' to 'model-00002-of-00002.safetensors', but no shard "
                                          "holds it")


def test_a_safetensors_index_that_agrees_restores(tmp_path):
    d = tmp_path / "ckpt"
    _indexed_safetensors(d)
    r = run_cli("run", d, "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err


@pytest.mark.parametrize("cmd", ["run", "load"])
def test_a_weight_copied_into_a_shard_the_index_does_not_name_is_one_line(tmp_path, cmd):
    """The second shard also holds a.weight (all NaN), which the index maps to the first: the shards were merged in
    order, the later copy won, and the restore judged the copy, not the weight the index names (a NaN copy failed a
    sound weight; a sound copy would have hidden a damaged one). Now one line naming both shards."""
    from safetensors.torch import save_file

    d = tmp_path / "ckpt"
    _indexed_safetensors(d)
    save_file({"b.weight": torch.zeros(4, 4), "a.weight": torch.full((4, 4), float("nan"))},
              d / "model-00002-of-00002.safetensors")
    args = [cmd, d] + (["--repeat", "1", "--results", tmp_path / "R.csv"] if cmd == "run" else [])
    assert_one_line_error(run_cli(*args), "model-00002-of-00002.safetensors: model 'a.weight' is also in")


@pytest.mark.parametrize("cmd", ["run", "load"])
def test_an_optimizer_part_two_safetensors_shards_hold_apart_is_one_line(tmp_path, h, cmd):
    """Optimizer shards have no index: a second shard holding another value of a part the first holds was merged
    over it (the later won) and the restore passed, as if the checkpoint were one. torch shards were checked to
    agree (check_agree); safetensors shards now are too."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    d = tmp_path / "ckpt"
    assert h.run_cli("gen", "small", d, "--scale", h.SCALE).rc == 0
    (d / "ckptbench.json").unlink()  # a foreign checkpoint: no digests to catch the edit
    first, second = d / "optimizer-00001-of-00002.safetensors", d / "optimizer-00002-of-00002.safetensors"
    with safe_open(second, "pt") as f:
        meta = f.metadata()
    tensors, name = load_file(second), next(iter(load_file(first)))
    tensors[name] = load_file(first)[name] + 1
    save_file(tensors, second, metadata=meta)
    args = [cmd, d] + (["--repeat", "1", "--results", tmp_path / "R.csv"] if cmd == "run" else [])
    assert_one_line_error(run_cli(*args), f"optimizer state {name!r} is also in")


@pytest.mark.parametrize("cmd", ["inspect", "run", "load"])
def test_one_shard_of_a_sharded_model_without_its_index_is_one_line(tmp_path, cmd):
    """model-00001-of-00002.safetensors alone, its index and the other shard not copied: the restore passed with
    half the weights (both shards without the index still restore: the names count them whole)."""
    d = tmp_path / "ckpt"
    _indexed_safetensors(d)
    (d / "model.safetensors.index.json").unlink()
    (d / "model-00002-of-00002.safetensors").unlink()
    args = [cmd, d] + (["--repeat", "1", "--results", tmp_path / "R.csv"] if cmd == "run" else [])
    assert_one_line_error(run_cli(*args), "ckpt: model-00002-of-00002.safetensors is missing, and no "
                                          "model.safetensors.index.json says which weights the shards hold")
