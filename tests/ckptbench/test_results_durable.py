"""Results that survive: a run killed with SIGKILL keeps every finished repeat in results.csv and its .jsonl; a
results file that cannot be appended to is refused before any restore; any source path is recorded; no NaN or
Infinity in a document. Files are read back with csv and json, not ckptbench."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from clirun import Run, assert_one_line_error, run_cli

POLL_S = 0.02
HANG_S = 300  # only a guard against a hung run, never a measurement


def csv_rows(data: bytes) -> list[dict]:
    """Every data row of a results file; each line must be whole (ended by a newline)."""
    text = data.decode("utf-8")  # strict: the file is valid UTF-8
    assert text.endswith("\n"), "a row was left torn"
    reader = csv.reader(io.StringIO(text, newline=""))
    header = next(reader)
    return [dict(zip(header, values, strict=True)) for values in reader]


def json_lines(data: bytes) -> list[dict]:
    """Every line of a .jsonl as strict JSON (NaN and Infinity refused); each line must be whole."""
    def refuse(token):
        raise ValueError(f"{token} in a JSON document")

    text = data.decode("utf-8")
    assert text.endswith("\n"), "a document was left torn"
    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


def whole_lines(path) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b"\n")
    except FileNotFoundError:
        return 0


# --- SIGKILL mid-run ---

def test_sigkill_during_a_long_run_keeps_every_finished_repeat_in_both_files(ckpt, tmp_path):
    results = tmp_path / "R.csv"
    err = open(tmp_path / "stderr", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "ckptbench", "run", ckpt("safetensors", 2), "--repeat", "30",
                             "--results", str(results)], stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + HANG_S
    try:
        while whole_lines(results) < 3 and proc.poll() is None and time.monotonic() < deadline:  # header + 2
            time.sleep(POLL_S)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    err.seek(0)
    assert proc.returncode == -signal.SIGKILL, f"the run ended before the kill:\n{err.read()}"
    rows = csv_rows(results.read_bytes())
    assert len(rows) >= 2
    started, *docs = json_lines(open(str(results) + ".jsonl", "rb").read())
    assert started["record"] == "started" and started["process"]["pid"] == proc.pid  # history: cut short
    assert all(d["record"] == "repeat" for d in docs), "a run killed mid-way has no summary"
    run_id = rows[0]["run_id"]
    assert [(r["run_id"], r["repeat"]) for r in rows] == [(run_id, str(i)) for i in range(1, len(rows) + 1)]
    # each row's document lands before the row: the documents are the rows', plus at most the one being recorded
    assert [(d["run_id"], d["repeat"]) for d in docs] == [(run_id, i) for i in range(1, len(docs) + 1)]
    assert len(docs) in (len(rows), len(rows) + 1)
    for row, doc in zip(rows, docs):
        assert doc["status"] == row["status"] == "ok"
        assert float(row["rto_s"]) == doc["rto_s"] and int(row["bytes"]) == doc["bytes"]
        assert json.loads(row["env"]) == doc["env"]


# --- a results file that cannot be appended to: refused before any restore ---

# The CLI with a tripwire on the checkpoint reads: any restore that starts says so on stderr.
TRIPWIRE = """
import sys
import fastio
def tripwire(*args, **kwargs):
    sys.stderr.write("TRIPWIRE: the checkpoint was read\\n")
    raise SystemExit(99)
fastio.start = fastio.read_files = tripwire
from ckptbench.cli.root import main
sys.exit(main(sys.argv[1:]))
"""


# Root writes to any file whatever its mode: as root, the CLI runs without CAP_DAC_OVERRIDE and
# CAP_DAC_READ_SEARCH (setpriv), so file modes bind it as they bind a user (uid nobody could not even exec this
# python, which lives under root's 0700 home).
NO_DAC = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]


def unprivileged(*args) -> Run:
    """The CLI, with the tripwire, bound by file modes."""
    prefix = NO_DAC if os.geteuid() == 0 else []
    proc = subprocess.run([*prefix, sys.executable, "-c", TRIPWIRE, *map(str, args)], capture_output=True,
                          text=True, timeout=HANG_S)
    return Run(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def setting(ckpt, tmp_path):
    """A checkpoint and a folder with the results files of one run."""
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: file modes cannot bind the CLI")
    out = tmp_path / "out"
    out.mkdir()
    results = out / "R.csv"
    r = run_cli("run", ckpt("safetensors", 2), "--repeat", "1", "--json", "--results", results)
    assert r.rc == 0, r.err
    probe = tmp_path / "probe"
    probe.write_text("")
    probe.chmod(0o444)
    r = unprivileged("--version")
    assert r.rc == 0, r.err
    bound = subprocess.run([*(NO_DAC if os.geteuid() == 0 else []), sys.executable, "-c",
                            f"open({str(probe)!r}, 'a')"], capture_output=True, text=True, timeout=HANG_S)
    assert bound.returncode != 0, "a mode 0444 file could be opened for append: file modes do not bind the CLI"
    return ckpt("safetensors", 2), str(out), str(results)


def folder_state(out: str) -> dict[str, tuple[int, bytes]]:
    state = {}
    for n in sorted(os.listdir(out)):
        with open(os.path.join(out, n), "rb") as f:
            state[n] = (os.stat(os.path.join(out, n)).st_mode, f.read())
    return state


def test_the_tripwire_sees_a_restore(setting):
    """The control for the refusals below: with a writable results file, the run does reach the checkpoint."""
    src, _, results = setting
    r = unprivileged("run", src, "--repeat", "1", "--results", results)
    assert "TRIPWIRE: the checkpoint was read" in r.err


@pytest.mark.parametrize("locked", ["R.csv", "R.csv.jsonl"])
def test_read_only_results_file_is_refused_before_any_restore(setting, locked):
    src, out, results = setting
    os.chmod(os.path.join(out, locked), 0o444)
    before = folder_state(out)
    r = unprivileged("run", src, "--repeat", "1", "--results", results)
    assert "TRIPWIRE" not in r.err, "the checkpoint was read before the results file was refused"
    assert_one_line_error(r, os.path.join(out, locked), rc=1)  # the system refused it (EACCES)
    assert folder_state(out) == before, "a results file changed, or a file was left beside it"


def test_results_folder_that_takes_no_new_file_is_refused_before_any_restore(setting):
    src, out, _ = setting
    folder = os.path.join(out, "new")
    os.mkdir(folder, 0o555)
    r = unprivileged("run", src, "--repeat", "1", "--results", os.path.join(folder, "R.csv"))
    assert "TRIPWIRE" not in r.err
    assert_one_line_error(r, os.path.join(folder, "R.csv"), rc=1)
    assert os.listdir(folder) == []


def test_check_writable_leaves_nothing_behind_for_a_new_file(tmp_path):
    from ckptbench.records import results

    results.check_writable(str(tmp_path / "R.csv"))
    assert os.listdir(tmp_path) == []


# --- a source path that is not UTF-8 ---

def test_a_source_path_that_is_not_utf8_is_recorded_escaped_in_both_files(ckpt, tmp_path):
    raw = os.fsencode(tmp_path) + b"/ck\xffpt"
    src = shutil.copytree(ckpt("safetensors", 2), os.fsdecode(raw))
    results = tmp_path / "R.csv"
    proc = subprocess.run([sys.executable, "-m", "ckptbench", "run", src, "--repeat", "1", "--json",
                           "--results", str(results)], capture_output=True, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    assert b"Traceback" not in proc.stderr
    escaped = raw.decode("utf-8", "backslashreplace")
    assert escaped.endswith("/ck\\xffpt")
    rows = csv_rows(results.read_bytes())
    assert [r["source"] for r in rows] == [escaped]
    docs = json_lines(open(str(results) + ".jsonl", "rb").read())
    assert [(d["record"], d["source"]) for d in docs] == [("started", escaped), ("repeat", escaped), ("run", escaped)]
    assert json.loads(proc.stdout)["source"] == escaped


# --- no NaN or Infinity in a document ---

def _repeat(rto_s: float, read_gbps: float):
    from ckptbench.system.pagecache import CacheCondition
    from ckptbench.restore.runner import RepeatResult

    return RepeatResult(stages={"read": rto_s}, notes={}, rto_s=rto_s, bytes=10, files=1, files_restored=1,
                        read_gbps=read_gbps, engine_gbps=float("-inf"), retries=0, errors={},
                        cache=CacheCondition("as-is", float("nan"), True), peak_rss_bytes=1, cpu_s=0.0)


def test_non_finite_figures_are_null_in_every_document(tmp_path):
    from ckptbench.records import recorder, results
    from ckptbench.restore.runner import RunOptions

    path = str(tmp_path / "R.csv")
    rec = recorder.Recorder(path, "nonfinite", "/ck", "safetensors", RunOptions(), {"date": "2024-01-01"})
    reps = [_repeat(float("nan"), float("inf")), _repeat(1.0, 2.0)]
    for rep in reps:
        rec.repeat(rep)
    rec.stopped({"read": float("inf")}, "cancelled")
    doc = rec.finish(reps, {"cost": {"per_month": float("inf")}})
    docs = json_lines(open(path + ".jsonl", "rb").read())
    assert [(d["record"], d.get("repeat")) for d in docs] == [("repeat", 1), ("repeat", 2), ("repeat", 3),
                                                              ("run", None)]
    first, _, stopped, run = docs
    assert first["rto_s"] is None and first["read_gbps"] is None and first["engine_gbps"] is None
    assert first["cache"]["residency_before"] is None and first["stages"] == {"read": None}
    assert stopped["status"] == "cancelled" and stopped["stages"] == {"read": None}
    assert run["cost"] == {"per_month": None}
    assert run == doc  # what finish returns is what was recorded
    rows = csv_rows(open(path, "rb").read())
    assert [(r["repeat"], r["rto_s"], r["read_gbps"]) for r in rows] == [("1", "", ""), ("2", "1.0", "2.0"),
                                                                           ("3", "", "")]


# --- reading the documents back ---

def test_read_documents_picks_records_and_survives_a_torn_line(tmp_path):
    from ckptbench.records import results

    path = str(tmp_path / "R.csv")
    with open(path + ".jsonl", "w") as f:
        f.write(json.dumps({"run_id": "old"}) + "\n")  # written before records were tagged: a run
        f.write('{"record": "repeat", "run_id": "kil')  # torn by a crash
    results.append_document(path, {"record": "repeat", "run_id": "new", "repeat": 1})
    results.append_document(path, {"record": "run", "run_id": "new"})
    lines = open(path + ".jsonl").read().splitlines()
    assert len(lines) == 4 and json.loads(lines[2]) == {"record": "repeat", "run_id": "new", "repeat": 1}
    assert [d["run_id"] for d in results.read_documents(path, "run")] == ["old", "new"]
    assert [d["run_id"] for d in results.read_documents(path, "repeat")] == ["new"]
    assert results.read_documents(str(tmp_path / "none.csv")) == []
