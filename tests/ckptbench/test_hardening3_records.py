"""Hostile input to what ckptbench reads back: results.csv and its .jsonl, the floor cache, plan's inputs.

Every value in those files is anyone's: a bad one is one line and a non-zero exit, never a traceback, a hang, a
verdict it turned, or a file written through a link someone planted."""

from __future__ import annotations

import csv
import json
import os
import threading

import pytest
from clirun import assert_one_line_error, run_cli

from ckptbench.core.errors import CkptbenchError
from ckptbench.records import results

ENV = {"date": "2026-01-01T00:00:00+00:00", "kernel": "6.1", "cpu_count": 2}
SETTINGS = {"format": "safetensors", "mode": "fused", "cache": "cold", "concurrency": 8, "read": "pread", "hash": "",
            "block_size": 1 << 20, "device": "cpu"}


def _restore(path, run_id: str, rto: float, repeats: int = 3, **figures) -> None:
    results.append(str(path), [results.row("restore", run_id, i, "/data/ck", SETTINGS,
                                           {"rto_s": rto + i * 0.01, "read_gbps": 1 / (rto + i * 0.01)} | figures,
                                           ENV, status="ok", verified=True, success_rate=1.0)
                               for i in range(1, repeats + 1)])


def _save(path, run_id: str, gbps: float, target: str = "/t") -> None:
    results.append(str(path), [results.row("save", run_id, i, "small", {"format": "torch", "mode": "sync",
                                                                        "target": target, "ranks": 1},
                                           {"write_gbps": gbps, "durable_s": 1.0}, ENV, status="ok", verified=None,
                                           success_rate=None) for i in (1, 2, 3)])


def _two_runs(tmp_path):
    path = tmp_path / "r.csv"
    _restore(path, "base1", 1.0)
    _restore(path, "new1", 1.5)
    return path


def _edit(path, column: str, value: str, lines: set[int]) -> None:
    """Sets `column` to `value` on the given file lines (2 is the first row)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    i = rows[0].index(column)
    for n in lines:
        rows[n - 1][i] = value
    with open(path, "w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)


def _not_blocked(call, fifo: str) -> None:
    """`call` returns (or raises) by itself: on a FIFO it must not wait for a writer or a reader (released here so
    that a failing test does not leave a thread stuck)."""
    done = threading.Event()
    raised = []

    def body():
        try:
            call()
        except Exception as exc:  # noqa: BLE001 - what it raised is checked by the caller
            raised.append(exc)
        done.set()

    threading.Thread(target=body, daemon=True).start()
    if not done.wait(5):
        for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
            try:
                os.close(os.open(fifo, flags))
            except OSError:
                pass
        pytest.fail(f"blocked on the FIFO {fifo}")
    assert raised and isinstance(raised[0], CkptbenchError), raised
    assert "not a regular file" in str(raised[0])


# --- results.csv and its documents -------------------------------------------------------------------------------

def test_a_nested_document_line_is_skipped_not_a_traceback(tmp_path):
    path = _two_runs(tmp_path)
    with open(f"{path}.jsonl", "w") as f:
        f.write("[" * 100_000 + "\n" + '{"a":' * 100_000 + "\n" + json.dumps({"record": "run", "run_id": "x"}) + "\n")
    assert [d["run_id"] for d in results.read_documents(str(path))] == ["x"]
    r = run_cli("compare", path)
    assert r.rc == 1 and "Traceback" not in r.err and "REGRESSION" in r.out


def test_a_run_id_used_again_is_refused_not_merged(tmp_path):
    """base1 again at the end (two files joined): merged, the baseline's median moved and the regression read
    "within noise", exit 0."""
    path = _two_runs(tmp_path)
    _restore(path, "base1", 3.0)
    r = run_cli("compare", path)
    assert_one_line_error(r, "r.csv:8: run 'base1' has repeat 1 twice")


def test_a_run_id_of_two_kinds_is_refused(tmp_path):
    path = _two_runs(tmp_path)
    _save(path, "new1", 1.0)
    r = run_cli("compare", path)
    assert_one_line_error(r, "run 'new1' is recorded as restore and save rows")


@pytest.mark.parametrize("column, value", [("rto_s", "-5"), ("rto_s", "1e308"), ("read_gbps", "1e308"),
                                           ("read_gbps", "-1"), ("read_s", "-0.5")])
def test_an_impossible_figure_is_refused_not_compared(tmp_path, column, value):
    """One repeat's rto_s of -5 (or a rate of 1e308 GB/s) turned a +49 % REGRESSION into "within noise"."""
    path = _two_runs(tmp_path)
    _edit(path, column, value, {5})
    r = run_cli("compare", path)
    assert_one_line_error(r, f"run 'new1' repeat 1 records {column} ")
    assert "out of range" in r.err


def test_a_change_over_a_vanishing_baseline_is_no_infinity(tmp_path):
    path = _two_runs(tmp_path)
    _edit(path, "rto_s", "5e-324", {2, 3, 4})
    r = run_cli("compare", "--json", path)
    doc = json.loads(r.out, parse_constant=lambda c: pytest.fail(f"{c} in --json"))
    assert next(f for f in doc["figures"] if f["figure"] == "rto_s")["change_pct"] is None
    r = run_cli("compare", path)
    assert "inf" not in r.out


@pytest.mark.parametrize("value", ["1.5", "0", "-1"])
def test_a_repeat_that_is_not_a_whole_number_from_1_is_refused(tmp_path, value):
    path = _two_runs(tmp_path)
    _edit(path, "repeat", value, {5})
    assert_one_line_error(run_cli("compare", path), "r.csv:5: malformed value (repeat is")


def test_a_missing_results_file_says_what_to_do(tmp_path):
    assert_one_line_error(run_cli("compare", tmp_path / "none.csv"),
                          "no such results file; `ckptbench run`, `save` and `watch` write one")


def test_append_never_writes_through_a_planted_temporary_link(tmp_path):
    """The new file's header went to `results.csv.tmp-PID`, a name anyone could plant a link at: root truncated and
    overwrote the file it pointed to."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path = tmp_path / "r.csv"
    os.symlink(victim, f"{path}.tmp-{os.getpid()}")
    _restore(path, "a", 1.0)
    assert victim.read_text() == "precious\n"
    assert not os.path.islink(path) and len(results.read_rows(str(path))) == 3
    assert os.path.islink(f"{path}.tmp-{os.getpid()}")  # not ours: left where it was


def test_a_document_is_never_appended_to_a_fifo(tmp_path):
    path = tmp_path / "r.csv"
    os.mkfifo(f"{path}.jsonl")
    _not_blocked(lambda: results.append_document(str(path), {"record": "run"}), f"{path}.jsonl")


def test_a_results_file_is_opened_by_its_type_not_a_check_before(tmp_path, monkeypatch):
    """A FIFO swapped in after a stat() blocked the read for ever: the type is the open descriptor's."""
    path = tmp_path / "r.csv"
    os.mkfifo(path)
    regular = os.stat(__file__)
    real = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: regular if str(p) == str(path) else real(p, *a, **k))
    _not_blocked(lambda: results.read_rows(str(path)), str(path))


def test_a_link_to_nothing_is_refused_before_the_run(tmp_path):
    """check_writable passed it (a missing file, its folder writable); append then failed after the run."""
    path = tmp_path / "r.csv"
    os.symlink(tmp_path / "gone" / "r.csv", path)
    with pytest.raises(CkptbenchError, match="a symbolic link to a missing file"):
        results.check_writable(str(path))


# --- the floor cache ---------------------------------------------------------------------------------------------

def test_the_floor_cache_never_writes_through_a_planted_temporary_link(tmp_path):
    from ckptbench.system import floorcache

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    path = tmp_path / "ckptbench" / "floor.json"
    path.parent.mkdir()
    os.symlink(victim, f"{path}.tmp-{os.getpid()}")
    assert floorcache.write_cache(str(path), {"schema": 0}) is None
    assert victim.read_text() == "precious\n"
    assert json.loads(path.read_text()) == {"schema": 0}
    assert os.path.islink(f"{path}.tmp-{os.getpid()}")


# --- plan --------------------------------------------------------------------------------------------------------

def test_plan_target_against_a_recorded_target_with_a_nul_byte(tmp_path):
    path = tmp_path / "r.csv"
    _save(path, "s1", 1.0, target="/t\x00x")
    r = run_cli("plan", "small", "--interval", "60", "--results", path, "--target", tmp_path)
    assert r.rc == 0 and "Traceback" not in r.err, r.err
    assert "no save measured" in r.out


def test_plan_a_vanishing_write_rate_is_unknown(tmp_path):
    """1e-300 GB/s passed "above 0": a save of the small profile took 10^300 s, printed digit by digit."""
    path = tmp_path / "r.csv"
    _save(path, "s1", 1e-300)
    r = run_cli("plan", "small", "--interval", "60", "--results", path, "--json")
    assert r.rc == 0, r.err
    save = json.loads(r.out)["save"]
    assert "measured" not in save and "out of range" in save["measured_unknown"]


def test_plan_recorded_text_is_cut(tmp_path):
    path = tmp_path / "r.csv"
    _save(path, "s" * 5000, 1.0)
    r = run_cli("plan", "small", "--interval", "60", "--results", path)
    assert r.rc == 0 and "s" * 200 not in r.out


@pytest.mark.parametrize("figures", [{"ranks": 1e308, "aggregate_gbps": 5.0}, {"ranks": 1.5, "aggregate_gbps": 5.0},
                                     {"ranks": 1, "aggregate_gbps": 1e-300}])
def test_plan_nodes_ignores_a_dist_run_no_ranks_could_have_made(tmp_path, figures):
    from ckptbench.plan.scale import measured_rank_read

    path = tmp_path / "r.csv"
    _restore(path, "good", 1.0, repeats=1)
    results.append(str(path), [results.row("dist", "bad", 1, "/data/ck", SETTINGS | {"ranks": figures.pop("ranks")},
                                           figures, ENV, status="ok", verified=True, success_rate=1.0)])
    got = measured_rank_read(str(path))
    assert got["run_id"] == "good" and got["gbps"] > 0.5


def test_plan_nodes_ignores_a_vanishing_restore_rate(tmp_path):
    from ckptbench.plan.scale import measured_rank_read

    path = tmp_path / "r.csv"
    _restore(path, "good", 1.0, repeats=1)
    _restore(path, "bad", 1.0, repeats=1)
    _edit(path, "read_gbps", "1e-300", {3})
    assert measured_rank_read(str(path))["run_id"] == "good"


def _preset(tmp_path, body: str) -> str:
    path = tmp_path / "p.toml"
    path.write_text(body)
    return str(path)


@pytest.mark.parametrize("body, needle", [
    ("ceiling_gbps = 1\nx = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deep"),
    ("ceiling_gbps = 1\nx = " + "{a=" * 5000 + "1" + "}" * 5000 + "\n", "nested too deep"),
    ("#" * (70 << 10) + "\nceiling_gbps = 1\n", "at most 64 KiB"),
    ("ceiling_gbps = 1e-300\n", "ceiling_gbps must be a positive number"),
    ("ceiling_gbps = 1\nmetadata_ops_per_s = 1e-300\n", "metadata_ops_per_s must be"),
    # the checklist's fields, read by the same reader since plan and the checklist share one: printed as a fix
    ('ceiling_gbps = 1\ndescription = "\\u001b]0;owned\\u0007"\n', "description must be one line"),
    ("ceiling_gbps = 1\n[mount_options]\n'a b' = 1\n", "mount_options must be a table"),
    ("ceiling_gbps = 1\n[mount_options]\nrsize = 1e400\n", "mount_options must be a table"),
    ("ceiling_gbps = 1\n[mount_options]\nrsize = ['x']\n", "mount_options must be a table"),
    ("ceiling_gbps = 1\nsource_contains = ['']\n", "source_contains must be a list of names"),
    ("ceiling_gbps = 1\nmin_concurrency = 0\n", "min_concurrency must be a positive whole number"),
], ids=["nested-arrays", "nested-tables", "large", "vanishing-rate", "vanishing-ops", "escape-description",
        "option-name", "option-inf", "option-list", "empty-hint", "no-concurrency"])
def test_plan_a_hostile_storage_preset_is_one_line(tmp_path, body, needle):
    r = run_cli("plan", "small", "--nodes", "2", "--storage", _preset(tmp_path, body), "--results", tmp_path / "n.csv")
    assert_one_line_error(r, needle)


def test_plan_a_preset_value_is_quoted_short(tmp_path):
    r = run_cli("plan", "small", "--nodes", "2", "--storage", _preset(tmp_path, f"ceiling_gbps = '{'A' * 50000}'\n"))
    assert_one_line_error(r, "ceiling_gbps must be")
    assert len(r.err) < 400


def test_plan_an_unknown_preset_name_is_quoted_short():
    r = run_cli("plan", "small", "--nodes", "2", "--storage", "x" * 100_000)
    assert_one_line_error(r, "unknown storage preset")
    assert len(r.err) < 500


def test_plan_a_fifo_preset_never_blocks(tmp_path, monkeypatch):
    from ckptbench.system import storage

    fifo = tmp_path / "p.toml"
    os.mkfifo(fifo)
    monkeypatch.setattr(os.path, "isfile", lambda p: True)  # swapped in after the check
    done = threading.Event()
    raised = []

    def body():
        try:
            storage.load(str(fifo))
        except CkptbenchError as exc:
            raised.append(exc)
        done.set()

    threading.Thread(target=body, daemon=True).start()
    if not done.wait(5):
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("blocked on a FIFO preset")
    assert raised and "not a storage preset" in str(raised[0])
