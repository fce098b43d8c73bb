"""The real writers' checkpoints under torchrun: the ranks restore the checkpoint a single process restores (the same
pick, computed by the same rule), under the same tensor names, with the same values row for row; the results rows
use the single-process status words."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import crc32c
import pytest
import torch


def _crc(t: torch.Tensor) -> str:
    return f"{crc32c.crc32c(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()):08x}"


def _single(root: str) -> dict[str, torch.Tensor]:
    """Every tensor of the single-process restore, by the name it gives it."""
    from ckptbench.restore import load as restore
    from ckptbench.sources.local import LocalSource

    listing = LocalSource(root, checkpoint=True).list()
    shards = [f.path for f in listing.files if f.path.endswith(restore.SHARD_EXT[listing.format])]
    state = restore.load_state(listing.source, listing.format, shards=shards, lay=listing.layout)
    return {name: t for _, name, t in state.tensors()}


def _torchrun(root: str, results: str) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ckptbench",
           "run", root, "--distributed", "--repeat", "1", "--results", results, "--json", "--tensor-digests"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout)


@pytest.mark.parametrize("name", ["torchtitan_dump", "hf_sharded", "megatron_torch_dist", "trainer_fsdp_sharded",
                                  "accelerate_two_models"])
def test_ranks_restore_what_one_process_restores_by_name_and_value(name, compat, tmp_path):
    c = compat(name)
    results = str(tmp_path / "R.csv")
    doc = _torchrun(c.root, results)
    assert doc["source"] == c.picked and doc["status"] == "unverified"
    single = _single(c.root)
    ranks = doc["repeats"][0]["ranks"]
    held = {}
    for r in ranks:
        for key, digest in r["digests"].items():
            held.setdefault(key, []).append((r["rank"], digest))
    floating = {k for k, t in single.items() if t.dim() > 0}
    assert floating <= set(held), f"named differently by the ranks: {sorted(floating - set(held))[:5]}"
    for key in floating:
        t = single[key]
        rows = t.chunk(2) if t.shape[0] >= 2 else (t,)
        assert sorted(d for _, d in held[key]) == sorted(_crc(x) for x in rows) or \
            [d for _, d in held[key]] == [_crc(t)], key  # split by rows as FSDP shards, or held whole by one rank
    assert doc["verified"] is False  # no manifest: nothing matched
    with open(results) as f:
        rows = list(csv.DictReader(f))
    assert rows and all(row["status"] == "unverified" for row in rows)  # the single-process word, not "ok"
