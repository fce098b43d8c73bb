"""plan --results, new-user round 7: a restore on other storage is named by what it read, not as if it read the
plan's storage; a save measured on a checkpoint of another size is said to be one, and gives no verdict on an
interval when the sizes are far apart."""

from __future__ import annotations

import json

from clirun import run_cli

from ckptbench.checkpoint import profiles
from ckptbench.plan import scale as plan_scale
from ckptbench.plan.shape import plan
from ckptbench.records import results
from ckptbench.system import storage

MiB = 1 << 20


def _restore_row(fs: str) -> dict:
    return {"schema": results.SCHEMA, "kind": "restore", "run_id": "r-ext4", "repeat": 1, "timestamp": "t1",
            "source": "/ckpt/local", "status": "ok", "cache": "cold", "read_gbps": 1.2, "env": {"source_fs": fs}}


def test_a_run_on_ext4_is_said_to_have_read_ext4_not_the_plans_storage(tmp_path):
    csv = str(tmp_path / "results.csv")
    results.append(csv, [_restore_row("ext4")])
    efs = storage.load("efs")
    measured, why = plan_scale.rank_read_on(csv, efs)
    assert measured is None
    assert "read ext4, not efs (nfs, nfs4)" in why, why
    assert "read other storage" not in why and "this plan is for" in why, why
    r = run_cli("plan", "7b", "--nodes", "2", "--storage", "efs", "--results", csv)
    assert r.rc == 0, r.err
    assert "read ext4, not efs (nfs, nfs4)" in r.out, r.out


def test_a_run_whose_storage_was_not_recorded_says_so(tmp_path):
    csv = str(tmp_path / "results.csv")
    results.append(csv, [_restore_row("") | {"env": {}}])
    _, why = plan_scale.rank_read_on(csv, storage.load("efs"))
    assert "storage it did not record" in why and "not efs (nfs, nfs4)" in why, why


def _save_rows(path, nbytes: int, gbps: float = 0.5) -> None:
    env = {"date": "2024-01-01T00:00:00"}
    results.append(str(path), [{"schema": results.SCHEMA, "kind": "save", "run_id": "s1", "repeat": i + 1,
                                "timestamp": env["date"], "source": "trainer", "format": "safetensors",
                                "mode": "sync", "status": "ok", "target": "/t", "bytes": nbytes,
                                "durable_s": nbytes / (gbps * 1e9), "write_gbps": gbps, "env": env}
                               for i in range(3)])


def _small_bytes() -> int:
    return plan(profiles.load("small"), 600)["total_bytes"]


def test_a_save_of_a_far_smaller_checkpoint_gives_no_verdict(tmp_path):
    """39 MiB measured, 283 MiB planned: the rate of the small save was applied silently, with a verdict."""
    path = tmp_path / "R.csv"
    _save_rows(path, 39 * MiB)
    r = run_cli("plan", "small", "--interval", "600", "--results", path, "--json")
    assert r.rc == 0, r.err
    m = json.loads(r.out)["save"]["measured"]
    assert m["bytes"] == 39 * MiB and m["planned_bytes"] == _small_bytes()
    assert m["meets_interval"] is None and "39.0 MiB" in m["size_mismatch"], m
    r = run_cli("plan", "small", "--interval", "600", "--results", path)
    assert r.rc == 0, r.err
    text = " ".join(r.out.split())
    assert ": met" not in text and "NOT met" not in text, text
    assert "measured on a 39.0 MiB save" in text and "this plan is for" in text, text
    assert "small saves run below the throughput large ones reach" in text, text
    assert "no verdict" in text, text


def test_a_save_of_about_the_same_size_gives_a_verdict_and_says_both_sizes(tmp_path):
    path = tmp_path / "R.csv"
    _save_rows(path, int(_small_bytes() * 0.9))
    r = run_cli("plan", "small", "--interval", "600", "--results", path, "--json")
    assert r.rc == 0, r.err
    m = json.loads(r.out)["save"]["measured"]
    assert m["meets_interval"] is True and "size_mismatch" not in m
    r = run_cli("plan", "small", "--interval", "600", "--results", path)
    assert ": met" in r.out and "measured on a " in r.out, r.out
