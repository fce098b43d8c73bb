"""A floor of fixed rates for the model's and the checklist's arithmetic (no measurement, no cache)."""

from __future__ import annotations

import time

from ckptbench.system import floor as fl


def fixed_floor(**gbps) -> fl.Floor:
    """A 2-core box's floor with these ceilings in GB/s, measured a minute ago; `storage` is a full-size sample."""
    now = time.time()
    f = fl.Floor({"cores": 2})
    for k, v in gbps.items():
        c = fl.Ceiling(v, v, v, f"fixed {k}", now - 60)
        if k == "storage":
            c.sample_bytes = fl.STORAGE_SAMPLE
            f.storage = c
        else:
            f.ceilings[k] = c
    return f


def held_s(doc: dict) -> float:
    """The time a run document's efficiency holds to its floor, worked out from its repeats: each RTO less its first
    step where the check ran the model (compute no ceiling measures), the median over the repeats that finished."""
    import statistics

    step = doc.get("check") == "model step"
    return statistics.median(r["rto_s"] - (r["stages"]["check"] if step else 0.0)
                             for r in doc["repeats"] if r.get("status", "ok") in ("ok", "verified", "unverified"))


def edit_cache(change) -> None:
    """The floor cache in the test's own XDG_CACHE_HOME, `change(doc)` applied to it in place, written back: what a
    hand (or another tool that can write the user's cache) could leave there."""
    import json

    with open(fl.cache_path()) as f:
        doc = json.load(f)
    change(doc)
    with open(fl.cache_path(), "w") as f:
        json.dump(doc, f)
