"""What the ninth new-user pass found.

`plan --nodes` took an as-is restore of files already in the page cache (residency 100 %, the run just after
another read them) as the per-rank read rate MEASURED from storage: only a hot run was passed over."""

from __future__ import annotations

import pytest

from ckptbench.plan import scale as plan_scale
from ckptbench.records import results


def _row(run_id, read_gbps, **extra) -> dict:
    return {"schema": results.SCHEMA, "kind": "restore", "run_id": run_id, "repeat": 1, "timestamp": f"t-{run_id}",
            "source": f"/ckpt/{run_id}", "status": "ok", "cache": "cold", "read_gbps": read_gbps,
            "residency_before": 0.0, "env": {}} | extra


def test_plan_passes_over_an_as_is_restore_read_from_the_page_cache(tmp_path):
    csv = str(tmp_path / "results.csv")
    results.append(csv, [_row("cold1", 0.5)])
    results.append(csv, [_row("asis_cached", 2.1, cache="as-is", residency_before=1.0)])
    m = plan_scale.measured_rank_read(csv)
    assert m["run_id"] == "cold1" and m["gbps"] == pytest.approx(0.5)
    results.append(csv, [_row("asis_cold", 0.7, cache="as-is", residency_before=0.01)])
    assert plan_scale.measured_rank_read(csv)["run_id"] == "asis_cold"  # as found, but found on the device
