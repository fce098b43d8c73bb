"""New-user pass 15, the checklist: `check` reads the headers as `inspect` and `run` do, so a checkpoint a restore
refuses (a truncated shard, random bytes under a checkpoint's name) is a failing item and exit 1, and a directory with
no checkpoint is run's one-line error (exit 2); the efficiency item gives no concurrency advice for a checkpoint that
cannot be restored, and no verdict on a floor under 10 ms, where `run` says the efficiency says little.

Checkpoints are written by safetensors, torch and `ckptbench gen`; the floor is planted in the test's own cache."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from clirun import assert_one_line_error, run_cli
from safetensors.torch import save_file

from ckptbench.checklist import efficiency as eff
from ckptbench.checklist import facts as facts_mod
from ckptbench.checklist.rules import evaluate
from ckptbench.restore.sweep import advice
from ckptbench.system import floor as fl
from floorhelp import fixed_floor


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, str]:
    """Checkpoints that load (safetensors, torch) and ones a restore refuses, each in its own directory."""
    root = tmp_path_factory.mktemp("nu15")
    out = {name: str(root / name) for name in ("st", "pt", "trunc", "rnd_st", "rnd_pt", "none")}
    for d in out.values():
        os.mkdir(d)
    g = torch.Generator().manual_seed(0)
    for i in range(2):
        save_file({f"layer{i}.w": torch.randn(256, 256, generator=g), f"layer{i}.b": torch.randn(256, generator=g)},
                  os.path.join(out["st"], f"model-{i + 1:05d}-of-00002.safetensors"))
    torch.save({"w": torch.randn(64, 64, generator=g)}, os.path.join(out["pt"], "model.pt"))
    shutil.copytree(out["st"], out["trunc"], dirs_exist_ok=True)
    shard = os.path.join(out["trunc"], "model-00002-of-00002.safetensors")
    os.truncate(shard, os.path.getsize(shard) // 2)
    for name, file in (("rnd_st", "model.safetensors"), ("rnd_pt", "model.pt")):
        with open(os.path.join(out[name], file), "wb") as f:
            f.write(os.urandom(64 << 10))
    for file in ("train.py", "loss.csv"):  # a directory that is not a checkpoint
        with open(os.path.join(out["none"], file), "w") as f:
            f.write("step,loss\n1,2.0\n")
    return out


def _items(r) -> dict[str, dict]:
    return {i["id"]: i for i in json.loads(r.out)["items"]}


def _error_line(r) -> str:
    assert r.rc == 2 and len(r.err_lines) == 1, r.err
    return r.err_lines[0].removeprefix("ckptbench: error: ")


@pytest.mark.parametrize("name", ["trunc", "rnd_st", "rnd_pt"])
def test_check_fails_what_run_refuses_with_runs_error_line(made, name):
    refused = _error_line(run_cli("inspect", made[name]))  # the headers' error, as a restore meets it
    assert "Traceback" not in refused
    r = run_cli("check", made[name], "--json", "--results", "")
    assert r.rc == 1, r.err
    doc = json.loads(r.out)
    assert doc["ok"] is False and doc["items"][0]["id"] == "loads"
    loads = doc["items"][0]
    assert loads["verdict"] == "fail" and loads["evidence"]["error"] == refused
    assert f"`ckptbench inspect {made[name]}`" in loads["fix"]
    effi = _items(r)["efficiency"]  # nothing to restore: no floor held against it, no concurrency advised
    assert effi["verdict"] == "unknown" and "does not load" in effi["fix"] and "--concurrency" not in effi["fix"]


def test_the_truncated_shard_is_the_one_run_refuses(made):
    run = run_cli("run", made["trunc"], "--repeat", "1", "--results", "")
    assert "model-00002-of-00002.safetensors" in _error_line(run) and "truncated" in _error_line(run)
    loads = _items(run_cli("check", made["trunc"], "--json", "--results", ""))["loads"]
    assert loads["evidence"]["error"] == _error_line(run)


def test_check_of_a_directory_with_no_checkpoint_is_runs_one_line_error(made):
    run = run_cli("run", made["none"], "--repeat", "1", "--results", "")
    assert_one_line_error(run, "no safetensors, torch or torch.distributed.checkpoint files found")
    check = run_cli("check", made["none"], "--results", "")
    assert_one_line_error(check, made["none"])
    assert check.err_lines == run.err_lines


@pytest.mark.parametrize("name, tensors", [("st", 4), ("pt", 1)])
def test_a_checkpoint_that_loads_is_ok_with_what_its_headers_hold(made, name, tensors, monkeypatch):
    monkeypatch.setattr(facts_mod, "SAMPLE_S", 0.0)
    items = {i.id: i for i in evaluate(facts_mod.gather(made[name], probe_cache=False))}
    loads = items["loads"]
    assert loads.verdict == "ok" and loads.fix == "none"
    assert loads.evidence["tensors"] == tensors
    assert loads.evidence["format"] == ("safetensors" if name == "st" else "torch")


def test_a_floor_under_fixed_costs_gets_no_verdict_only_runs_note():
    floor = fixed_floor(storage=2.0, populate_4k=4.0, populate_thp=4.0, copy=8.0, hash_crc32c=8.0, scan=8.0)
    tiny = eff.RestoreProbe(5 << 20, 4, 0.02, "crc32c", "direct", 8, True, 0.0)  # 5 MiB: a floor of about 3 ms
    it = eff.judge(eff.FloorFacts(floor, tiny), advice(None, None))
    assert it.evidence["floor_s"] < fl.FIXED_COSTS_S and it.evidence["efficiency"] < eff.GOOD
    assert it.verdict == "unknown" and it.evidence["reason"] == eff.TOO_SMALL and "--concurrency" not in it.fix
    big = eff.RestoreProbe(64 << 20, 4, 0.2, "crc32c", "direct", 8, True, 0.0)  # 64 MiB: about 34 ms, judged
    assert eff.judge(eff.FloorFacts(floor, big), advice(None, None)).verdict == "warn"


def test_check_and_run_say_the_same_about_a_tiny_checkpoint(tmp_path, plant_floor):
    src = tmp_path / "tiny"
    r = run_cli("gen", "small", src, "--scale", "0.02")
    assert r.rc == 0, r.err
    plant_floor(1000.0, source=src, storage_gbps=1000.0)  # a floor of microseconds: any restore reads far below it
    effi = _items(run_cli("check", src, "--json", "--results", ""))["efficiency"]
    assert effi["evidence"]["floor_cached"] is True and effi["evidence"]["efficiency"] < eff.GOOD
    assert effi["verdict"] == "unknown" and effi["evidence"]["reason"] == eff.TOO_SMALL
    assert "--concurrency" not in effi["fix"]
    run = run_cli("run", src, "--repeat", "1", "--results", "", "--json")
    assert run.rc == 0, run.err
    assert eff.TOO_SMALL in json.loads(run.out)["floor_note"]  # the very words run's note says
