"""The floor as a distributed run's ranks met the box: every rank times the fresh memory its read populated, a repeat
adds the ranks' bytes and CPU time up (a core's rate, whichever rank spent it), and the run is held to its floor at
that rate, as a single-process run is. The arithmetic, then real gloo ranks restoring a checkpoint written by
safetensors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ckptbench.restore import efficiency
from ckptbench.system import floor as fl

MiB = 1 << 20


def _rep(nbytes: int, cpu_s: float, status: str = "ok") -> dict:
    return {"status": status, "populated": {"bytes": nbytes, "cpu_s": cpu_s}}


def test_the_ranks_rate_is_the_median_of_the_repeats_that_populated_enough_to_time():
    reps = [_rep(2 << 30, 1.0), _rep(2 << 30, 0.5), _rep(2 << 30, 2.0)]
    assert efficiency.met_ranks(reps) == pytest.approx((2 << 30) / 1.0 / 1e9)
    # a failed repeat, one under fl.MET_MIN_BYTES and one with no time say nothing of the rate
    assert efficiency.met_ranks([_rep(1 << 30, 1.0), _rep(8 << 30, 1.0, "failed"), _rep(MiB, 1e-4),
                                 _rep(1 << 30, 0.0)]) == pytest.approx((1 << 30) / 1e9)
    # runs recorded before the figure was kept, or a document whose figure is not one
    assert efficiency.met_ranks([{"status": "ok"}, {"status": "ok", "populated": "lots"},
                                 {"status": "ok", "populated": None}]) is None
    assert efficiency.met_ranks([]) is None


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """Two shards written by safetensors, 96 MiB together: past fl.MET_MIN_BYTES between the two ranks."""
    import torch
    from safetensors.torch import save_file

    root = tmp_path_factory.mktemp("dist-met") / "ck"
    root.mkdir()
    g = torch.Generator().manual_seed(3)
    for i in range(2):
        save_file({f"layer{i}.w{k}": torch.randn(2048, 1536, generator=g) for k in range(4)},
                  str(root / f"model-0000{i + 1}-of-00002.safetensors"))
    return root


def test_a_distributed_run_is_held_to_the_floor_as_its_ranks_met_fresh_memory(shards, plant_floor, tmp_path):
    plant_floor(400.0)  # far above anything this box populates at: the met rate is off it, and said
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ckptbench",
           "run", str(shards), "--distributed", "--repeat", "2", "--cache", "hot", "--json",
           "--results", str(tmp_path / "r.csv")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["status"] == "unverified" and doc["world_size"] == 2  # no manifest: nothing to verify against
    rates = []
    for rep in doc["repeats"]:
        ranks = rep["ranks"]
        assert all(r["populated_bytes"] > 0 and r["populate_cpu_s"] > 0 for r in ranks), ranks
        assert rep["populated"]["bytes"] == sum(r["populated_bytes"] for r in ranks)
        assert rep["populated"]["cpu_s"] == pytest.approx(sum(r["populate_cpu_s"] for r in ranks))
        assert rep["populated"]["bytes"] >= 96 * MiB  # every byte the ranks read landed in fresh memory
        rates.append(rep["populated"]["bytes"] / rep["populated"]["cpu_s"] / 1e9)
    met = doc["floor_as_met"]
    assert met is not None, doc["floor_note"]
    assert met["fresh_gbps_per_core"] == pytest.approx(sum(rates) / 2)  # the median of two
    assert met["floor_fresh_gbps_per_core"] == pytest.approx(400.0 / fl.box_key()["cores"])
    assert met["floor_s"] > doc["floor_s"] and met["efficiency"] > doc["efficiency"]
    assert met["efficiency"] == pytest.approx(met["floor_s"] / doc["rto_stats"]["median"])
    assert "a core in this run" in doc["floor_note"]


def test_a_distributed_sweep_is_held_to_the_floor_as_its_fastest_levels_ranks_met_it(shards, plant_floor):
    plant_floor(400.0)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m", "ckptbench",
           "sweep", str(shards), "--distributed", "--levels", "1,4", "--repeat", "1", "--cache", "hot", "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    met = doc["floor_as_met"]
    assert met is not None, doc["floor_note"]
    fastest = min(doc["rto_s"], key=lambda lv: doc["rto_s"][lv]["median"])
    assert met["efficiency"] == pytest.approx(met["floor_s"] / doc["rto_s"][fastest]["median"])
    assert met["scale"] == pytest.approx(met["fresh_gbps_per_core"] / met["floor_fresh_gbps_per_core"])
