"""Ctrl-C to `run` after some repeats finished: those repeats are the run, shown and on record as an interrupted run
document (a new user got `ckptbench: interrupted` alone, and no run id to compare), one line saying so, exit 130.
The real thing: `run` in its own process, SIGINT once its results file holds finished repeats."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

from ckptbench.records.results import read_documents, read_rows


def test_ctrl_c_keeps_the_finished_repeats_as_an_interrupted_run(ckpt, tmp_path):
    src = ckpt("safetensors", 2)
    results = str(tmp_path / "r.csv")
    proc = subprocess.Popen([sys.executable, "-m", "ckptbench", "run", src, "--repeat", "500", "--cache", "hot",
                             "--results", results], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            try:
                if sum(1 for r in read_rows(results) if r["status"] in ("ok", "unverified")) >= 2:
                    break
            except Exception:  # not written yet, or a row half-way through its write
                pass
            time.sleep(0.1)
        else:
            raise AssertionError("no two repeats finished in 120 s")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("\r") and "[" not in ln[:3]]
    assert "Traceback" not in err and lines[-1].startswith("ckptbench: interrupted during repeat "), err
    docs = [d for d in read_documents(results, "run")]
    assert len(docs) == 1, docs
    doc = docs[0]
    finished = [r for r in read_rows(results) if r["status"] in ("ok", "unverified")]
    assert doc["status"] == "cancelled" and doc["interrupted"]["finished"] == len(doc["repeats"]) == len(finished)
    assert doc["interrupted"]["repeats"] == 500 and doc["interrupted"]["repeat"] == len(finished) + 1
    assert f"{len(finished)} repeat(s)" in out and f"recorded: run {doc['run_id']} in {results}" in out, out
    assert doc["rto_s"] > 0 and json.dumps(doc)  # a run document like any other, its medians over what finished
