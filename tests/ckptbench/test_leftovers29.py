"""Leftovers from earlier passes, each found with a real checkpoint and then fixed."""

from __future__ import annotations

import dataclasses
import os
import pickle

import torch

from ckptbench.checkpoint.formats import FormatError, dcp_format
from ckptbench.checkpoint.quote import quote


def test_an_offset_past_any_file_is_named_by_its_length_not_as_an_int(tmp_path, h):
    """A DCP storage entry whose offset is 10**400 was refused as `offset <a int>`: the line did not say what was
    wrong with the number. It now gives its length, as it does for every number too long to print whole."""
    directory, meta = h.dcp_saved(tmp_path / "ck", {"w": torch.randn(4, 4)})
    key = next(iter(meta.storage_data))
    meta.storage_data[key] = dataclasses.replace(meta.storage_data[key], offset=10 ** 400)
    with open(os.path.join(directory, ".metadata"), "wb") as f:
        pickle.dump(meta, f)
    try:
        dcp_format.load_dir(directory)
    except FormatError as exc:
        assert "offset <an int of about 401 digits>" in str(exc), exc
    else:
        raise AssertionError("an offset of 10**400 was taken")
    r = h.run_cli("inspect", directory)
    assert r.rc != 0 and len(r.err_lines) == 1 and "401 digits" in r.err, r.err
    assert quote(-(10 ** 300)) == "<an int of about 301 digits>" and quote(2 ** 255) == repr(2 ** 255)


def test_check_says_the_floors_busy_note_in_text_and_markdown(tmp_path, plant_floor):
    """A floor measured on a busy box says so, and `floor` and `sysinfo` showed it; check's text printed the evidence
    line, which leaves lists to the JSON, so its low ceilings went unexplained there."""
    import json

    from clirun import run_cli
    from floorhelp import edit_cache
    from safetensors.torch import save_file

    ck = tmp_path / "ck"
    ck.mkdir()
    save_file({"w": torch.zeros(256, 256)}, str(ck / "model.safetensors"))
    plant_floor(source=ck, storage_gbps=2.0)
    edit_cache(lambda doc: doc.update(busy="the box was busy (60 % of its cores' time taken by other work as it was "
                                           "measured): these figures may be low; `ckptbench floor SOURCE --remeasure` "
                                           "when it is quiet"))
    said = "note: the box was busy (60 % of its cores' time"
    for extra in ((), ("--markdown",)):
        r = run_cli("check", ck, *extra)
        assert "Traceback" not in r.err, r.err
        assert said in r.out, r.out
        assert f"`ckptbench floor {ck} --remeasure`" in r.out and "SOURCE" not in r.out, r.out
    r = run_cli("check", ck, "--json")
    item = next(i for i in json.loads(r.out)["items"] if "notes" in i["evidence"])
    assert any("the box was busy" in n for n in item["evidence"]["notes"])


def test_a_lower_bound_an_older_watch_recorded_as_its_rate_is_not_compared(tmp_path):
    """Watches recorded before their lower bounds were left out of the row kept "read at least 0.24 GB/s" as the read
    rate; compare held two such bounds of one loader against each other and history showed them as rates. The
    document's count_note says which they are."""
    import csv

    from ckptbench.records.compare import compare
    from ckptbench.records.history import runs
    from ckptbench.system import env as envmod
    from ckptbench.watch import results

    path = str(tmp_path / "results.csv")
    env = envmod.snapshot(str(tmp_path))
    doc = {"bytes": 62 << 20, "io_span_s": 0.27, "files": {"/ck/model.safetensors": 128 << 20}, "loader_gbps": 0.24,
           "peak_rss_bytes": 300 << 20, "cpu_s": 1.8, "exit_code": 0,
           "count_note": "the job maps its files from the page cache faster than the watch samples its mappings"}
    results.record(path, "aaaaaaaaaaaa", doc, env)
    results.record(path, "bbbbbbbbbbbb", doc | {"loader_gbps": 0.19}, env)
    with open(path, newline="") as f:  # as the rows were written then: the bound in read_gbps
        rows = list(csv.DictReader(f))
    for r in rows:
        r["read_gbps"] = "0.24" if r["run_id"] == "aaaaaaaaaaaa" else "0.19"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    c = compare(path, baseline="aaaaaaaaaaaa", newest="bbbbbbbbbbbb")
    assert "read_gbps" not in [f.figure for f in c.figures] and not c.regressed, c.figures
    assert [r["read_gbps"] for r in runs(path)] == [None, None]


def test_a_refused_config_json_is_not_walked_page_by_page(tmp_path, h, ckpt, monkeypatch):
    """A sparse config.json claiming 256 GiB is refused by its bound, and inspect and check still walked its every
    page first (inspect's read-mode choice, check's page-cache probes: 13 s of mincore, minutes at 16 TiB): work
    set by what a crafted file claims. It is refused before any of it, and check probes no page of a checkpoint that
    does not load."""
    import json

    import fastio
    from clirun import run_cli

    from ckptbench.checklist.loads import NOT_PROBED

    ck = h.copy_ckpt(ckpt("safetensors", 1), tmp_path / "ck")
    os.truncate(os.path.join(ck, "config.json"), 256 << 30)
    walked: list[str] = []
    real = fastio.residency

    def residency(paths, *a, **kw):
        walked.extend(os.path.basename(p) for p in paths)
        return real(paths, *a, **kw)

    monkeypatch.setattr(fastio, "residency", residency)
    r = run_cli("inspect", ck)
    assert r.rc == 2 and "config.json" in r.err and "config.json" not in walked, (r.err, walked)
    r = run_cli("check", ck, "--json")
    items = {i["id"]: i for i in json.loads(r.out)["items"]}
    assert r.rc == 1 and items["loads"]["verdict"] == "fail" and "config.json" not in walked, walked
    cold = items["cold_cache"]
    assert cold["verdict"] == "unknown" and cold["evidence"]["reason"] == NOT_PROBED, cold
    assert cold["fix"] == "fix the 'Checkpoint loads' item first"


def test_a_short_storage_length_is_said_once_not_nested(tmp_path, h):
    """A DCP storage entry whose length is half its chunk's: the prescan's line came back wrapped in a second one
    ("not a readable tensor (FormatError: ... not a readable zip archive ...)"), cut mid-word when it was long."""
    directory, meta = h.dcp_saved(tmp_path / "ck", {"w": torch.randn(64, 64), "v": torch.randn(8)})
    key = next(k for k in meta.storage_data if k.fqn == "w")
    meta.storage_data[key] = dataclasses.replace(meta.storage_data[key], length=meta.storage_data[key].length // 2)
    with open(os.path.join(directory, ".metadata"), "wb") as f:
        pickle.dump(meta, f)
    r = h.run_cli("load", directory)
    assert r.rc != 0 and len(r.err_lines) == 1, r.err
    assert "'w'" in r.err and "FormatError" not in r.err and r.err.count("the shard is corrupt") == 1, r.err


def test_a_busy_interval_whose_rss_falls_is_freeing_not_deserializing():
    """After a job said it had loaded, its 2 s of exit (Python freeing the tensors it held) read as "deserializing":
    busy, little I/O. Its RSS falling tells the two apart, and the verdict judges only the load's phases."""
    from ckptbench.system.procstat import ProcSample
    from ckptbench.watch import phases, verdict

    def sample(t: float, cpu_s: float, rss: int) -> ProcSample:
        return ProcSample(t, (1,), 0, 0, threads={1: cpu_s}, rss_bytes=rss)

    freeing = phases.interval_of(sample(1.0, 0.0, 3 << 30), sample(1.25, 0.24, 2 << 30), 0.0)
    loading = phases.interval_of(sample(1.0, 0.0, 2 << 30), sample(1.25, 0.24, 3 << 30), 0.0)
    small = phases.interval_of(sample(1.0, 0.0, 2 << 30), sample(1.25, 0.24, (2 << 30) - (8 << 20)), 0.0)
    assert (freeing.phase, loading.phase, small.phase) == ("freeing", "deserializing", "deserializing")
    assert freeing.freed_bytes == 1 << 30 and loading.freed_bytes == 0
    assert "freeing" in phases.PHASES and "freeing" not in verdict.LOAD_PHASES


def test_inspect_counts_a_weight_two_shards_hold_once_as_the_restore_does(tmp_path, h):
    """Two safetensors shards that both hold h.0.w (the same values, as a re-shard can leave them): load keeps one
    and counts 8.3 K parameters, inspect listed both and said 12,352 (hostile14's leftover)."""
    import json

    from safetensors.torch import save_file

    torch.manual_seed(0)
    w, b, w1 = torch.randn(64, 64), torch.randn(64), torch.randn(64, 64)
    ck = tmp_path / "ck"
    ck.mkdir()
    save_file({"h.0.w": w, "h.0.b": b}, str(ck / "model-00001-of-00002.safetensors"))
    save_file({"h.1.w": w1, "h.0.w": w.clone()}, str(ck / "model-00002-of-00002.safetensors"))
    index = {"metadata": {}, "weight_map": {"h.0.w": "model-00001-of-00002.safetensors",
                                            "h.0.b": "model-00001-of-00002.safetensors",
                                            "h.1.w": "model-00002-of-00002.safetensors"}}
    (ck / "model.safetensors.index.json").write_text(json.dumps(index))
    r = h.run_cli("inspect", ck, "--json")
    assert r.rc == 0, r.err
    doc = json.loads(r.out)
    assert doc["params"] == 2 * 64 * 64 + 64 and [t["name"] for t in doc["tensors"]].count("h.0.w") == 1, doc
    assert any("'h.0.w' held by two files" in n for n in doc["layout"]["notes"]), doc["layout"]["notes"]
    r = h.run_cli("load", ck)
    assert r.rc == 0 and "8.3 K" in r.out, (r.out, r.err)


def test_an_older_watch_of_untimed_bytes_has_no_time_in_history_or_compare(tmp_path):
    """Watches recorded before 0afe3a3 of bytes no window timed (reads inside one sample: window_note) kept 0 s as
    their RTO and read time: history said "median RTO 0.000 s" of them, and compare held that 0 s against a timed
    watch. The document says which they are, as it does for a lower bound."""
    import csv

    from ckptbench.records.compare import compare
    from ckptbench.records.history import runs
    from ckptbench.system import env as envmod
    from ckptbench.watch import results

    path = str(tmp_path / "results.csv")
    env = envmod.snapshot(str(tmp_path))
    doc = {"bytes": 128 << 20, "io_span_s": 0.0, "files": {"/ck/model.safetensors": 128 << 20}, "loader_gbps": None,
           "peak_rss_bytes": 300 << 20, "cpu_s": 1.8, "exit_code": 0,
           "window_note": "the reads fit inside one sample"}
    results.record(path, "aaaaaaaaaaaa", doc, env)
    results.record(path, "bbbbbbbbbbbb", doc | {"io_span_s": 0.5, "loader_gbps": 0.27, "window_note": None}, env)
    with open(path, newline="") as f:  # as the untimed row was written then: 0 s for its RTO and read time
        rows = list(csv.DictReader(f))
    assert rows[0]["rto_s"] == "" and rows[1]["rto_s"] != ""  # as watch records them now
    rows[0]["rto_s"] = rows[0]["read_s"] = "0.0"
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    listed = {r["run_id"]: r for r in runs(path)}
    assert listed["aaaaaaaaaaaa"]["rto_s"] is None and listed["bbbbbbbbbbbb"]["rto_s"] == 0.5
    c = compare(path, baseline="aaaaaaaaaaaa", newest="bbbbbbbbbbbb")
    assert not {"rto_s", "read_s"} & {f.figure for f in c.figures} and not c.regressed, c.figures
