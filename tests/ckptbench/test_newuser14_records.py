"""New-user pass 14, runs on record: `compare` says settings in their units and a run's efficiency as its document
does; `history` lists the runs headless; `watch --json` prints the document it records; `run` says the page cache
before in words."""

from __future__ import annotations

import json
import statistics
import sys

import pytest
from clirun import assert_one_line_error, run_cli, run_proc

from ckptbench.records.results import jsonl_path, read_documents, read_rows


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[str, list[str]]:
    """Two restores of one checkpoint, two repeats each: the default settings, then -c 2 --hash crc32c; their run
    documents given a floor and the efficiency a run says (floor over its median RTO less the model step)."""
    ckpt = tmp_path_factory.mktemp("nu14r") / "ckpt"
    assert run_cli("gen", "small", ckpt, "--scale", "0.02").rc == 0
    path = str(tmp_path_factory.mktemp("nu14r") / "R.csv")
    for extra in ((), ("-c", "2", "--hash", "crc32c")):
        r = run_cli("run", ckpt, "--repeat", "2", "--cache", "cold", "--results", path, "--json", *extra)
        assert r.rc == 0, r.err
    rows = read_rows(path)
    ids = list(dict.fromkeys(r["run_id"] for r in rows))
    lines = open(jsonl_path(path)).read().splitlines()
    with open(jsonl_path(path), "w") as f:
        for line in lines:
            doc = json.loads(line)
            if doc.get("record") == "run":
                floor = 0.01 if doc["run_id"] == ids[0] else 0.02
                # as `run` holds it: each RTO less its model step (restore/efficiency.of_repeats)
                step = doc.get("check") == "model step"
                held = statistics.median(r["rto_s"] - (r["check_s"] if step else 0.0)
                                         for r in rows if r["run_id"] == doc["run_id"])
                doc |= {"floor_s": floor, "efficiency": floor / held}
            f.write(json.dumps(doc) + "\n")
    return path, ids


def test_compare_says_the_runs_efficiency_not_the_median_of_its_repeats(two_runs):
    path, (a, b) = two_runs
    r = run_cli("compare", path, "--json")
    assert r.rc in (0, 1), r.err
    eff = next(f for f in json.loads(r.out)["figures"] if f["figure"] == "efficiency")
    docs = {d["run_id"]: d for d in read_documents(path, "run")}
    for side, run in (("baseline", a), ("newest", b)):
        rtos = [row["rto_s"] for row in read_rows(path) if row["run_id"] == run]
        per_repeat = statistics.median(docs[run]["floor_s"] / t for t in rtos)
        assert eff[side]["median"] == pytest.approx(docs[run]["efficiency"], rel=1e-9)
        assert eff[side]["median"] != pytest.approx(per_repeat, rel=1e-9)  # two repeats: the two differ
        assert eff[side]["min"] <= eff[side]["median"] <= eff[side]["max"]


def test_compare_says_differing_settings_in_their_units(two_runs):
    path, _ = two_runs
    r = run_cli("compare", path)
    assert r.rc in (0, 1), r.err
    assert "  concurrency: 8 → 2\n" in r.out
    assert "  hash: the manifest's (no --hash) → crc32c\n" in r.out
    assert "this box's floor for the restore: 0.010 s → 0.020 s" in r.out
    assert "floor_s:" not in r.out
    doc = json.loads(run_cli("compare", path, "--json").out)
    assert doc["env_diff"]["concurrency"] == [8, 2] and isinstance(doc["env_diff"]["concurrency"][0], int)


def test_compares_list_of_ids_points_at_history():
    from ckptbench.records.compare import _known

    said = _known("/my runs/r.csv", [f"run{i}" for i in range(15)])
    assert "(and 3 earlier: `ckptbench history '/my runs/r.csv'` lists them all)" in said


def test_history_lists_every_run_one_line_each_oldest_first(two_runs):
    path, (a, b) = two_runs
    r = run_cli("history", path)
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert len(lines) == 2 and lines[0].startswith(a) and lines[1].startswith(b)
    for line in lines:
        assert " restore " in line and "fused/cold" in line and "2 repeats" in line and "median RTO " in line
        assert "efficiency " in line and line.endswith("ok")
    doc = json.loads(run_cli("history", path, "--json").out)
    assert [x["run_id"] for x in doc["runs"]] == [a, b]
    assert doc["runs"][0]["kind"] == "restore" and doc["runs"][0]["efficiency"] == pytest.approx(
        next(d for d in read_documents(path, "run") if d["run_id"] == a)["efficiency"])


def test_history_of_a_missing_file_is_one_line(tmp_path):
    assert_one_line_error(run_cli("history", tmp_path / "none.csv"), "no such results file")
    assert_one_line_error(run_cli("history", tmp_path), "a directory")


@pytest.mark.parametrize("cache, before, repeats, said", [
    ("cold", 0.0, 2, "none of it (cold: evicted first, verified)"),
    ("hot", 1.0, 2, "all of it (hot: read in first, verified)"),
    ("as-is", 0.51, 3, "at most 51 % of it (as-is: as found)"),
    ("hot", 0.97, 3, "at least 97 % of it (hot: read in first, verified)"),
    ("cold", 0.0004, 1, "0.04 % of it (cold: evicted first, verified)"),
])
def test_runs_page_cache_line_is_words(cache, before, repeats, said):
    from ckptbench.cli.run import cache_line

    line = cache_line({"requested": cache, "residency_before": before, "verified": True, "notes": []}, repeats)
    assert line == f"page cache before the restore: {said}"
    assert "≤" not in line and "≥" not in line


def test_watch_json_is_the_document_it_records(tmp_path):
    shard = tmp_path / "shard.bin"
    shard.write_bytes(b"\1" * (4 << 20))
    results = str(tmp_path / "W.csv")
    job = ("import sys, time; f = open(sys.argv[1], 'rb'); time.sleep(0.2)\n"
           "while f.read(1 << 20): time.sleep(0.05)\ntime.sleep(0.1)")  # slow enough to be seen reading
    r = run_proc("watch", "--json", "--interval", "0.05", "--results", results, "--", sys.executable, "-c", job,
                 shard)
    assert r.rc == 0, r.err
    printed = json.loads(r.out)
    recorded = read_documents(results, "run")[-1]
    for key in ("run_id", "kind", "record", "schema", "status"):
        assert printed[key] == recorded[key], key
    assert (printed["kind"], printed["record"]) == ("watch", "run") and printed["run_id"]
    assert printed["files"] == {str(shard): 4 << 20}
    assert "reading the checkpoint's files cold for the verdict" in r.err
