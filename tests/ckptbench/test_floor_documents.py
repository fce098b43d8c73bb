"""Every document kind is held against the box's floor, from the figures cached (planted here with fixed rates, so
the arithmetic is the test's own): a read and a sweep into reused buffers, a dashboard session's restore, and every
kind's run document at least says why it has none."""

from __future__ import annotations

import json
import os
import re

import pytest

from ckptbench.system import floor as fl
from floorhelp import held_s


def _assert_floor(doc: dict, measured_s: float) -> None:
    assert set(fl.FIELDS) <= set(doc), sorted(set(fl.FIELDS) - set(doc))
    parts = doc["floor_times_s"]
    assert doc["binding"] in parts and parts[doc["binding"]] == max(parts.values())
    if "the parts add up" in doc["floor_note"]:  # from the page cache every part is the cores' work
        assert doc["floor_s"] == pytest.approx(sum(parts.values()))
    else:
        assert doc["floor_s"] == max(parts.values())
    assert doc["efficiency"] == pytest.approx(doc["floor_s"] / measured_s)
    assert doc["floor_gbps"] == pytest.approx(doc["bytes"] / doc["floor_s"] / 1e9)


def test_a_read_is_held_against_storage_cold_and_the_page_cache_hot_with_no_fresh_memory(tmp_path, h, ckpt,
                                                                                         plant_floor):
    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    r = h.run_cli("read", root, "--json", "--cache", "hot")
    doc = json.loads(r.out)
    assert r.rc == 0 and doc["floor_s"] is None and "ckptbench floor" in doc["floor_note"]  # nothing cached yet
    plant_floor(8.0, root, storage_gbps=0.5)  # the device binds cold, the page cache's copy hot
    for cache, binding in (("cold", "storage"), ("hot", "page cache")):
        r = h.run_cli("read", root, "--json", "--cache", cache)
        doc = json.loads(r.out)
        assert r.rc == 0, r.err
        _assert_floor(doc, doc["seconds"])
        assert doc["binding"] == binding and "fresh memory" not in doc["floor_times_s"], doc  # reused buffers
        assert "reused buffers" in doc["floor_note"]
    r = h.run_cli("read", root, "--cache", "hot")
    assert "  floor " in r.out and "bound by page cache" in r.out and "% of it" in r.out, r.out


def test_a_sweep_gives_each_level_its_efficiency(tmp_path, h, ckpt, plant_floor):
    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    plant_floor(40.0, root, storage_gbps=0.5)  # above any hot read here (8 GB/s was beaten on a fast CI box)
    r = h.run_cli("sweep", root, "--levels", "1,2", "--repeat", "1", "--cache", "hot", "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["binding"] == "page cache" and doc["floor_gbps"] > 0
    assert set(doc["efficiency_by_level"]) == {"1", "2"}
    for level, eff in doc["efficiency_by_level"].items():
        assert eff == pytest.approx(doc["gbps"][level]["median"] / doc["floor_gbps"])
    assert doc["efficiency"] == pytest.approx(max(doc["efficiency_by_level"].values()))
    r = h.run_cli("sweep", root, "--levels", "1,2", "--repeat", "1", "--cache", "hot")
    assert "of floor" in r.out and "bound by page cache" in r.out, r.out
    rows = [ln for ln in r.out.splitlines() if ln.split()[:1] in (["1"], ["2"])]
    # of best, of floor: percents as `run` writes them ("82 %"), not "82%"
    assert len(rows) == 2 and all(re.search(r"\d %\s+\d+(\.\d)? %", ln) for ln in rows), r.out
    assert "faster than the floor" not in r.out  # at 40 GB/s planted, the page cache's copy binds
    plant_floor(0.001, root, storage_gbps=0.001)  # a ceiling read far too low: every level runs past the floor
    r = h.run_cli("sweep", root, "--levels", "1,2", "--repeat", "1", "--cache", "hot")
    assert r.rc == 0 and "faster than the floor (" in r.out and "--remeasure" in r.out, r.out


def test_a_dashboard_session_records_its_restore_against_the_floor(tmp_path, h, ckpt, plant_floor):
    from ckptbench.restore.runner import RunOptions
    from ckptbench.restore.session import RestoreSession

    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    plant_floor(2.0)
    results = tmp_path / "R.csv"
    doc = RestoreSession(str(root), RunOptions(cache="hot"), results_path=str(results)).run()
    _assert_floor(doc, held_s(doc))  # the RTO less the model's step, which no ceiling measures
    assert doc["binding"] in ("page cache", "fresh memory")  # a restore lands its bytes in fresh memory
    assert "fresh memory" in doc["floor_times_s"]
    recorded = [json.loads(ln) for ln in (tmp_path / "R.csv.jsonl").read_text().splitlines()]
    assert recorded[-1]["record"] == "run" and recorded[-1]["floor_s"] == doc["floor_s"]


@pytest.mark.parametrize("kind", ["restore", "save", "watch", "dist"])
def test_every_kind_of_run_document_carries_the_floor_fields_or_says_why_not(kind):
    from ckptbench.records.schema import document

    doc = document("run", kind, "r1", "/ck", {}, {"date": "2026-12-01"}, status="ok", verified=None,
                   success_rate=1.0)
    assert set(fl.FIELDS) <= set(doc) and doc["floor_s"] is None and doc["floor_note"]
    if kind == "save":
        assert "--write-to" in doc["floor_note"]  # what would measure it
    kept = document("run", kind, "r1", "/ck", {"floor_s": 1.5, "floor_note": "measured"}, {"date": "x"},
                    status="ok", verified=None, success_rate=1.0)
    assert kept["floor_s"] == 1.5 and kept["floor_note"] == "measured"  # a kind's own figures are not replaced


def test_the_storage_figure_reads_no_more_than_its_sample_of_a_large_file(tmp_path, monkeypatch):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(1 << 20) * 40)
    from ckptbench.system import sourcefigures

    monkeypatch.setattr(sourcefigures, "STORAGE_SAMPLE", 24 << 20)  # the 1 GiB sample, scaled down with the file
    c, _ = fl.storage_ceiling([(str(big), 40 << 20)], levels=(1,))
    assert c.sample_bytes == 24 << 20 and "(24.0 MiB)" in c.method
    # named by its directory: the cache keeps one figure per mount, shown for every checkpoint floored on it
    assert f"of {tmp_path} (24.0 MiB)" in c.method


def test_compare_holds_each_repeat_against_its_runs_floor_and_says_when_the_floor_moved(tmp_path, h, ckpt,
                                                                                         plant_floor):
    root = h.copy_ckpt(ckpt("safetensors", 2), tmp_path / "ck")
    results = tmp_path / "R.csv"
    plant_floor(4.0)
    for _ in range(2):
        r = h.run_cli("run", root, "--repeat", "2", "--cache", "hot", "--results", results, "--json")
        assert r.rc == 0, r.err
    r = h.run_cli("compare", results, "--json")
    doc = json.loads(r.out)
    eff = next(f for f in doc["figures"] if f["figure"] == "efficiency")
    runs = [d for d in (json.loads(ln) for ln in open(f"{results}.jsonl")) if d["record"] == "run"]
    rows = [d for d in (json.loads(ln) for ln in open(f"{results}.jsonl")) if d["record"] == "repeat"]
    assert eff["newest"]["median"] == pytest.approx(runs[-1]["efficiency"])  # the run's own: floor ÷ its time
    assert "floor_s" not in doc["env_diff"]  # the same box, the same floor
    text = h.run_cli("compare", results).out
    line = next(ln for ln in text.splitlines() if ln.split()[:1] == ["efficiency"])
    # a share as `run` prints it, not the document's fraction (0.82), and its change in percentage points
    assert re.match(r"\s*efficiency\s+\d+(\.\d)? %\s+\d+(\.\d)? %\s+[+-]\d+(\.\d)? pts", line), text
    assert f"{eff['baseline']['median']:.4g}" not in line, line
    plant_floor(1.0)  # the box now does a quarter of what it did: the floor moved, and compare says so
    assert h.run_cli("run", root, "--repeat", "2", "--cache", "hot", "--results", results).rc == 0
    doc = json.loads(h.run_cli("compare", results, "--json").out)
    assert "floor_s" in doc["env_diff"], doc["env_diff"]


def test_plan_at_scale_caps_each_node_at_this_boxs_fresh_memory(tmp_path, h, plant_floor):
    args = ("plan", "7b", "--nodes", "4", "--storage", "local-nvme", "--results", tmp_path / "none.csv", "--json")
    before = json.loads(h.run_cli(*args).out)
    assert before["ceilings"]["fresh_memory"] is None and before["ceilings"]["per_node_capped_by"] != "fresh memory"
    slow = before["ceilings"]["per_node_gbps"] / 4  # a node populates memory at a quarter of what it reads
    plant_floor(slow)
    doc = json.loads(h.run_cli(*args).out)
    assert doc["ceilings"]["per_node_capped_by"] == "fresh memory"
    assert doc["ceilings"]["per_node_gbps"] == pytest.approx(slow)
    assert doc["rto_floor_s"] > before["rto_floor_s"]
    text = h.run_cli(*args[:-1]).out
    assert "this box's fresh memory, measured" in text, text


def test_plan_says_whose_fresh_memory_caps_the_nodes_and_takes_theirs(tmp_path, h, plant_floor):
    """A new user's busy 2-core VM capped every node of a 32-node plan at its own 2.58 GB/s, unsaid: the line says
    the figure stands in for each node's, and --node-memory gives the nodes' own."""
    args = ("plan", "7b", "--nodes", "4", "--storage", "local-nvme", "--results", tmp_path / "none.csv")
    plant_floor(0.5)
    text = h.run_cli(*args).out
    assert "it stands in for each node's; plan on a training node, or give theirs with --node-memory GB/S" in text
    theirs = json.loads(h.run_cli(*args, "--node-memory", "1000", "--json").out)
    assert theirs["ceilings"]["per_node_capped_by"] != "fresh memory"
    assert theirs["ceilings"]["fresh_memory"]["given"] is True
    low = json.loads(h.run_cli(*args, "--node-memory", "0.25", "--json").out)
    assert low["ceilings"]["per_node_capped_by"] == "fresh memory" and low["ceilings"]["per_node_gbps"] == 0.25
    assert "given with --node-memory" in h.run_cli(*args, "--node-memory", "0.25").out
    r = h.run_cli("plan", "7b", "--node-memory", "3")
    assert r.rc == 2 and "add --nodes N" in r.err


def test_a_failed_restore_found_in_the_page_cache_is_shown_the_hot_floor(tmp_path, h, plant_floor):
    """A run that fails its check has no time to hold, but its floor is still of what it found: an as-is run read
    wholly from the page cache was shown the cold (storage) floor, where the same run passing was shown the hot."""
    import torch
    from safetensors.torch import save_file

    root = tmp_path / "nan"
    root.mkdir()
    w = torch.randn(512, 512)
    w[3, 4] = float("nan")
    save_file({"w": w}, str(root / "model.safetensors"))
    plant_floor(8.0, root, storage_gbps=0.5)  # storage would bind a cold floor, the page cache's copy a hot one
    (root / "model.safetensors").read_bytes()  # now in the page cache
    r = h.run_cli("run", root, "--repeat", "1", "--cache", "as-is", "--json", "--results", tmp_path / "r.csv")
    doc = json.loads(r.out)
    assert r.rc == 1 and doc["status"] == "failed", r.err
    assert doc["repeats"][0]["cache"]["residency_before"] >= 0.9
    assert doc["efficiency"] is None and "storage" not in doc["floor_times_s"], doc["floor_times_s"]
    assert "page cache" in doc["floor_times_s"] and doc["floor_note"].startswith("the read was from the page cache")
