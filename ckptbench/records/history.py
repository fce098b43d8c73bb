"""Runs recorded in results.csv, one summary per run id, oldest first."""

from __future__ import annotations

import os

from ckptbench.records.compare import COMPLETED
from ckptbench.records.results import read_rows
from ckptbench.core.stats import spread


def runs(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    grouped: dict[str, list[dict]] = {}
    for row in read_rows(path):
        grouped.setdefault(row["run_id"], []).append(row)
    out = []
    for run_id, rows in grouped.items():
        ok = [r for r in rows if r["status"] in COMPLETED]
        statuses = {r["status"] for r in rows}
        out.append({
            "run_id": run_id, "date": rows[0]["timestamp"], "source": rows[0]["source"], "mode": rows[0]["mode"],
            "cache": rows[0]["cache"], "repeats": len(rows),
            "rto_s": spread([r["rto_s"] for r in ok])["median"] if ok else None,
            # a distributed run's rate is its ranks' aggregate (schema 3 keeps read_gbps for one process's clock)
            "read_gbps": spread([r.get("aggregate_gbps") if r.get("kind") == "dist" and r.get("aggregate_gbps")
                                 is not None else r["read_gbps"] for r in ok])["median"] if ok else None,
            "status": statuses.pop() if len(statuses) == 1 else "mixed",
        })
    return out
