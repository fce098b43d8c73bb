"""`save` puts each save on record as it ends (its document, then its row), and the run document when the series ends:
a series stopped by Ctrl-C or SIGTERM after its second of four saves has both on record and a run document marked
interrupted; an interrupt that comes while a record is being written waits for it (no document without its row, no
run without its document); a series killed outright (SIGKILL) keeps the saves it finished, readable by history,
compare and plan; and a series that ends records what it did before (the same columns, the same figures)."""

from __future__ import annotations

import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import time

import pytest
from clirun import run_cli

from ckptbench.records.results import COLUMNS, header_of, read_documents, read_rows

SCALE = "0.02"


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default --results is ./results.csv: never the repository's


def _save(target, results, count=4, *extra):
    return run_cli("save", "small", target, "--scale", SCALE, "--count", str(count), "--keep", "1",
                   "--results", results, *extra)


def _after_prune(monkeypatch, nth: int, act) -> None:
    """`act()` once the nth save is durable, timed and handed on (prune follows on_save): the series stops there."""
    from ckptbench.save import series

    real, calls = series.prune, []

    def prune(target, keep):
        out = real(target, keep)
        calls.append(target)
        if len(calls) == nth:
            act()
        return out

    monkeypatch.setattr(series, "prune", prune)


def _raise_interrupt():
    raise KeyboardInterrupt


def _sigterm():
    os.kill(os.getpid(), signal.SIGTERM)  # the CLI raises it as Terminated at the next bytecode
    time.sleep(5)  # never reached in full: the handler raises first


def _on_record(results) -> tuple[list[dict], list[dict], list[dict]]:
    """(rows, repeat documents, run documents) of the file."""
    return read_rows(results), read_documents(results, "repeat"), read_documents(results, "run")


@pytest.mark.parametrize("stop, rc, word", [(_raise_interrupt, 130, "interrupted"), (_sigterm, 143, "terminated")],
                         ids=["hook", "sigterm"])
def test_a_series_stopped_after_its_second_save_has_both_on_record_and_an_interrupted_run(tmp_path, monkeypatch,
                                                                                          stop, rc, word):
    results = str(tmp_path / "r.csv")
    _after_prune(monkeypatch, 2, stop)
    r = _save(tmp_path / "t", results)
    assert r.rc == rc, r.err
    assert "Traceback" not in r.err
    rows, repeats, runs = _on_record(results)
    assert [(x["repeat"], x["status"]) for x in rows] == [(1, "ok"), (2, "ok"), (3, "cancelled")]
    run_id = rows[0]["run_id"]
    assert {x["run_id"] for x in rows} == {run_id}
    assert [(d["repeat"], d["status"]) for d in repeats] == [(1, "ok"), (2, "ok")]
    for x, d in zip(rows, repeats):  # each row is its document's save
        assert x["durable_s"] == pytest.approx(d["save"]["durable_s"]) and x["bytes"] == d["save"]["bytes"]
    assert len(runs) == 1
    run = runs[0]
    assert run["run_id"] == run_id and run["status"] == "cancelled"
    assert run["interrupted"] == {"save": 3, "saves": 4, "finished": 2}
    assert [s["index"] for s in run["saves"]] == [1, 2]
    # the figures over the saves that finished: the one after the first
    assert run["sustained_gbps"] == pytest.approx(run["bytes"] / run["saves"][1]["durable_s"] / 1e9)
    assert run["shortest_safe_interval_s"] == pytest.approx(run["saves"][1]["durable_s"] * 1.25)
    assert r.err_lines[-1] == (f"ckptbench: {word} during save 3 of 4: 2 save(s) finished, each shown above, on "
                               f"record as save run {run_id} in {results} (`ckptbench history {results}`)")
    assert "sustained durable throughput" in r.out  # the report of the two, as a run stopped midway prints its own


def test_an_interrupt_while_a_save_is_being_recorded_waits_for_its_row(tmp_path, monkeypatch):
    """Ctrl-C between a save's document and its row left a document with no row."""
    from ckptbench.save import results as save_results

    results = str(tmp_path / "r.csv")
    real = save_results.append_document

    def append_document(path, doc):
        real(path, doc)
        if doc["record"] == "repeat" and doc["repeat"] == 2:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C, between the document and its row

    monkeypatch.setattr(save_results, "append_document", append_document)
    r = _save(tmp_path / "t", results)
    assert r.rc == 130, r.err
    rows, repeats, runs = _on_record(results)
    assert [(x["repeat"], x["status"]) for x in rows] == [(1, "ok"), (2, "ok"), (3, "cancelled")]
    assert [d["repeat"] for d in repeats] == [1, 2]
    assert [(d["status"], d["interrupted"]["finished"]) for d in runs] == [("cancelled", 2)]
    assert "during save 3 of 4: 2 save(s) finished" in r.err_lines[-1]


def test_an_interrupt_while_the_run_document_is_written_leaves_the_run_whole(tmp_path, monkeypatch):
    """The new user's case: a Ctrl-C in the series' last write left rows on record and no run document."""
    from ckptbench.save import results as save_results

    results = str(tmp_path / "r.csv")
    real = save_results.append_document

    def append_document(path, doc):
        if doc["record"] == "run":
            os.kill(os.getpid(), signal.SIGINT)
        real(path, doc)

    monkeypatch.setattr(save_results, "append_document", append_document)
    r = _save(tmp_path / "t", results)
    assert r.rc == 130 and "Traceback" not in r.err, r.err
    rows, repeats, runs = _on_record(results)
    assert [(x["repeat"], x["status"]) for x in rows] == [(i, "ok") for i in (1, 2, 3, 4)]
    assert [d["repeat"] for d in repeats] == [1, 2, 3, 4]
    assert [(d["run_id"], d["status"], len(d["saves"])) for d in runs] == [(rows[0]["run_id"], "ok", 4)]


def _rows_now(results: str) -> int:
    try:
        with open(results, newline="") as f:
            return max(0, sum(1 for _ in f) - 1)
    except FileNotFoundError:
        return 0


def test_a_series_killed_outright_keeps_the_saves_it_finished(tmp_path):
    results, target = str(tmp_path / "r.csv"), tmp_path / "t"
    first = _save(target, results, 2)  # a finished run to compare the killed one with
    assert first.rc == 0, first.err
    before = len(read_rows(results))
    count = 100000  # never all done
    proc = subprocess.Popen([sys.executable, "-m", "ckptbench", "save", "small", str(target), "--scale", SCALE,
                             "--no-fsync", "--count", str(count), "--keep", "1", "--results", results],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    try:
        while _rows_now(results) < before + 3 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stderr.read()
        assert _rows_now(results) >= before + 3, "no three saves on record in 120 s"
        proc.send_signal(signal.SIGKILL)  # as OOM or a lost node end it: no handler, no run document
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.stderr.close()
    rows = read_rows(results)  # every row whole: one half-written is refused here
    killed = rows[before:]
    assert len(killed) >= 3 and {x["status"] for x in killed} == {"ok"}
    run_id = killed[0]["run_id"]
    assert {x["run_id"] for x in killed} == {run_id}
    assert [x["repeat"] for x in killed] == list(range(1, len(killed) + 1))
    assert all(x["durable_s"] > 0 and x["write_gbps"] > 0 for x in killed)
    assert run_id not in {d["run_id"] for d in read_documents(results, "run")}  # killed before its end
    repeats = {d["repeat"] for d in read_documents(results, "repeat") if d["run_id"] == run_id}
    assert set(range(1, len(killed) + 1)) <= repeats  # each row has its document (written first)

    h = run_cli("history", results, "--json")
    assert h.rc == 0 and "Traceback" not in h.err, h.err
    runs = {x["run_id"]: x for x in json.loads(h.out)["runs"]}
    steady = [x["durable_s"] for x in killed[1:]]
    assert runs[run_id]["repeats"] == len(killed)
    assert runs[run_id]["figure_s"] == pytest.approx(statistics.median(steady))
    c = run_cli("compare", results, "--json")
    assert c.rc in (0, 1) and "Traceback" not in c.err, c.err
    assert json.loads(c.out)["newest"] == run_id
    p = run_cli("plan", "small", "--interval", "60", "--results", results, "--target", target, "--json")
    assert p.rc == 0, p.err
    m = json.loads(p.out)["save"]["measured"]
    assert m["run_id"] == run_id and m["saves"] == len(killed)
    assert m["sustained_gbps"] == pytest.approx(killed[1]["bytes"] / statistics.median(steady) / 1e9)


@pytest.fixture
def finished(tmp_path):
    """Two finished series into one target, recorded in one file."""
    results, target = str(tmp_path / "r.csv"), tmp_path / "t"
    docs = []
    for count in (3, 4):
        r = _save(target, results, count, "--json")
        assert r.rc == 0, r.err
        docs.append(json.loads(r.out))
    return results, target, docs


def test_a_series_that_ends_records_as_before(finished):
    results, target, (older, newer) = finished
    assert header_of(results) == COLUMNS
    rows, repeats, runs = _on_record(results)
    assert [(x["run_id"], x["repeat"], x["status"]) for x in rows] == (
        [(older["run_id"], i, "ok") for i in (1, 2, 3)] + [(newer["run_id"], i, "ok") for i in (1, 2, 3, 4)])
    docs = [json.loads(line) for line in open(results + ".jsonl")]
    # each series opened on record before its first save (a series killed outright is then cut short in history)
    assert [d["record"] for d in docs] == (["started"] + ["repeat"] * 3 + ["run"]
                                           + ["started"] + ["repeat"] * 4 + ["run"])
    assert [d["run_id"] for d in runs] == [older["run_id"], newer["run_id"]]
    run = runs[1]
    assert run == json.loads(json.dumps(newer))  # what --json showed is what is on record
    assert run["status"] == "ok" and "interrupted" not in run
    durable = [s["durable_s"] for s in run["saves"]]
    assert run["sustained_gbps"] == pytest.approx(run["bytes"] / statistics.median(durable[1:]) / 1e9)
    assert run["shortest_safe_interval_s"] == pytest.approx(statistics.median(durable[1:]) * 1.25)
    mine = rows[3:]
    for x, s in zip(mine, run["saves"]):
        assert x["durable_s"] == pytest.approx(s["durable_s"]) and x["blocking_s"] == pytest.approx(s["blocking_s"])
        assert x["write_gbps"] == pytest.approx(s["bytes"] / s["durable_s"] / 1e9)
        assert x["write_amplification"] is None  # every save's: the run document's
        # a save's own page cache: within the run's, over every sample
        assert x["dirty_peak_fraction"] is None or x["dirty_peak_fraction"] <= run["dirty_peak_fraction"]
        assert x["dirty_peak_fraction"] == s["dirty_peak_fraction"]

    h = run_cli("history", results, "--json")
    assert h.rc == 0, h.err
    line = {x["run_id"]: x for x in json.loads(h.out)["runs"]}[newer["run_id"]]
    assert (line["repeats"], line["status"]) == (4, "ok")
    assert line["figure_s"] == pytest.approx(statistics.median(durable[1:]))
    c = run_cli("compare", results, "--json")
    assert c.rc in (0, 1), c.err
    c = json.loads(c.out)
    assert (c["newest"], c["baseline"]) == (newer["run_id"], older["run_id"])
    assert {f["figure"] for f in c["figures"]} == {"write_gbps", "durable_s", "written_s", "blocking_s"}
    p = run_cli("plan", "small", "--interval", "60", "--results", results, "--target", target, "--json")
    assert p.rc == 0, p.err
    m = json.loads(p.out)["save"]["measured"]
    assert m["run_id"] == newer["run_id"]
    assert m["sustained_gbps"] == pytest.approx(run["sustained_gbps"])
    # the run's page cache, from its document (its rows hold each save's own, none for a save between samples)
    assert (m["dirty_peak_fraction"], m["throttled"]) == (run["dirty_peak_fraction"], run["throttled"])


def test_an_older_file_with_every_row_written_at_the_end_still_reads(finished, tmp_path):
    """Rows recorded before each save went on record as it ended held the run's page-cache figures in every row."""
    results, target, (_, newer) = finished
    old = str(tmp_path / "old.csv")
    with open(results, newline="") as f:
        rows = list(csv.DictReader(f))
    whole = {"dirty_peak_fraction": "0.25", "throttled": "True", "write_amplification": "1.5"}
    with open(old, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS), lineterminator="\n")
        w.writeheader()
        w.writerows(x | whole if x["run_id"] == newer["run_id"] else x for x in rows)
    # no documents (a file whose .jsonl was lost): the rows are all there is
    p = run_cli("plan", "small", "--interval", "60", "--results", old, "--target", target, "--json")
    assert p.rc == 0, p.err
    m = json.loads(p.out)["save"]["measured"]
    assert (m["run_id"], m["dirty_peak_fraction"], m["throttled"]) == (newer["run_id"], 0.25, True)
    assert m["sustained_gbps"] == pytest.approx(newer["sustained_gbps"])
    h = run_cli("history", old, "--json")
    assert h.rc == 0, h.err
    assert [x["repeats"] for x in json.loads(h.out)["runs"]] == [3, 4]
    c = run_cli("compare", old, "--json")
    assert c.rc in (0, 1), c.err
    assert json.loads(c.out)["newest"] == newer["run_id"]
