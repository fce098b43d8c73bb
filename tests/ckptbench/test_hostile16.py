"""Hostile input, pass 16: a rank count a checkpoint's own pickle claims bounds no work (a Megatron args'
tensor_model_parallel_size or a DeepSpeed dp_world_size of 10**9 was a set of 10**9 ranks built in memory), and
inspect and check refuse a step short of a rank as run does (check said 'Checkpoint loads: ok')."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys

import pytest
import torch

from clirun import assert_one_line_error, run_cli
from test_megatron import write_megatron
from test_torch_layouts import _ds_step

HUGE = 10**9
LIMIT = 4 << 30  # address space for the CLI: torch imports in it; 10**9 ranks as a set do not fit


def _bounded(*args: str) -> subprocess.CompletedProcess:
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))

    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    return subprocess.run([sys.executable, "-m", "ckptbench", *map(str, args)], capture_output=True, text=True,
                          timeout=300, preexec_fn=cap, env=env)


def _one_line(proc: subprocess.CompletedProcess, *needles: str) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("ckptbench: error: ") and all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def _megatron(tmp_path, tp: int = 1, pp: int = 1, ep: int = 1, **args):
    root = tmp_path / "m"
    root.mkdir()
    saved = write_megatron(root, iterations=(10,), latest="10", tp=tp, pp=pp, ep=ep)
    for rel, obj in saved.items():
        for k, v in args.items():
            setattr(obj["args"], k, v)
        torch.save(obj, root / rel)
    return root


@pytest.mark.parametrize("pp, ep, args, needle", [
    (1, 1, {"tensor_model_parallel_size": HUGE}, f"tensor-parallel size {HUGE}, but mp_rank_01 is missing (1 found)"),
    (2, 1, {"pipeline_model_parallel_size": HUGE}, f"pipeline size {HUGE}, but mp_rank_00_002 is missing (2 found)"),
    (1, 2, {"expert_model_parallel_size": HUGE}, f"expert size {HUGE}, but mp_rank_00_002 is missing (2 found)"),
    (2, 2, {"tensor_model_parallel_size": HUGE, "expert_model_parallel_size": HUGE},  # a grid of 2 x 10**18
     f"tensor-parallel size {HUGE}, pipeline size 2, expert size {HUGE}, but mp_rank_00_000_002 is missing (4 found)"),
])
def test_a_megatron_size_of_a_billion_is_one_line_not_a_billion_ranks(tmp_path, pp, ep, args, needle):
    root = _megatron(tmp_path, pp=pp, ep=ep, **args)
    _one_line(_bounded("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv"), needle)
    _one_line(_bounded("inspect", root, "--json"), needle)


def test_a_deepspeed_world_of_a_billion_is_one_line_not_a_billion_ranks(tmp_path):
    root = tmp_path / "ds"
    saved = _ds_step(str(root), 5, n=16)
    states = saved["mp_rank_00_model_states.pt"] | {"dp_world_size": HUGE}
    torch.save(states, root / "mp_rank_00_model_states.pt")
    _one_line(_bounded("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv"),
              f"for {HUGE} data-parallel rank(s), but rank 2's is missing (2 found)")


def test_a_megatron_iteration_short_of_a_rank_fails_inspect_and_check(tmp_path):
    root = _megatron(tmp_path, tp=2)
    shutil.rmtree(root / "iter_0000010" / "mp_rank_01")
    needle = "tensor-parallel size 2, but mp_rank_01 is missing (1 found)"
    assert_one_line_error(run_cli("inspect", root, "--json"), needle)
    r = run_cli("check", root, "--json")
    assert r.rc != 0 and "Traceback" not in r.err, r.err
    loads = next(v for v in json.loads(r.out)["items"] if v["id"] == "loads")
    assert loads["verdict"] == "fail" and needle in loads["evidence"]["error"], loads


def test_a_deepspeed_step_short_of_a_partition_fails_check(tmp_path):
    root = tmp_path / "ds"
    _ds_step(str(root), 5, n=16, ranks=3)
    (root / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    r = run_cli("check", root, "--json")
    assert r.rc != 0 and "Traceback" not in r.err, r.err
    loads = next(v for v in json.loads(r.out)["items"] if v["id"] == "loads")
    assert loads["verdict"] == "fail" and "rank 1's is missing (2 found)" in loads["evidence"]["error"], loads


def _distrib_optim(root, tp: int, key) -> dict:
    """Megatron's distributed optimizer state beside each rank's model_optim_rng.pt, as its save_parameter_state
    torch.saves it: per grad buffer, keyed by (param dtype, grad dtype) (one dtype before megatron-core 0.6)."""
    saved = {}
    for rank in range(tp):
        g = torch.Generator().manual_seed(rank)
        saved[rank] = {"buckets_coalesced": True, "per_bucket_numel": [{key: [96]}],
                       "per_bucket_numel_unpadded": [{key: [90]}],
                       0: {key: {"param": torch.randn(90, generator=g), "exp_avg": torch.randn(90, generator=g),
                                 "exp_avg_sq": torch.rand(90, generator=g), "numel_unpadded": 90}}}
        torch.save(saved[rank], root / "iter_0000010" / f"mp_rank_{rank:02d}" / "distrib_optim.pt")
    return saved


@pytest.mark.parametrize("key, named", [((torch.bfloat16, torch.float32), "bfloat16,float32"),
                                        (torch.float32, "float32")])
@pytest.mark.parametrize("mode", ["fused", "staged"])
def test_a_megatron_iteration_with_the_distributed_optimizer_restores(tmp_path, key, named, mode):
    """Its dtype keys were refused as 'a key of type tuple: corrupt or crafted', every such iteration Megatron
    writes (--use-distributed-optimizer): they are named by their dtypes, each rank's kept under its tag."""
    from ckptbench.restore import load as restore
    from ckptbench.sources.local import LocalSource

    root = _megatron(tmp_path, tp=2)
    saved = _distrib_optim(root, 2, key)
    r = run_cli("run", root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
    assert r.rc == 0, r.err
    assert json.loads(r.out)["files"] == 4
    assert run_cli("inspect", root, "--json").rc == 0
    listing = LocalSource(str(root), checkpoint=True).list()
    state = restore.load_state(listing.source, listing.format, shards=[f.path for f in listing.files])
    got = state.model | state.extra
    for rank, obj in saved.items():
        for k in ("param", "exp_avg", "exp_avg_sq"):
            assert torch.equal(got[f"mp_rank_{rank:02d}.0.{named}.{k}"], obj[0][key][k]), (rank, k)


def test_a_rank_short_of_its_distributed_optimizer_file_is_refused(tmp_path):
    root = _megatron(tmp_path, tp=2)
    _distrib_optim(root, 2, (torch.bfloat16, torch.float32))
    (root / "iter_0000010" / "mp_rank_01" / "distrib_optim.pt").unlink()
    needle = "mp_rank_01 holds no 'distrib_optim.pt', which other model-parallel ranks saved"
    assert_one_line_error(run_cli("run", root, "--json", "--repeat", "1", "--results", tmp_path / "R.csv"), needle)
    assert_one_line_error(run_cli("inspect", root, "--json"), needle)


@pytest.mark.parametrize("key", [(1, 2), (torch.float32, "x"), ()])
def test_a_tuple_key_of_anything_but_dtypes_is_still_refused(tmp_path, key):
    (tmp_path / "c").mkdir()
    torch.save({"model": {"w": torch.ones(3)}, "state": {key: torch.zeros(2)}}, tmp_path / "c" / "model.pt")
    assert_one_line_error(run_cli("run", tmp_path / "c", "--json", "--repeat", "1", "--results", tmp_path / "R.csv"),
                          "has a key of type tuple")


def test_checkpoint_folders_named_with_control_characters_are_listed_quoted(tmp_path):
    """The ambiguity's line printed a folder's name bare: "b\\nckptbench: error: fake" read as a second error line's
    text and "c\\x1b[31mred" as "cred", a name --pick does not find."""
    from safetensors.torch import save_file

    names = ["a", "b\nckptbench: error: fake", "c\x1b[31mred"]
    for n in names:
        (tmp_path / "ck" / n).mkdir(parents=True)
        save_file({"w": torch.randn(8)}, str(tmp_path / "ck" / n / "model.safetensors"))
    shown = r"(a, 'b\nckptbench: error: fake', 'c\x1b[31mred')"
    assert_one_line_error(run_cli("run", tmp_path / "ck", "--json", "--repeat", "1", "--results", tmp_path / "R.csv"),
                          shown)
    r = run_cli("run", tmp_path / "ck", "--pick", names[2], "--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert r.rc == 0 and json.loads(r.out)["source"] == str(tmp_path / "ck" / names[2]), r.err


@pytest.mark.parametrize("mode", ["fused", "staged"])
def test_a_rank_copied_in_from_another_iteration_is_refused(tmp_path, mode):
    """iter_0000020 with mp_rank_01 of iteration 10: every rank there and its sizes agreeing, it restored as whole,
    a resume training on two steps' weights."""
    root = tmp_path / "m"
    root.mkdir()
    write_megatron(root, iterations=(10, 20), latest="20", tp=2)
    shutil.rmtree(root / "iter_0000020" / "mp_rank_01")
    shutil.copytree(root / "iter_0000010" / "mp_rank_01", root / "iter_0000020" / "mp_rank_01")
    needle = "its model-parallel ranks saved iteration 10 and 20"
    r = run_cli("run", root, "--json", "--repeat", "1", "--mode", mode, "--results", tmp_path / "R.csv")
    assert_one_line_error(r, needle)
    assert_one_line_error(run_cli("inspect", root, "--json"), needle)


@pytest.mark.parametrize("drop", ["common.pt", "metadata.json"])
def test_a_torch_dist_iteration_short_of_megatrons_own_files_is_refused(tmp_path, drop):
    """megatron-core loads metadata.json and common.pt (the iteration, args, scheduler) with the DCP files: without
    one the iteration was a plain DCP checkpoint restored 'ok', what a resume fails on or resumes without."""
    import argparse
    import warnings

    import torch.distributed.checkpoint as dcp

    it = tmp_path / "dist" / "iter_0000300"
    it.mkdir(parents=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"embedding.word_embeddings.weight": torch.randn(20, 8)}, checkpoint_id=str(it), no_dist=True)
    torch.save({"args": argparse.Namespace(ckpt_format="torch_dist"), "iteration": 300}, it / "common.pt")
    (it / "metadata.json").write_text('{"sharded_backend": "torch_dist"}')
    (tmp_path / "dist" / "latest_checkpointed_iteration.txt").write_text("300")
    args = ("--json", "--repeat", "1", "--results", tmp_path / "R.csv")
    assert run_cli("run", tmp_path / "dist", *args).rc == 0
    (it / drop).unlink()
    needle = f"a Megatron torch_dist iteration (DCP files) holds no {drop}"
    assert_one_line_error(run_cli("run", tmp_path / "dist", *args), needle)
    assert_one_line_error(run_cli("inspect", tmp_path / "dist", "--json"), needle)
