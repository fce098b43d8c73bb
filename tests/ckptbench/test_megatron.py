"""Megatron-LM checkpoints, written here as Megatron writes them: a root with latest_checkpointed_iteration.txt and
iter_NNNNNNN directories, each holding a torch.save per model-parallel rank (mp_rank_TT/model_optim_rng.pt, with
args as an argparse.Namespace) or, saved as torch_dist, a DCP checkpoint beside common.pt. The restore descends into
the iteration the file names and reads nothing of the others; the ranks' same-named slices are kept apart; a
hostile or ambiguous iteration file is one line."""

from __future__ import annotations

import argparse
import json
import os
import random

import numpy as np
import pytest
import torch

MODES = ("fused", "staged")


def megatron_shard(tp: int, iteration: int, root: str) -> dict:
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
    return {"args": argparse.Namespace(tensor_model_parallel_size=2, iteration=iteration, save=root),
            "checkpoint_version": 3.0, "iteration": iteration, "model": model, "optimizer": optimizer,
            "opt_param_scheduler": {"max_lr": 1e-4, "num_steps": iteration},
            "rng_state": [{"random_rng_state": random.Random(tp).getstate(),
                           "np_rng_state": np.random.RandomState(tp).get_state(),
                           "torch_rng_state": torch.get_rng_state()}]}


def write_megatron(root, iterations=(1000, 2000), latest: str | None = "2000", tp: int = 2) -> dict:
    """The tree; returns {relative path: the saved object} of every rank file."""
    saved = {}
    for it in iterations:
        for rank in range(tp):
            rel = f"iter_{it:07d}/mp_rank_{rank:02d}/model_optim_rng.pt"
            os.makedirs(os.path.dirname(os.path.join(root, rel)), exist_ok=True)
            saved[rel] = megatron_shard(rank, it, str(root))
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
    ("12345678", "neither an iteration number"),
])
def test_a_bad_iteration_file_is_one_line(meg, h, tmp_path, latest, needle):
    root, _ = meg
    (root / "latest_checkpointed_iteration.txt").write_text(latest)
    r = h.run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc != 0 and r.out == ""
    assert len(r.err_lines) == 1 and "Traceback" not in r.err, r.err
    assert "latest_checkpointed_iteration.txt" in r.err_lines[0] and needle in r.err_lines[0], r.err_lines[0]


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
