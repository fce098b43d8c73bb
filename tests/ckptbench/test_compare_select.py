"""`ckptbench compare` picking what it compares: `--newest RUN`, `--kind KIND`, a watch held against the last watch
of the same command, and the figures in their units (no e-notation), on results written by the real CLI."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import sys

import pytest
from clirun import assert_one_line_error, run_cli, run_proc

from ckptbench.core.units import human_bytes
from ckptbench.records.results import read_rows

SCALE = "0.02"
# two loaders of one checkpoint file: the same folder and settings on record, different command lines
LOADER_WHOLE = "import sys, time; f = open(sys.argv[1], 'rb'); time.sleep(0.2); f.read(); time.sleep(0.1)"
LOADER_CHUNKS = ("import sys, time; f = open(sys.argv[1], 'rb'); time.sleep(0.2)\n"
                 "while f.read(1 << 16): pass\ntime.sleep(0.1)")


def _watch(results: str, loader: str, shard: str) -> None:
    # a fresh interpreter: with --json the job's stdout goes to the watcher's stderr, which must be a real file
    r = run_proc("watch", "--no-verdict", "--json", "--interval", "0.05", "--results", results, "--",
                 sys.executable, "-c", loader, shard)
    assert r.rc == 0, r.err


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> tuple[str, list[str]]:
    """restore A, restore B, then watches of loader one, loader two, loader one: (results path, run ids in order)."""
    ckpt = tmp_path_factory.mktemp("cs-ckpt") / "ckpt"
    r = run_cli("gen", "small", ckpt, "--scale", SCALE, "--format", "safetensors")
    assert r.rc == 0, r.err
    path = str(tmp_path_factory.mktemp("cs") / "R.csv")
    for _ in range(2):
        r = run_cli("run", ckpt, "--repeat", "2", "--json", "--results", path)
        assert r.rc == 0, r.err
    shard = str(next(ckpt.glob("model-*.safetensors")))
    for loader in (LOADER_WHOLE, LOADER_CHUNKS, LOADER_WHOLE):
        _watch(path, loader, shard)
    ids = list(dict.fromkeys(row["run_id"] for row in read_rows(path)))
    assert [next(row["kind"] for row in read_rows(path) if row["run_id"] == i) for i in ids] == \
        ["restore", "restore", "watch", "watch", "watch"]
    return path, ids


def _json(*args) -> dict:
    r = run_cli("compare", *args, "--json")
    assert r.rc in (0, 1), r.err
    return json.loads(r.out)


def test_newest_names_the_run_compared_and_its_baseline_follows(recorded):
    path, (a, b, *_) = recorded
    doc = _json(path, "--newest", b)
    assert (doc["kind"], doc["newest"], doc["baseline"]) == ("restore", b, a)


def test_kind_takes_the_newest_run_of_that_kind(recorded):
    path, (a, b, *_, w3) = recorded
    assert _json(path)["newest"] == w3  # the file's newest is a watch
    doc = _json(path, "--kind", "restore")
    assert (doc["kind"], doc["newest"], doc["baseline"]) == ("restore", b, a)


def test_a_watch_is_held_against_the_last_watch_of_the_same_command(recorded):
    path, (_, _, w1, w2, w3) = recorded
    doc = _json(path, "--kind", "watch")
    assert (doc["newest"], doc["baseline"]) == (w3, w1)  # not w2, the other loader watched just before it
    assert "command" not in doc["env_diff"]


def test_a_watch_of_a_command_not_watched_before_is_one_line(recorded):
    path, (_, _, _, w2, _) = recorded
    assert_one_line_error(run_cli("compare", path, "--newest", w2), "same command")


def test_a_baseline_named_of_another_command_says_the_commands_differ(recorded):
    path, (_, _, _, w2, w3) = recorded
    doc = _json(path, "--baseline", w2)
    assert doc["baseline"] == w2
    old, new = doc["env_diff"]["command"]
    assert "while f.read(1 << 16)" in old and "while" not in new


def test_a_watch_whose_document_is_gone_is_one_line_naming_the_documents(recorded, tmp_path):
    path, _ = recorded
    rows_only = tmp_path / "R.csv"
    shutil.copy(path, rows_only)  # the rows without results.csv.jsonl: no command on record
    assert_one_line_error(run_cli("compare", rows_only), "R.csv.jsonl")


def test_the_first_run_of_its_kind_named_as_newest_is_one_line(recorded):
    path, (a, *_) = recorded
    assert_one_line_error(run_cli("compare", path, "--newest", a), "no earlier restore run")


def test_an_unknown_run_or_a_kind_without_runs_is_one_line(recorded):
    path, _ = recorded
    assert_one_line_error(run_cli("compare", path, "--newest", "nosuchrun"), "nosuchrun")
    r = run_cli("compare", path, "--kind", "dist")
    assert_one_line_error(r, "--kind")
    assert "no successful dist run" in r.err and "restore, watch" in r.err
    assert_one_line_error(run_cli("compare", path, "--kind", "nosuchkind"), "nosuchkind")


def test_newest_and_kind_exclude_each_other(recorded):
    path, (_, b, *_) = recorded
    assert_one_line_error(run_cli("compare", path, "--newest", b, "--kind", "restore"), "--kind")


def test_the_text_shows_each_figure_in_its_unit_and_the_json_the_raw_number(recorded):
    path, (a, b, *_) = recorded
    r = run_cli("compare", path, "--kind", "restore")
    assert r.rc in (0, 1), r.err
    assert not re.search(r"\de[+-]\d", r.out), r.out  # 4 significant digits printed 3.512e+08 (run ids are hex)
    lines = {line.split()[0]: line for line in r.out.splitlines() if line.startswith("  ") and line.split()}
    rss = [row["peak_rss_bytes"] for row in read_rows(path) if row["run_id"] == b]
    assert human_bytes(statistics.median(rss)) in lines["peak_rss_bytes"]
    assert re.search(r"\d\.\d{3} s\s", lines["rto_s"]) and "GB/s" in lines["read_gbps"]
    doc = _json(path, "--kind", "restore")
    fig = next(f for f in doc["figures"] if f["figure"] == "peak_rss_bytes")
    assert fig["newest"]["median"] == statistics.median(rss)  # the JSON keeps bytes as a number
