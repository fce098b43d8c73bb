"""results.csv: one row per repeat, append-only, the documented header, env as JSON; foreign or damaged files are
refused before any work and left byte-identical. Rows are read back with the csv module, not ckptbench."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil

import pytest
from clirun import Run, assert_one_line_error, run_cli

SCALE = "0.02"

# the documented schema-3 header, written out by hand (schema 1 lacked kind and the save columns, schema 2 verified
# and aggregate_gbps)
DOCUMENTED_COLUMNS = [
    "schema", "kind", "run_id", "repeat", "timestamp", "source", "format", "mode", "status", "cache", "cache_verified",
    "residency_before", "residency_after", "concurrency", "read", "hash", "block_size", "device",
    "list_s", "read_s", "verify_s", "load_s", "device_s", "check_s",
    "rto_s", "bytes", "files", "files_restored", "read_gbps", "success_rate", "retries", "errors",
    "peak_rss_bytes", "cpu_s",
    "target", "ranks", "stagger_s", "interval_s", "blocking_s", "written_s", "durable_s", "write_gbps",
    "overran", "dirty_peak_fraction", "throttled", "write_amplification", "verified", "aggregate_gbps", "env",
]
V2_COLUMNS = [c for c in DOCUMENTED_COLUMNS if c not in ("verified", "aggregate_gbps")]


Result = Run
cli = run_cli


def csv_rows(path) -> tuple[list[str], list[dict]]:
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        return header, [dict(zip(header, values)) for values in reader]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> str:
    target = tmp_path_factory.mktemp("results-ckpt") / "ckpt"
    r = cli("gen", "small", target, "--scale", SCALE, "--format", "safetensors", "--ranks", "1")
    assert r.rc == 0, r.err
    return str(target)


@pytest.fixture(scope="module")
def two_runs(ckpt, tmp_path_factory):
    """A results file after a 2-repeat run (bytes kept), then after a further 1-repeat run."""
    path = tmp_path_factory.mktemp("results") / "R.csv"
    first = cli("run", ckpt, "--repeat", "2", "--json", "--results", path)
    assert first.rc == 0, first.err
    after_first = path.read_bytes()
    jsonl_after_first = open(str(path) + ".jsonl", "rb").read()
    second = cli("run", ckpt, "--repeat", "1", "--json", "--results", path)
    assert second.rc == 0, second.err
    return {"path": path, "first": json.loads(first.out), "second": json.loads(second.out),
            "after_first": after_first, "jsonl_after_first": jsonl_after_first}


def test_header_is_the_documented_columns(two_runs):
    from ckptbench.records.results import COLUMNS

    header, _ = csv_rows(two_runs["path"])
    assert header == DOCUMENTED_COLUMNS
    assert list(COLUMNS) == DOCUMENTED_COLUMNS
    assert two_runs["path"].read_text().count("schema,kind,run_id,") == 1  # the header is written once


def test_one_row_per_repeat_in_order(two_runs):
    _, rows = csv_rows(two_runs["path"])
    first, second = two_runs["first"], two_runs["second"]
    assert len(rows) == 3
    assert [(r["run_id"], r["repeat"]) for r in rows] == [
        (first["run_id"], "1"), (first["run_id"], "2"), (second["run_id"], "1")]
    assert first["run_id"] != second["run_id"]
    assert all(r["schema"] == "3" and r["kind"] == "restore" and r["status"] == "ok" for r in rows)


def test_rows_carry_each_repeats_own_figures(two_runs):
    _, rows = csv_rows(two_runs["path"])
    doc = two_runs["first"]
    for row, rep in zip(rows[:2], doc["repeats"]):
        assert float(row["rto_s"]) == rep["rto_s"]
        assert float(row["read_gbps"]) == rep["read_gbps"]
        for stage, seconds in rep["stages"].items():
            assert float(row[f"{stage}_s"]) == seconds
        assert int(row["bytes"]) == doc["bytes"] and int(row["files"]) == doc["files"]
        assert row["mode"] == "fused" and row["format"] == "safetensors" and row["cache"] == "as-is"
        assert int(row["peak_rss_bytes"]) == rep["peak_rss_bytes"]


def test_second_run_appends_and_never_rewrites(two_runs):
    after = two_runs["path"].read_bytes()
    assert len(after) > len(two_runs["after_first"])
    assert after.startswith(two_runs["after_first"])
    jsonl = open(str(two_runs["path"]) + ".jsonl", "rb").read()
    assert jsonl.startswith(two_runs["jsonl_after_first"])
    docs = [json.loads(line) for line in jsonl.decode().splitlines()]
    runs = [d for d in docs if d["record"] == "run"]
    assert [d["run_id"] for d in runs] == [two_runs["first"]["run_id"], two_runs["second"]["run_id"]]


def test_jsonl_has_a_repeat_record_per_row_then_the_run_record(two_runs):
    _, rows = csv_rows(two_runs["path"])
    with open(str(two_runs["path"]) + ".jsonl") as f:
        docs = [json.loads(line) for line in f]
    first, second = two_runs["first"]["run_id"], two_runs["second"]["run_id"]
    assert [(d["record"], d["run_id"], d.get("repeat")) for d in docs] == [
        ("started", first, None), ("repeat", first, 1), ("repeat", first, 2), ("run", first, None),
        ("started", second, None), ("repeat", second, 1), ("run", second, None)]
    repeats = [d for d in docs if d["record"] == "repeat"]
    for row, doc in zip(rows, repeats):
        assert (row["run_id"], int(row["repeat"])) == (doc["run_id"], doc["repeat"])
        assert float(row["rto_s"]) == doc["rto_s"] and int(row["bytes"]) == doc["bytes"]
        assert json.loads(row["env"]) == doc["env"] and row["source"] == doc["source"]
    assert docs[3] == dict(two_runs["first"])  # the run record is the document --json printed


def test_env_column_is_json_of_the_machine(two_runs):
    import torch

    _, rows = csv_rows(two_runs["path"])
    for row in rows:
        env = json.loads(row["env"])
        assert env["kernel"] == os.uname().release
        assert env["cpu_count"] == os.cpu_count()
        assert env["torch"] == torch.__version__
    assert json.loads(rows[0]["env"]) == two_runs["first"]["env"]


def test_read_rows_gives_numbers_and_env_back(two_runs):
    from ckptbench.records.results import read_rows

    rows = read_rows(str(two_runs["path"]))
    assert len(rows) == 3
    assert rows[0]["rto_s"] == two_runs["first"]["repeats"][0]["rto_s"]
    assert rows[2]["env"]["kernel"] == os.uname().release
    assert rows[1]["repeat"] == 2


# --- foreign or damaged results files: refused before any work, left as they were ---

def _damaged(kind: str, good: bytes) -> bytes:
    text = good.decode()
    header, first, *_ = text.splitlines(keepends=True)
    if kind == "foreign-header":
        return b"name,value\nalpha,1\n"
    if kind == "short-row":
        return (header + first + "1,abc,1\n").encode()
    if kind == "bad-number":
        fields = next(csv.reader([first]))
        fields[DOCUMENTED_COLUMNS.index("rto_s")] = "fast"
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow(fields)
        return (header + buf.getvalue()).encode()
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["foreign-header", "short-row", "bad-number"])
def test_run_refuses_a_foreign_or_malformed_results_file_before_any_work(ckpt, two_runs, tmp_path, monkeypatch,
                                                                       kind):
    import fastio

    path = tmp_path / "R.csv"
    content = _damaged(kind, two_runs["after_first"])
    path.write_bytes(content)
    started = []
    monkeypatch.setattr(fastio, "start", lambda *a, **k: started.append(1))
    monkeypatch.setattr(fastio, "read_files", lambda *a, **k: started.append(1))
    r = cli("run", ckpt, "--repeat", "1", "--results", path)
    assert_one_line_error(r, str(path))
    assert started == [], "the checkpoint was read before the results file was refused"
    assert path.read_bytes() == content
    assert not os.path.exists(str(path) + ".jsonl")


@pytest.mark.parametrize("kind", ["foreign-header", "short-row", "bad-number"])
def test_compare_refuses_a_malformed_results_file(two_runs, tmp_path, kind):
    path = tmp_path / "R.csv"
    content = _damaged(kind, two_runs["after_first"])
    path.write_bytes(content)
    r = cli("compare", path)
    assert_one_line_error(r, str(path))
    assert path.read_bytes() == content


def test_unwritable_results_location_exits_2_before_running(ckpt, tmp_path):
    path = tmp_path / "no" / "such" / "dir" / "R.csv"
    r = cli("run", ckpt, "--repeat", "1", "--results", path)
    assert_one_line_error(r, "--results")
    assert not (tmp_path / "no").exists()


def test_append_creates_the_header_then_only_appends(two_runs, tmp_path):
    from ckptbench.records import results

    _, rows = csv_rows(two_runs["path"])
    row = dict(rows[0], env=json.loads(rows[0]["env"]), run_id="handmade")
    path = tmp_path / "new.csv"
    results.append(str(path), [row])
    before = path.read_bytes()
    results.append(str(path), [dict(row, repeat=2)])
    after = path.read_bytes()
    assert after.startswith(before) and len(after) > len(before)
    header, back = csv_rows(path)
    assert header == DOCUMENTED_COLUMNS
    assert [(r["run_id"], r["repeat"]) for r in back] == [("handmade", "1"), ("handmade", "2")]
    assert [json.loads(r["env"]) for r in back] == [row["env"]] * 2
    assert [p for p in os.listdir(tmp_path) if ".tmp" in p] == []


# --- a failed run's row must not poison the file ---

@pytest.fixture(scope="module")
def after_failed_run(ckpt, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("failed")
    src = shutil.copytree(ckpt, tmp / "bad")
    shard = max((os.path.join(src, n) for n in os.listdir(src) if n.endswith(".safetensors")), key=os.path.getsize)
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) // 2)
        f.write(b"\x00\xff" * 8)
    path = tmp / "R.csv"
    r = cli("run", src, "--repeat", "1", "--json", "--results", path)
    assert r.rc == 1, r.err
    return path, json.loads(r.out)


def test_failed_run_is_recorded_with_status_failed(after_failed_run):
    path, doc = after_failed_run
    header, rows = csv_rows(path)
    assert header == DOCUMENTED_COLUMNS
    assert len(rows) == 1
    assert rows[0]["status"] == "failed" and rows[0]["run_id"] == doc["run_id"]
    assert rows[0]["errors"] == "digest_mismatch=1"
    assert float(rows[0]["success_rate"]) < 1.0


def test_file_with_a_failed_run_stays_readable(after_failed_run):
    from ckptbench.records.results import read_rows

    path, doc = after_failed_run
    rows = read_rows(str(path))  # fails: the errors column "digest_mismatch=1" is parsed as a number
    assert [r["status"] for r in rows] == ["failed"]
    assert rows[0]["errors"] == "digest_mismatch=1"


def test_run_appends_after_a_failed_run(ckpt, after_failed_run):
    path, _ = after_failed_run
    before = path.read_bytes()
    r = cli("run", ckpt, "--repeat", "1", "--results", path)
    assert r.rc == 0, r.err
    assert path.read_bytes().startswith(before)
    _, rows = csv_rows(path)
    assert [row["status"] for row in rows] == ["failed", "ok"]


def test_schema_1_file_stays_readable_and_takes_restores_in_its_own_schema(ckpt, tmp_path):
    from ckptbench.records.results import read_rows

    v1 = [c for c in V2_COLUMNS if c != "kind" and c not in (
        "target", "ranks", "stagger_s", "interval_s", "blocking_s", "written_s", "durable_s", "write_gbps",
        "overran", "dirty_peak_fraction", "throttled", "write_amplification")]
    path = tmp_path / "old.csv"
    old_row = {c: "" for c in v1} | {"schema": "1", "run_id": "old", "repeat": "1", "status": "ok", "rto_s": "1.5",
                                     "env": "{}"}
    with open(path, "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(v1)
        w.writerow([old_row[c] for c in v1])
    r = cli("run", ckpt, "--repeat", "1", "--json", "--results", path)
    assert r.rc == 0, r.err
    header, rows = csv_rows(path)
    assert header == v1 and [x["schema"] for x in rows] == ["1", "1"]  # the old file keeps its schema
    back = read_rows(str(path))
    assert [x["kind"] for x in back] == ["restore", "restore"] and back[0]["rto_s"] == 1.5
    assert back[1]["run_id"] == json.loads(r.out)["run_id"]


def test_no_credential_reaches_a_results_file_whatever_kind_writes_it(tmp_path):
    """One writer for rows and one for documents, both redacted: a source URL with user-info, a secret in a note."""
    from ckptbench.records import results

    path = str(tmp_path / "r.csv")
    secret = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    row = {"run_id": "r1", "repeat": 1, "source": f"s3://AKIAIOSFODNN7EXAMPLE:{secret}@host/b/p", "status": "ok",
           "env": {"endpoint": f"https://user:{secret}@s3.local"}}
    results.append(path, [row])
    results.append_document(path, {"record": "run", "source": row["source"],
                                   "notes": {"load": f"--password={secret}"}})
    for name in (path, path + ".jsonl"):
        text = open(name).read()
        assert secret not in text and "AKIAIOSFODNN7EXAMPLE" not in text, text


def test_a_run_in_text_says_where_it_went_on_record_and_its_id_and_nothing_with_no_results(ckpt, tmp_path):
    """A results file nobody was told of turned up later in the working directory, and a run id never printed
    could not be named to `compare --baseline`."""
    path = tmp_path / "mine.csv"
    r = cli("run", ckpt, "--repeat", "1", "--results", path)
    assert r.rc == 0, r.err
    _, rows = csv_rows(path)
    said = r.out.splitlines()[-1]
    assert said.startswith(f"recorded: run {rows[-1]['run_id']} in {path} (its document in {path}.jsonl)"), said
    assert f"`ckptbench compare {path}`" in said
    bare = cli("run", ckpt, "--repeat", "1", "--results", "")
    assert bare.rc == 0 and "recorded:" not in bare.out, bare.out
