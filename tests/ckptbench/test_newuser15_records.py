"""New-user pass 15, runs on record: `history` says the time a run's efficiency is over (a save's after its first
save, a restore's less the model's first step) and marks an efficiency past the floor; a restore that failed is
recorded with why."""

from __future__ import annotations

import json
import statistics

import pytest
from clirun import run_cli

from ckptbench.records.results import jsonl_path, read_documents, read_rows

SCALE = "0.02"


def _history_line(path: str) -> str:
    r = run_cli("history", path)
    assert r.rc == 0, r.err
    (line,) = r.out.splitlines()
    return line


def test_a_saves_history_is_of_the_saves_after_the_first(tmp_path):
    path = str(tmp_path / "S.csv")
    r = run_cli("save", "small", tmp_path / "target", "--scale", SCALE, "--no-fsync", "--count", "3", "--results",
                path)
    assert r.rc == 0, r.err
    rows = read_rows(path)
    after_first = statistics.median(r["durable_s"] for r in rows if r["repeat"] != 1)
    line = _history_line(path)
    assert "median durable after the first save " in line, line
    doc = json.loads(run_cli("history", path, "--json").out)["runs"][0]
    assert doc["figure_s"] == pytest.approx(after_first) and doc["steady"] is True


def test_a_restores_history_says_the_rto_less_its_model_step(tmp_path):
    ckpt = tmp_path / "ck"
    assert run_cli("gen", "small", ckpt, "--scale", SCALE).rc == 0
    path = str(tmp_path / "R.csv")
    r = run_cli("run", ckpt, "--repeat", "2", "--results", path)
    assert r.rc == 0, r.err
    doc = next(d for d in read_documents(path, "run"))
    assert doc["check"] == "model step"
    rows = read_rows(path)
    held = statistics.median(r["rto_s"] - r["check_s"] for r in rows)
    run = json.loads(run_cli("history", path, "--json").out)["runs"][0]
    assert run["held_s"] == pytest.approx(held) and run["figure_s"] == pytest.approx(
        statistics.median(r["rto_s"] for r in rows))
    assert "less the model's first step" in _history_line(path)


def test_an_efficiency_past_the_floor_is_marked_in_history(tmp_path):
    ckpt = tmp_path / "ck"
    assert run_cli("gen", "small", ckpt, "--scale", SCALE).rc == 0
    path = str(tmp_path / "R.csv")
    assert run_cli("run", ckpt, "--repeat", "1", "--results", path).rc == 0
    docs = [json.loads(line) for line in open(jsonl_path(path))]
    with open(jsonl_path(path), "w") as f:
        for d in docs:  # as a floor measured on a busy box leaves it: the run 1.5 times as fast as its floor
            f.write(json.dumps(d | ({"floor_s": 1.0, "efficiency": 1.5} if d.get("record") == "run" else {})) + "\n")
    assert "efficiency 150 % (over the floor: a ceiling measured low)" in _history_line(path)


def test_a_failed_restore_is_recorded_with_why(tmp_path):
    import torch
    from safetensors.torch import save_file

    ck = tmp_path / "ck"
    ck.mkdir()
    save_file({"w": torch.ones(1 << 20)}, str(ck / "model.safetensors"))
    with open(ck / "model.safetensors", "r+b") as f:
        f.truncate(1 << 20)  # the header names 4 MiB of data
    path = str(tmp_path / "R.csv")
    r = run_cli("run", str(ck), "--repeat", "1", "--results", path)
    assert r.rc != 0 and "truncated" in r.err
    (row,) = read_rows(path)
    assert row["status"] == "failed"
    (rep,) = read_documents(path, "repeat")
    assert rep["status"] == "failed" and "truncated" in rep["error"] and len(rep["error"]) <= 500
