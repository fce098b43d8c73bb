"""The save side of the floor: a real write figure measured in a directory (its files are ours and gone after), kept
beside the restore figures, and a save held against it with the arithmetic checked from its own document."""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict

import pytest
from clirun import run_cli

from ckptbench.core.errors import CkptbenchError
from ckptbench.system import floor as fl
from ckptbench.system import writefloor as wf


def test_a_real_write_figure_leaves_nothing_behind_and_is_cached_beside_the_restore_figures(tmp_path, plant_floor):
    out = tmp_path / "saves"
    out.mkdir()
    (out / "mine.bin").write_bytes(b"user's")
    plant_floor(4.0)  # the restore side's figures, which the write figure must not replace
    c = wf.write_ceiling(str(out), size=8 << 20, levels=(1, 2))
    assert c.gbps > 0 and c.min_gbps <= c.gbps <= c.max_gbps and c.sample_bytes == 8 << 20 and "fsync" in c.method
    assert sorted(os.listdir(out)) == ["mine.bin"] and (out / "mine.bin").read_bytes() == b"user's"

    mount = wf.mount_key_of(str(out))
    doc = json.loads(open(fl.cache_path()).read())
    doc["write"] = {mount: asdict(c)}
    with open(fl.cache_path(), "w") as f:
        json.dump(doc, f)
    assert wf.cached_write(mount).gbps == c.gbps
    plant_floor(4.0)  # the restore side measured again keeps the write figure
    assert wf.cached_write(mount) is not None and fl.cached() is not None
    stale = dict(doc["write"][mount], measured_at=time.time() - 2 * fl.MAX_AGE_S)
    doc = json.loads(open(fl.cache_path()).read())
    doc["write"][mount] = stale
    with open(fl.cache_path(), "w") as f:
        json.dump(doc, f)
    assert wf.cached_write(mount) is None  # a day old: measured again, not used


def test_a_write_figure_refuses_what_is_not_a_directory_in_one_line(tmp_path):
    f = tmp_path / "file"
    f.write_bytes(b"x")
    for bad in (f, tmp_path / "missing"):
        with pytest.raises(CkptbenchError, match="not a directory|no such directory"):
            wf.write_ceiling(str(bad), size=1 << 20)
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_a_save_is_held_against_the_write_floor(tmp_path, plant_floor):
    target = tmp_path / "t"
    target.mkdir()
    r = run_cli("save", "small", target, "--scale", "0.02", "--count", "2", "--json")
    doc = json.loads(r.out)
    assert r.rc == 0 and doc["floor_s"] is None and "--write-to" in doc["floor_note"]  # nothing measured yet
    plant_floor(50.0)  # copying is fast here: the planted write rate binds
    doc_cache = json.loads(open(fl.cache_path()).read())
    write = fl.Ceiling(0.2, 0.2, 0.2, "planted by the test", time.time(), wf.WRITE_SAMPLE)
    doc_cache["write"] = {wf.mount_key_of(str(target)): asdict(write)}
    with open(fl.cache_path(), "w") as f:
        json.dump(doc_cache, f)
    r = run_cli("save", "small", target, "--scale", "0.02", "--count", "2", "--json", "--results", tmp_path / "R.csv")
    doc = json.loads(r.out)
    assert r.rc == 0, r.err
    assert doc["binding"] == "storage write" and doc["floor_s"] == pytest.approx(doc["bytes"] / 0.2e9)
    assert doc["floor_times_s"]["copy"] == pytest.approx(doc["bytes"] / 50e9)
    # over the same saves as the sustained throughput: those after the first (cold files and page cache)
    durable = statistics.median(s["durable_s"] for s in doc["saves"][1:])
    assert doc["efficiency"] == pytest.approx(doc["floor_s"] / durable)
    assert doc["sustained_gbps"] == pytest.approx(doc["bytes"] / durable / 1e9)
    assert "median of the 1 save(s) after the first, as the sustained throughput" in doc["floor_note"]
    recorded = [json.loads(ln) for ln in (tmp_path / "R.csv.jsonl").read_text().splitlines()]
    assert recorded[-1]["record"] == "run" and recorded[-1]["floor_s"] == pytest.approx(doc["floor_s"])
    r = run_cli("save", "small", target, "--scale", "0.02", "--count", "1")
    assert "bound by storage write (0.20 GB/s written and fsync'd)" in r.out and "% of it" in r.out, r.out
    assert "median of the only save" in r.out, r.out


def test_the_floor_command_measures_the_write_figure_where_saves_go(tmp_path):
    out = tmp_path / "saves"
    out.mkdir()
    r = run_cli("floor", "--write-to", out, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["write"]["gbps"] > 0 and doc["write"]["mount"] == wf.mount_key_of(str(out))
    assert os.listdir(out) == []  # its sample files are gone
    assert wf.cached_write(doc["write"]["mount"]) is not None  # a save now finds it
    r = run_cli("floor", "--write-to", tmp_path / "missing")
    assert r.rc != 0 and len(r.err.strip().splitlines()) == 1 and "missing: no such directory" in r.err, r.err


def test_a_file_already_at_a_sample_name_is_not_ours_and_stays(tmp_path):
    theirs = tmp_path / f".ckptbench-floor-write-{os.getpid()}-0"
    theirs.write_bytes(b"someone else's")
    with pytest.raises(CkptbenchError, match="cannot write the floor's sample"):
        wf.write_ceiling(str(tmp_path), size=1 << 20, levels=(1,))
    assert theirs.read_bytes() == b"someone else's" and os.listdir(tmp_path) == [theirs.name]
