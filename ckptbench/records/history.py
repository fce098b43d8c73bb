"""Runs recorded in results.csv, one summary per run id, oldest first."""

from __future__ import annotations

import os

from ckptbench.records.compare import (COMPLETED, EFFICIENCY_OF, efficiency_of, held_s, measured, rates_known,
                                       run_documents, save_option, saw_no_read, steady)
from ckptbench.records.recorder import life, unended
from ckptbench.records.results import KINDS, read_documents, read_rows
from ckptbench.core.stats import spread

# the one time each kind is known by: a restore's (and a watched or distributed one's) RTO, a save's until durable
FIGURE_OF = {"save": "durable_s"}


def runs(path: str) -> list[dict]:
    """One summary per run id; `where` says which checkpoint it read, or for a save what it wrote where."""
    if not os.path.exists(path):
        return []
    grouped: dict[str, list[dict]] = {}
    for row in read_rows(path):
        grouped.setdefault(row["run_id"], []).append(row)
    every = read_documents(path)
    docs = run_documents(path, every)  # as compare reads them: a run_id that is not text names no run
    lives = unended(every, docs)
    for run_id in lives.keys() - grouped.keys():  # killed before its first repeat ended: it ran all the same
        grouped[run_id] = []
    out = []
    for run_id, rows in grouped.items():
        if not rows:
            out.append(_begun(lives[run_id]))
            continue
        done = [r for r in rows if r["status"] in COMPLETED]
        ok = rates_known(steady(done) if done else done, docs)  # a save's sustained figures: its saves after the
        # first, as compare's
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
            # a save's source is the state it wrote ("small"); where it wrote is what tells two save runs apart
            "target": (rows[0].get("target") or None) if kind == "save" else None,
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
            "median_of": len(ok),  # the repeats (saves) figure_s is over: of one, it is that one's, no median
            "held_s": held if held is not None and held != figure_s else None,
            "steady": first_left_out,  # the first save left out (not a watch left with no time: it timed none)
            "efficiency": efficiency_of(docs.get(run_id)) if kind in EFFICIENCY_OF else None,
            "floor_s": _floor_s(docs.get(run_id)) if kind in EFFICIENCY_OF else None,
            # a --no-fsync save and a durable one were two alike "sync" lines, 0.052 s and 0.173 s
            "fsync": save_option(docs.get(run_id), "fsync") if kind == "save" else None,
            "status": statuses.pop() if len(statuses) == 1 else "mixed",
            "unseen": bool(done) and not ok,  # a watch of a job seen to read no checkpoint file
        } | life(lives.get(run_id), len(done)))
    return sorted(out, key=lambda r: r["date"]) if any(not rows for rows in grouped.values()) else out


def _floor_s(doc: dict | None) -> float | None:
    """The floor a run's efficiency is over, where it gave one."""
    return measured("floor_s", doc.get("floor_s")) if efficiency_of(doc) is not None else None


def _begun(started: dict) -> dict:
    """A run started on record with no repeat or save ended: its line, with nothing measured."""
    kind = started.get("kind") if started.get("kind") in KINDS else "restore"
    text = {k: started.get(k) if isinstance(started.get(k), str) else "" for k in ("date", "source", "mode", "cache")}
    target = started.get("target") if kind == "save" and isinstance(started.get("target"), str) else None
    return {"run_id": started["run_id"], "kind": kind, **text, "target": target or None, "repeats": 0,
            "cancelled": 0, "rto_s": None, "read_gbps": None, "figure": FIGURE_OF.get(kind, "rto_s"), "figure_s": None,
            "median_of": 0, "held_s": None, "steady": False, "efficiency": None, "floor_s": None, "fsync": None,
            "status": "unended", "unseen": False} | life(started, 0)


def where(r: dict) -> str:
    """What a run's line names: its source, or for a save the state it wrote and the folder it wrote it to."""
    return f"{r['source']} → {r['target']}" if r.get("target") else r["source"]
