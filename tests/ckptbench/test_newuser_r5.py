"""From a new user's pass (round 5): `check` read every byte of a checkpoint with a flipped byte, hashed it as its
manifest does, and passed it (exit 0, "Checkpoint loads: ok", an efficiency for a restore `run` fails); a watch that
saw no checkpoint read was recorded with an RTO of 0.000 s and no source, shown so by `history`, and told to
`compare` though compare passes over it."""

from __future__ import annotations

import json
import os
import sys

import pytest

from clirun import run_cli


@pytest.fixture(scope="module")
def flipped(tmp_path_factory) -> tuple[str, str]:
    """A generated checkpoint, and a copy of it with one byte of its largest shard flipped: (clean, flipped)."""
    import shutil

    root = tmp_path_factory.mktemp("nu_r5")
    clean, bad = str(root / "clean"), str(root / "bad")
    r = run_cli("gen", "small", clean, "--scale", "0.02")
    assert r.rc == 0, r.err
    shutil.copytree(clean, bad)
    shard = max((os.path.join(bad, n) for n in os.listdir(bad) if n.endswith(".safetensors")), key=os.path.getsize)
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) - 100)  # in the tensors' bytes, not the header: the headers still parse
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 1]))
    return clean, bad


def _items(r) -> dict[str, dict]:
    return {i["id"]: i for i in json.loads(r.out)["items"]}


def test_check_fails_a_checkpoint_whose_bytes_do_not_match_its_manifest(flipped, plant_floor):
    clean, bad = flipped
    plant_floor(4.0, source=bad, storage_gbps=4.0)
    run = run_cli("run", bad, "--repeat", "1", "--results", "")
    assert run.rc == 1 and "manifest says" in run.out + run.err  # the restore refuses it
    r = run_cli("check", bad, "--json", "--results", "")
    assert r.rc == 1, r.out
    loads = _items(r)["loads"]
    assert loads["verdict"] == "fail"
    (problem,) = loads["evidence"]["digest_mismatch"]
    assert "manifest says" in problem and ".safetensors" in problem
    assert f"ckptbench verify {bad}" in loads["fix"]
    effi = _items(r)["efficiency"]  # no efficiency for a restore that would fail
    assert effi["verdict"] == "unknown" and "efficiency" not in effi["evidence"] and "--concurrency" not in effi["fix"]


def test_check_of_a_clean_checkpoint_says_how_many_digests_it_matched(flipped, plant_floor):
    clean, _ = flipped
    plant_floor(4.0, source=clean, storage_gbps=4.0)
    r = run_cli("check", clean, "--json", "--results", "")
    assert r.rc == 0, r.out
    loads = _items(r)["loads"]
    assert loads["verdict"] == "ok"
    manifest = json.load(open(os.path.join(clean, "ckptbench.json")))
    assert loads["evidence"]["digests_matched"] == len(manifest["files"])


# watch: a job that read no checkpoint file measured no restore

@pytest.fixture(scope="module")
def idle_watch(flipped, tmp_path_factory) -> tuple[str, str, object]:
    clean, _ = flipped
    results = str(tmp_path_factory.mktemp("nu_r5_watch") / "results.csv")
    r = run_cli("watch", "--no-verdict", "--interval", "0.05", "--source", clean, "--results", results, "--",
                sys.executable, "-c", "import time; time.sleep(0.3)")
    assert r.rc == 0, r.err
    return clean, results, r


def test_a_watch_that_saw_no_checkpoint_read_is_no_zero_second_restore(idle_watch):
    clean, results, _ = idle_watch
    from ckptbench.records.results import read_rows

    (row,) = read_rows(results)
    assert row["rto_s"] is None and row["read_s"] is None and row["read_gbps"] is None
    assert row["source"] == clean  # the checkpoint the user named
    line = run_cli("history", results)
    assert line.rc == 0, line.err
    assert "0.000 s" not in line.out and "no checkpoint read seen" in line.out and clean in line.out
    (doc,) = json.loads(run_cli("history", results, "--json").out)["runs"]
    assert doc["rto_s"] is None and doc["figure_s"] is None


def test_a_watch_that_saw_no_checkpoint_read_is_not_offered_to_compare(idle_watch):
    _, results, r = idle_watch
    recorded = [ln for ln in r.out.splitlines() if ln.startswith("recorded:")]
    assert len(recorded) == 1 and "compare" in recorded[0] and "passes over it" in recorded[0]


# inspect: the check it describes is the one the run does

def test_inspect_of_weights_alone_promises_no_optimizer_check(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.randn(16, 16), "b": torch.randn(16)}, str(tmp_path / "model.safetensors"))
    r = run_cli("inspect", tmp_path)
    assert r.rc == 0, r.err
    (check,) = [ln for ln in r.out.splitlines() if ln.startswith("check:")]
    assert "optimizer" not in check and "NaN/Inf" in check


def test_inspect_of_weights_and_optimizer_says_both_are_checked(tmp_path):
    import torch

    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict()}, tmp_path / "ckpt.pt")
    r = run_cli("inspect", tmp_path)
    assert r.rc == 0, r.err
    (check,) = [ln for ln in r.out.splitlines() if ln.startswith("check:")]
    assert "optimizer parts are checked against their weights" in check


# sysinfo: the live Dirty figure is not the vm.dirty_bytes setting

def test_sysinfo_text_says_dirty_and_writeback_are_live_figures_not_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run_cli("sysinfo")
    assert r.rc == 0, r.err
    (dirty,) = [ln for ln in r.out.splitlines() if ln.startswith("dirty_bytes")]
    (wb,) = [ln for ln in r.out.splitlines() if ln.startswith("writeback_bytes")]
    assert "Dirty in /proc/meminfo now" in dirty and "not vm.dirty_bytes" in dirty
    assert "Writeback in /proc/meminfo now" in wb


def test_compare_says_why_a_watch_that_saw_no_checkpoint_read_is_not_compared(idle_watch):
    from ckptbench.records.results import read_rows

    _, results, _ = idle_watch
    (row,) = read_rows(results)
    for args in (("--newest", row["run_id"]), ("--baseline", row["run_id"])):
        r = run_cli("compare", results, *args)
        assert r.rc == 2 and len(r.err_lines) == 1, r.err
        assert row["run_id"] in r.err and "saw no checkpoint read" in r.err and "no successful run" not in r.err
    r = run_cli("compare", results)  # one run on record, which measured nothing: not "1 successful run"
    assert r.rc == 2 and "0 successful run(s)" in r.err and "1 watch that saw no checkpoint read" in r.err, r.err


# save: Ctrl-C after some saves finished says what was kept and where

def test_ctrl_c_to_save_says_which_saves_finished_and_the_run_they_are_on_record_as(tmp_path):
    import signal
    import subprocess
    import time

    from ckptbench.records.results import read_rows

    results, target = str(tmp_path / "r.csv"), tmp_path / "target"
    count = 100000  # never all done: stopped midway
    proc = subprocess.Popen([sys.executable, "-m", "ckptbench", "save", "small", str(target), "--scale", "0.02",
                             "--count", str(count), "--keep", "1", "--results", results],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if any(n.startswith("step-") and n[5:].isdigit() and int(n[5:]) >= 3
                   for n in (os.listdir(target) if target.is_dir() else ())):
                break  # two saves finished (the newest one kept)
            time.sleep(0.1)
        else:
            raise AssertionError("no two saves finished in 120 s")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    finished = [r for r in read_rows(results) if r["status"] == "ok"]
    run_id = finished[0]["run_id"]
    last = [ln for ln in err.splitlines() if ln.strip() and not ln.startswith("\r")][-1]
    assert last.startswith(f"ckptbench: interrupted during save {len(finished) + 1} of {count}: "), err
    assert f"{len(finished)} save(s) finished" in last and run_id in last and results in last, last
