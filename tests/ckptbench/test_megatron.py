"""Megatron-LM checkpoints, written here as Megatron writes them: a root with latest_checkpointed_iteration.txt and
iter_NNNNNNN directories, each holding a torch.save per model-parallel rank (mp_rank_TT/model_optim_rng.pt, with
args as an argparse.Namespace) or, saved as torch_dist, a DCP checkpoint beside common.pt. The restore descends into
the iteration the file names and reads nothing of the others; the ranks' same-named slices are kept apart; a
hostile or ambiguous iteration file is one line."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random

import numpy as np
import pytest
import torch

MODES = ("fused", "staged")


def megatron_shard(tp: int, iteration: int, root: str, tp_size: int = 2, pp_size: int = 1, ep_size: int = 1) -> dict:
    g = torch.Generator().manual_seed(tp * 10_000 + iteration)
    h = 32
    encoder = {f"layers.{i}.self_attention.query_key_value.weight": torch.randn(3 * h // 2, h, generator=g)
               for i in range(2)}
    model = {"language_model": {"embedding": {"word_embeddings": {"weight": torch.randn(50, h, generator=g)}},
                                "encoder": encoder | {"final_layernorm.weight": torch.ones(h)}}}
    params = [model["language_model"]["embedding"]["word_embeddings"]["weight"], *encoder.values()]
    optimizer = {"optimizer": {"state": {i: {"exp_avg": torch.randn(p.shape, generator=g),
                                             "exp_avg_sq": torch.rand(p.shape, generator=g)}
                                         for i, p in enumerate(params)},
                               "param_groups": [{"lr": 1e-4, "params": list(range(len(params)))}]},
                 "fp32_from_fp16_params": [[p.float().clone() for p in params]]}
    return {"args": argparse.Namespace(tensor_model_parallel_size=tp_size, pipeline_model_parallel_size=pp_size,
                                       expert_model_parallel_size=ep_size, iteration=iteration, save=root),
            "checkpoint_version": 3.0, "iteration": iteration, "model": model, "optimizer": optimizer,
            "opt_param_scheduler": {"max_lr": 1e-4, "num_steps": iteration},
            "rng_state": [{"random_rng_state": random.Random(tp).getstate(),
                           "np_rng_state": np.random.RandomState(tp).get_state(),
                           "torch_rng_state": torch.get_rng_state()}]}


def write_megatron(root, iterations=(1000, 2000), latest: str | None = "2000", tp: int = 2, pp: int = 1,
                   ep: int = 1) -> dict:
    """The tree; returns {relative path: the saved object} of every rank file (mp_rank_TT, then _PPP under pipeline
    parallelism and _EEE under expert parallelism, as Megatron's get_checkpoint_name names them)."""
    saved = {}
    for it in iterations:
        for rank, stage, expert in itertools.product(range(tp), range(pp), range(ep)):
            tag = f"mp_rank_{rank:02d}" + (f"_{stage:03d}" if pp > 1 else "") + (f"_{expert:03d}" if ep > 1 else "")
            rel = f"iter_{it:07d}/{tag}/model_optim_rng.pt"
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            saved[rel] = megatron_shard((rank * pp + stage) * ep + expert, it, str(root), tp, pp, ep)
            torch.save(saved[rel], os.path.join(root, rel))
    if latest is not None:
        (root / "latest_checkpointed_iteration.txt").write_text(latest + "\n")
    return saved


@pytest.fixture
def meg(tmp_path):
    root = tmp_path / "megatron"
    root.mkdir()
    return root, write_megatron(root)


@pytest.mark.parametrize("mode", MODES)
def test_the_latest_iteration_is_restored_and_no_other(meg, h, tmp_path, mode):
    root, saved = meg
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["status"] == "unverified" and doc["format"] == "torch"
    assert doc["source"] == str(root / "iter_0002000")
    wanted = [rel for rel in saved if rel.startswith("iter_0002000/")]
    assert doc["files"] == 2 and doc["bytes"] == sum(os.path.getsize(root / rel) for rel in wanted)
    assert "argparse.Namespace" in doc["notes"]["load"]


def test_each_ranks_slices_come_back_under_its_rank(meg):
    from ckptbench.restore import load as restore
    from ckptbench.sources.local import LocalSource

    root, saved = meg
    listing = LocalSource(str(root), checkpoint=True).list()
    state = restore.load_state(listing.source, listing.format, shards=[f.path for f in listing.files])
    for rank in (0, 1):
        obj = saved[f"iter_0002000/mp_rank_{rank:02d}/model_optim_rng.pt"]
        tag = f"mp_rank_{rank:02d}"
        lm = obj["model"]["language_model"]
        assert torch.equal(state.model[f"{tag}.language_model.embedding.word_embeddings.weight"],
                           lm["embedding"]["word_embeddings"]["weight"])
        for k, t in lm["encoder"].items():
            assert torch.equal(state.model[f"{tag}.language_model.encoder.{k}"], t)
        for i, parts in obj["optimizer"]["optimizer"]["state"].items():
            assert torch.equal(state.extra[f"{tag}.optimizer.optimizer.state.{i}.exp_avg_sq"], parts["exp_avg_sq"])
        assert state.extra[f"{tag}.args.iteration"] == 2000  # the Namespace, kept as data
    assert all(k.startswith(("mp_rank_00.", "mp_rank_01.")) for k in state.model)


def test_expert_parallel_ranks_come_back_each_under_its_rank(tmp_path):
    """Under expert parallelism Megatron adds the expert rank to the folder (mp_rank_TT_PPP_EEE): every rank's file is
    one of the save, its slices kept under its own folder's name."""
    from ckptbench.checkpoint.formats import group_of
    from ckptbench.restore import load as restore
    from ckptbench.sources.local import LocalSource

    root = tmp_path / "m"
    root.mkdir()
    saved = write_megatron(root, iterations=(7,), latest="7", tp=1, pp=2, ep=2)
    listing = LocalSource(str(root), checkpoint=True).list()
    assert len(listing.files) == 4
    state = restore.load_state(listing.source, listing.format, shards=[f.path for f in listing.files])
    for rel, obj in saved.items():
        tag = rel.split("/")[1]
        assert torch.equal(state.model[f"{tag}.language_model.embedding.word_embeddings.weight"],
                           obj["model"]["language_model"]["embedding"]["word_embeddings"]["weight"])
        assert state.extra[f"{tag}.args.expert_model_parallel_size"] == 2
        # counted as optimizer state under its rank's tag, not as a weight
        assert group_of(f"{tag}.optimizer.optimizer.state.0.exp_avg") == "optimizer"


def test_a_second_rank_no_args_explain_is_named_as_either(tmp_path, h):
    """mp_rank_TT_XXX is a pipeline or an expert rank: with no sizes saved to say which, it is named as either, and
    the ranks' own largest stands for the size."""
    import shutil

    root = tmp_path / "m"
    root.mkdir()
    saved = write_megatron(root, iterations=(10,), latest="10", tp=2, ep=2)
    for rel, obj in saved.items():
        del obj["args"].expert_model_parallel_size, obj["args"].pipeline_model_parallel_size
        torch.save(obj, root / rel)
    shutil.rmtree(root / "iter_0000010" / "mp_rank_01_001")
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc != 0 and len(r.err_lines) == 1 and "Traceback" not in r.err, r.err
    assert ("tensor-parallel size 2, pipeline or expert size 2, but mp_rank_01_001 is missing (3 found)"
            in r.err_lines[0]), r.err_lines[0]


def test_rank_folders_of_two_parallel_layouts_are_refused(tmp_path, h):
    """mp_rank_00 beside mp_rank_00_000: one save names every rank folder alike, so these are two saves' ranks."""
    import shutil

    root = tmp_path / "m"
    root.mkdir()
    write_megatron(root, iterations=(10,), latest="10", tp=2, pp=2)
    shutil.copytree(root / "iter_0000010" / "mp_rank_00_000", root / "iter_0000010" / "mp_rank_00")
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc != 0 and r.out == "" and len(r.err_lines) == 1 and "Traceback" not in r.err, r.err
    assert "(mp_rank_00 and mp_rank_00_000)" in r.err_lines[0] and "re-copy the iteration" in r.err_lines[0]


def test_inspect_names_the_layout_and_groups(meg, h):
    root, _ = meg
    r = h.run_cli("inspect", root, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["source"] == str(root / "iter_0002000") and doc["layout"]["name"] == "megatron"
    assert set(doc["groups"]) == {"model", "optimizer", "other"}


def test_pointing_at_an_iteration_restores_it(meg, h, tmp_path):
    root, _ = meg
    r = h.run_cli("run", root / "iter_0001000", "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["files"] == 2


@pytest.mark.parametrize("latest, needle", [
    ("../../etc", "neither an iteration number nor `release`"),
    ("3000", "iter_0003000 is not in"),
    ("release", "release is not in"),
    ("12345678", "iter_12345678 is not in"),  # Megatron's iter_%07d past 9999999: a folder name it can have
    ("1" * 13, "neither an iteration number"),
])
def test_a_bad_iteration_file_is_one_line(meg, h, tmp_path, latest, needle):
    root, _ = meg
    (root / "latest_checkpointed_iteration.txt").write_text(latest)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc != 0 and r.out == ""
    assert len(r.err_lines) == 1 and "Traceback" not in r.err, r.err
    assert "latest_checkpointed_iteration.txt" in r.err_lines[0] and needle in r.err_lines[0], r.err_lines[0]


@pytest.mark.parametrize("tp, pp, ep, drop, needle", [
    (2, 1, 1, "mp_rank_01", "tensor-parallel size 2, but mp_rank_01 is missing (1 found)"),  # its args say 2
    (4, 1, 1, "mp_rank_02", "tensor-parallel size 4, but mp_rank_02 is missing (3 found)"),
    (2, 2, 1, "mp_rank_01_001", "tensor-parallel size 2, pipeline size 2, but mp_rank_01_001 is missing (3 found)"),
    # expert parallelism alone names mp_rank_TT_EEE, as pipeline parallelism does mp_rank_TT_PPP: the args say which
    (2, 1, 2, "mp_rank_00_001", "tensor-parallel size 2, expert size 2, but mp_rank_00_001 is missing (3 found)"),
    (1, 2, 2, "mp_rank_00_001_000",
     "tensor-parallel size 1, pipeline size 2, expert size 2, but mp_rank_00_001_000 is missing (3 found)"),
])
@pytest.mark.parametrize("mode", MODES)
def test_an_iteration_short_of_a_model_parallel_rank_is_refused(tmp_path, h, tp, pp, ep, drop, needle, mode):
    """Each rank's slices are kept under its mp_rank_ tag, so an iteration missing one restored as whole; a
    resume's rank that loads the missing file fails."""
    import shutil

    root = tmp_path / "m"
    root.mkdir()
    write_megatron(root, iterations=(10,), latest="10", tp=tp, pp=pp, ep=ep)
    whole = h.run_cli("run", root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
    assert whole.rc == 0 and json.loads(whole.out)["files"] == tp * pp * ep, whole.err
    shutil.rmtree(root / "iter_0000010" / drop)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
    assert r.rc != 0 and r.out == "" and len(r.err_lines) == 1 and "Traceback" not in r.err, r.err
    assert needle in r.err_lines[0] and "re-copy the iteration" in r.err_lines[0], r.err_lines[0]


@pytest.mark.parametrize("iteration, latest", [(12345678, "12345678"), (5, "00000005")])
def test_an_iteration_as_megatron_writes_and_reads_it_is_restored(tmp_path, h, iteration, latest):
    """Megatron names the folder iter_%07d (eight digits past iteration 9999999) and reads the file back with int()
    (leading zeros taken): both were refused as no iteration, a checkpoint Megatron resumes from."""
    root = tmp_path / "m"
    root.mkdir()
    write_megatron(root, iterations=(iteration,), latest=latest, tp=1)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["source"] == str(root / f"iter_{iteration:07d}")


def test_two_iterations_and_no_iteration_file_is_ambiguous(tmp_path, h):
    root = tmp_path / "m"
    root.mkdir()
    write_megatron(root, latest=None, tp=1)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc != 0 and len(r.err_lines) == 1, r.err
    assert "2 Megatron iteration directories (iter_0001000, iter_0002000)" in r.err_lines[0]


def test_a_torch_dist_iteration_restores_as_dcp(tmp_path, h):
    import torch.distributed.checkpoint as dcp

    root = tmp_path / "dist"
    it = root / "iter_0000500"
    it.mkdir(parents=True)
    sd = {"decoder.layers.0.mlp.linear_fc1.weight": torch.randn(16, 8),
          "embedding.word_embeddings.weight": torch.randn(20, 8)}
    dcp.save(sd, checkpoint_id=str(it))
    torch.save({"args": argparse.Namespace(ckpt_format="torch_dist"), "iteration": 500}, it / "common.pt")
    (it / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (root / "latest_checkpointed_iteration.txt").write_text("500")
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["format"] == "dcp" and doc["source"] == str(it) and doc["status"] == "unverified"
    from ckptbench.restore import load as restore

    state = restore.load_state(str(it), "dcp")
    for k, t in sd.items():
        assert torch.equal(state.model[k], t), k


# ---- megatron-core's torch_dist: what its DCP files hold beyond torch's (the real one: tests/compat) --------------


def _dist(tmp_path, state: dict, megatron: bool):
    """A DCP checkpoint torch writes, with Megatron's metadata.json beside it when `megatron`; its metadata
    unpickled for crafting."""
    import pickle
    import warnings

    import torch.distributed.checkpoint as dcp

    d = tmp_path / ("dist" if megatron else "plain")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(d), no_dist=True)
    if megatron:
        (d / "metadata.json").write_text('{"sharded_backend": "torch_dist", "sharded_backend_version": 1}')
    with open(d / ".metadata", "rb") as f:
        return d, pickle.load(f)


def _rewrite(d, meta) -> None:
    import pickle

    with open(d / ".metadata", "wb") as f:
        pickle.dump(meta, f)


def test_saved_plans_in_the_metadata_are_admitted_and_dropped(tmp_path):
    """megatron-core keeps every rank's SavePlan in .metadata (`all_local_plans`): refusing the planner's classes
    refused every torch_dist checkpoint Megatron writes. They are admitted, and the attribute is not kept."""
    from torch.distributed.checkpoint.planner import (SavePlan, TensorWriteData, WriteItem, WriteItemType)
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    from ckptbench.checkpoint.formats import dcp_format

    d, meta = _dist(tmp_path, {"w": torch.arange(6.0)}, megatron=True)
    md = meta.state_dict_metadata["w"]
    meta.all_local_plans = [SavePlan([WriteItem(MetadataIndex("w", torch.Size([0])), WriteItemType.SHARD,
                                                tensor_data=TensorWriteData(ChunkStorageMetadata(
                                                    torch.Size([0]), torch.Size([6])), md.properties, md.size))])]
    _rewrite(d, meta)
    state = dcp_format.load_dir(str(d))
    assert torch.equal(state.model["w"], torch.arange(6.0))
    from ckptbench.checkpoint.formats.dcp_metadata import SafeReader

    assert not hasattr(SafeReader(str(d)).read_metadata(), "all_local_plans")


def test_a_saved_plan_carrying_a_forbidden_global_is_still_refused(tmp_path):
    from ckptbench.checkpoint.formats import dcp_format
    from ckptbench.checkpoint.formats.state import FormatError

    class Evil:
        def __reduce__(self):
            return os.system, ("echo crafted",)

    d, meta = _dist(tmp_path, {"w": torch.arange(6.0)}, megatron=True)
    meta.all_local_plans = [Evil()]
    _rewrite(d, meta)
    with pytest.raises(FormatError, match=r"names posix\.system, which is not DCP metadata"):
        dcp_format.load_dir(str(d))


REAL = os.path.join(os.path.dirname(__file__), "..", "compat", "fixtures", "megatron_torch_dist", "iter_0000010")


@pytest.mark.parametrize("megatron", [True, False])
def test_a_sharded_objects_list_is_unwrapped_only_where_megatron_wrote_it(tmp_path, megatron):
    """megatron-core saves each ShardedObject as a torch.save of a one-item list and its load hands the resume the
    item (its RNG states, each layer's extra state); without its metadata.json the same bytes are a DCP byte entry
    like any other, and its value is the list. The checkpoint is one megatron-core wrote (tests/compat)."""
    import shutil

    from ckptbench.checkpoint.formats import dcp_format

    d = tmp_path / "iter"
    shutil.copytree(REAL, d)
    if not megatron:
        (d / "metadata.json").unlink()
    extra = dcp_format.load_dir(str(d)).extra
    rng = extra["rng_state/shard_0.0_1.1"]
    extra_state = extra["decoder.layers.mlp.linear_fc1._extra_state/shard_0_2"]
    if not megatron:
        assert extra_state == [None] and len(rng) == 1
        extra_state, rng = extra_state[0], rng[0]
    # Megatron-LM's own RNG state is a list (one per virtual pipeline stage) of dicts
    assert extra_state is None and isinstance(rng, list) and len(rng) == 1
    assert set(rng[0]) == {"random_rng_state", "np_rng_state", "torch_rng_state"}


def _saved(value) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def test_numpy_in_a_byte_entry_comes_back_as_numbers_and_never_as_objects():
    """Megatron's RNG ShardedObject holds numpy's state (an array of uint32): it is loaded as the numbers it is.
    An array of strings is not numbers and stays the bytes it was saved as."""
    from ckptbench.checkpoint.formats.dcp_format import load_byte_entry
    from ckptbench.checkpoint.formats.state import RawBytes

    state = np.random.RandomState(3).get_state()
    got = load_byte_entry(_saved([state]))
    assert got[0][0] == "MT19937" and np.array_equal(got[0][1], state[1]) and got[0][1].dtype == np.uint32
    assert isinstance(load_byte_entry(_saved([np.array(["a", "b"])])), RawBytes)
    assert isinstance(load_byte_entry(_saved([np.array([object()], dtype=object)])), RawBytes)


def test_a_torch_dist_iteration_restores_its_common_state(tmp_path, h):
    """common.pt holds what Megatron does not shard (iteration, args, the scheduler): its resume merges it into
    the state it loads; it was read and never deserialized."""
    import torch.distributed.checkpoint as dcp

    it = tmp_path / "dist" / "iter_0000300"
    it.mkdir(parents=True)
    dcp.save({"embedding.word_embeddings.weight": torch.randn(20, 8)}, checkpoint_id=str(it), no_dist=True)
    torch.save({"iteration": 300, "opt_param_scheduler": {"num_steps": 300, "max_lr": 3e-4}}, it / "common.pt")
    (it / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (tmp_path / "dist" / "latest_checkpointed_iteration.txt").write_text("300")
    from ckptbench.restore import load as restore

    state = restore.load_state(str(it), "dcp")
    assert state.extra["iteration"] == 300 and state.extra["opt_param_scheduler.num_steps"] == 300
    r = h.run_cli("inspect", tmp_path / "dist", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["layout"]["name"] == "megatron" and doc["layout"]["tag"] == "iter_0000300"
    assert "common.pt" not in json.dumps(doc["layout"].get("unloaded", []))
