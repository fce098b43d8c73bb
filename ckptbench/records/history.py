"""Runs recorded in results.csv, one summary per run id, oldest first."""

from __future__ import annotations

import os

from ckptbench.records.compare import (COMPLETED, EFFICIENCY_OF, efficiency_of, held_s, measured, run_documents,
                                       saw_no_read, steady)
from ckptbench.records.results import read_rows
from ckptbench.core.stats import spread

# the one time each kind is known by: a restore's (and a watched or distributed one's) RTO, a save's until durable
FIGURE_OF = {"save": "durable_s"}


def runs(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    grouped: dict[str, list[dict]] = {}
    for row in read_rows(path):
        grouped.setdefault(row["run_id"], []).append(row)
    docs = run_documents(path)  # as compare reads them: a run_id that is not text names no run
    out = []
    for run_id, rows in grouped.items():
        done = [r for r in rows if r["status"] in COMPLETED]
        ok = steady(done) if done else done  # a save's sustained figures are its saves after the first, as compare's
        first_left_out = len(ok) < len(done)
        statuses = {r["status"] for r in rows}
        kind = rows[0].get("kind") or "restore"
        if ok and all(saw_no_read(r) for r in ok):  # no restore timed (older records gave it an RTO of 0 s)
            ok = []
        figure = FIGURE_OF.get(kind, "rto_s")
        # a figure no run can have measured (compare refuses it) is unknown here, not a 300-digit time
        figure_s = spread([measured(figure, r.get(figure)) for r in ok])["median"] if ok else None
        # the time its efficiency is over, where it is not figure_s: the RTO less the model's first step
        held = spread(held_s(docs.get(run_id) or {}, ok, figure))["median"] if ok else None
        out.append({
            "run_id": run_id, "kind": kind, "date": rows[0]["timestamp"], "source": rows[0]["source"],
            "mode": rows[0]["mode"], "cache": rows[0]["cache"],
            # a repeat cancelled midway is no repeat: said apart (a new user's 3 repeats read 4 after a Ctrl-C)
            "repeats": sum(1 for r in rows if r["status"] != "cancelled"),
            "cancelled": sum(1 for r in rows if r["status"] == "cancelled"),
            "rto_s": spread([measured("rto_s", r["rto_s"]) for r in ok])["median"] if ok else None,
            # a distributed run's rate is its ranks' aggregate (schema 3 keeps read_gbps for one process's clock)
            "read_gbps": spread([measured("read_gbps", r.get("aggregate_gbps") if r.get("kind") == "dist" and
                                          r.get("aggregate_gbps") is not None else r["read_gbps"])
                                 for r in ok])["median"] if ok else None,
            "figure": figure,
            "figure_s": figure_s,
            "held_s": held if held is not None and held != figure_s else None,
            "steady": first_left_out,  # the first save left out (not a watch left with no time: it timed none)
            "efficiency": efficiency_of(docs.get(run_id)) if kind in EFFICIENCY_OF else None,
            "status": statuses.pop() if len(statuses) == 1 else "mixed",
            "unseen": bool(done) and not ok,  # a watch of a job seen to read no checkpoint file
        })
    return out
