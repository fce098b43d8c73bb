"""`ckptbench save` end to end: saves land atomically under fresh names, the newest K stay, every save verifies and
loads, the report's figures follow from the saves it lists, and the runs go to results.csv as kind `save`.
Saved tensors are checked with safetensors read directly, not through ckptbench."""

from __future__ import annotations

import csv
import json
import os
import re
import statistics

import pytest
import torch
from clirun import run_cli
from safetensors import safe_open

SCALE = "0.02"


def save_json(*args) -> dict:
    r = run_cli("save", *args, "--json")
    assert r.rc == 0, r.err
    return json.loads(r.out)


def verify_ok(path) -> None:
    r = run_cli("verify", path)
    assert r.rc == 0 and "OK:" in r.out, r.out + r.err


def no_temporaries(target) -> None:
    assert [n for n in os.listdir(target) if n.startswith(".")] == []


@pytest.fixture(scope="module")
def three_saves(tmp_path_factory):
    base = tmp_path_factory.mktemp("save")
    target, results = base / "t", base / "R.csv"
    doc = save_json("small", target, "--scale", SCALE, "--count", "3", "--keep", "2", "--interval", "2",
                    "--results", results)
    return doc, target, results


def test_newest_k_saves_kept_under_fresh_names(three_saves):
    doc, target, _ = three_saves
    assert [s["name"] for s in doc["saves"]] == ["step-000001", "step-000002", "step-000003"]
    assert sorted(os.listdir(target)) == ["step-000002", "step-000003"]
    no_temporaries(target)
    for name in os.listdir(target):
        verify_ok(target / name)


def test_each_save_is_timed_three_ways_in_order(three_saves):
    doc, _, _ = three_saves
    for s in doc["saves"]:
        assert 0 < s["written_s"] <= s["durable_s"]
        assert s["blocking_s"] == s["durable_s"]  # a synchronous save blocks training until it is durable
        assert s["overran"] == (s["durable_s"] > 2)
        assert s["bytes"] == doc["bytes"]


def test_report_figures_follow_from_the_saves(three_saves):
    doc, _, _ = three_saves
    after_first = doc["saves"][1:]
    assert doc["sustained_gbps"] == pytest.approx(doc["bytes"] / statistics.median(s["durable_s"] for s in after_first)
                                                  / 1e9)
    assert doc["shortest_safe_interval_s"] == pytest.approx(statistics.median(s["durable_s"] for s in after_first)
                                                            * 1.25)
    assert doc["needed_gbps"] == pytest.approx(doc["bytes"] / 2 / 1e9)
    assert 0 <= doc["dirty_peak_fraction"] < 1.5 and isinstance(doc["throttled"], bool)
    assert [c["name"] for c in doc["preflight"]] == ["rename", "fsync file", "fsync dir", "O_DIRECT", "free space"]
    assert doc["samples"] and {"dirty_bytes", "writeback_bytes", "dirty_limit_bytes"} <= set(doc["samples"][0])


def test_save_rows_in_results(three_saves):
    doc, _, results = three_saves
    with open(results, newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["kind"], r["schema"], r["repeat"], r["status"]) for r in rows] == [
        ("save", "3", str(i), "ok") for i in (1, 2, 3)]
    assert all(r["success_rate"] == "1.0" and r["verified"] == "" for r in rows)  # a save has nothing to verify
    assert {r["run_id"] for r in rows} == {doc["run_id"]}
    for r, s in zip(rows, doc["saves"]):
        assert float(r["durable_s"]) == pytest.approx(s["durable_s"])
        assert float(r["write_gbps"]) == pytest.approx(s["bytes"] / s["durable_s"] / 1e9)
    assert json.loads(rows[0]["env"])["source_fs"]  # the environment of the target, as for restores
    started, *docs = [json.loads(line) for line in open(str(results) + ".jsonl")]
    assert (started["record"], started["run_id"], started["planned"]) == ("started", doc["run_id"], 3)
    assert [d["record"] for d in docs] == ["repeat"] * 3 + ["run"]
    assert all((d["status"], d["verified"], d["success_rate"]) == ("ok", None, 1.0) for d in docs)


def test_compare_works_on_save_runs_and_plan_uses_the_measured_throughput(three_saves, tmp_path):
    _, target, results = three_saves
    second = save_json("small", target, "--scale", SCALE, "--count", "2", "--results", results)
    assert sorted(os.listdir(target)) == ["step-000004", "step-000005"]  # numbering continues after the newest
    r = run_cli("compare", results, "--json")
    assert r.rc in (0, 1), r.err
    c = json.loads(r.out)
    assert c["newest"] == second["run_id"]
    assert {f["figure"] for f in c["figures"]} == {"write_gbps", "durable_s", "written_s", "blocking_s"}
    r = run_cli("plan", "small", "--interval", "60", "--results", results, "--target", target, "--json")
    assert r.rc == 0, r.err
    m = json.loads(r.out)["save"]["measured"]
    assert m["run_id"] == second["run_id"]
    assert m["sustained_gbps"] == pytest.approx(second["saves"][1]["bytes"] / second["saves"][1]["durable_s"] / 1e9)
    r = run_cli("plan", "small", "--interval", "60", "--results", results, "--target", tmp_path, "--json")
    assert "measured" not in json.loads(r.out)["save"]


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    src = tmp_path_factory.mktemp("src") / "ckpt"
    r = run_cli("gen", "small", src, "--scale", SCALE, "--format", "safetensors", "--ranks", "2")
    assert r.rc == 0, r.err
    return src


def _tensors(folder) -> dict[str, torch.Tensor]:
    out = {}
    for n in sorted(os.listdir(folder)):
        if n.endswith(".safetensors"):
            with safe_open(os.path.join(folder, n), "pt") as f:
                out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def test_a_checkpoint_directory_is_saved_with_its_own_tensors(source, tmp_path):
    doc = save_json(source, tmp_path / "t", "--count", "1", "--ranks", "3", "--results", "")
    saved = tmp_path / "t" / doc["saves"][0]["name"]
    verify_ok(saved)
    a, b = _tensors(source), _tensors(saved)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert len([n for n in os.listdir(saved) if n.startswith("model-")]) == 3
    r = run_cli("load", saved)
    assert r.rc == 0 and "passed" in r.out, r.out + r.err


@pytest.mark.parametrize("fmt, extra", [("torch", ()), ("dcp", ()), ("dcp", ("--async",))])
def test_other_formats_save_loadable_checkpoints(fmt, extra, tmp_path):
    doc = save_json("small", tmp_path / "t", "--scale", SCALE, "--format", fmt, "--count", "2", "--results", "",
                    *extra)
    for s in doc["saves"]:
        assert s["blocking_s"] <= s["durable_s"] and s["written_s"] <= s["durable_s"]
    newest = tmp_path / "t" / doc["saves"][-1]["name"]
    verify_ok(newest)
    r = run_cli("load", newest)
    assert r.rc == 0 and "passed" in r.out, r.out + r.err
    if extra:
        assert any("async_save" in n for n in doc["notes"])


def test_stagger_delays_each_rank(tmp_path):
    doc = save_json("small", tmp_path / "t", "--scale", SCALE, "--ranks", "3", "--stagger", "0.05", "--count", "2",
                    "--results", "")
    for s in doc["saves"]:
        spans = sorted(s["spans"], key=lambda x: x["rank"])
        assert [x["rank"] for x in spans] == [0, 1, 2]
        assert all(x["start_s"] >= x["rank"] * 0.05 for x in spans)
        assert sum(x["bytes"] for x in spans) < s["bytes"]  # the index and manifest are not a rank's
    st = doc["stagger"]
    assert st["ranks"] == 3 and 1 <= st["peak_concurrent_ranks"] <= 3
    assert st["peak_write_gbps"] <= st["peak_write_gbps_all_at_once"] + 1e-9


def test_text_output_shows_preflight_then_saves_then_verdict(tmp_path):
    r = run_cli("save", "small", tmp_path / "t", "--scale", SCALE, "--count", "2", "--interval", "1",
                "--results", "")
    assert r.rc == 0, r.err
    lines = r.out.splitlines()
    assert lines[0] == "preflight of the target:"
    assert any(line.startswith("  step-000002:") for line in lines)
    assert any("sustained durable throughput" in line for line in lines)
    assert any(line.startswith("every 1 s needs") for line in lines)
    assert re.search(r"peaked at (\d+(\.\d)? %|unknown) of the dirty limit", r.out), r.out  # as `run` writes a share


def test_run_save_hands_each_sample_and_save_to_its_callbacks(tmp_path):
    from ckptbench.save.series import SaveOptions, run_save
    from ckptbench.system.writeback import WritebackSample

    samples, saves = [], []
    report = run_save("small", str(tmp_path / "t"), SaveOptions(count=2, interval_s=0.6), scale=float(SCALE),
                      on_sample=samples.append, on_save=saves.append)
    assert samples and all(isinstance(s, WritebackSample) for s in samples)
    assert samples == report.samples  # every sample the report holds reached the callback, in order
    assert [s.name for s in saves] == [s.name for s in report.saves] == ["step-000001", "step-000002"]


def test_a_save_in_text_says_where_it_went_on_record(tmp_path):
    results = tmp_path / "s.csv"
    r = run_cli("save", "small", tmp_path / "t", "--scale", SCALE, "--count", "1", "--results", results)
    assert r.rc == 0, r.err
    with open(results, newline="") as f:
        run_id = list(csv.DictReader(f))[-1]["run_id"]
    said = r.out.splitlines()[-1]
    assert said.startswith(f"recorded: save {run_id} in {results} "), said


def test_a_bare_profile_name_is_the_profile_even_beside_a_folder_of_that_name(tmp_path, monkeypatch):
    """`gen small small` then `save small T` saved the folder, not the profile; `./small` names the folder."""
    monkeypatch.chdir(tmp_path)
    r = run_cli("gen", "small", "small", "--scale", "0.01", "--format", "safetensors")
    assert r.rc == 0, r.err
    profile = save_json("small", tmp_path / "p", "--scale", SCALE, "--count", "1", "--results", "")
    elsewhere = tmp_path / "away"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # no folder named small here: the profile, for certain
    alone = save_json("small", tmp_path / "q", "--scale", SCALE, "--count", "1", "--results", "")
    assert profile["bytes"] == alone["bytes"]
    monkeypatch.chdir(tmp_path)
    folder = save_json("./small", tmp_path / "f", "--count", "1", "--results", "")
    assert folder["bytes"] != profile["bytes"]  # the folder's own state (generated at another scale)
