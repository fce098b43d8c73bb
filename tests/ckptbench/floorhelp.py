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
