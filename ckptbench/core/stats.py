"""Repeat statistics: a figure is its median with min and max, never a single run."""

from __future__ import annotations

import statistics


def spread(values: list[float]) -> dict[str, float]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}
