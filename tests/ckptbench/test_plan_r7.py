"""plan --results, new-user round 7: a restore on other storage is named by what it read, not as if it read the
plan's storage; a save measured on a checkpoint of another size is said to be one, and gives no verdict on an
interval when the sizes are far apart."""

from __future__ import annotations

from clirun import run_cli

from ckptbench.plan import scale as plan_scale
from ckptbench.records import results
from ckptbench.system import storage


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
