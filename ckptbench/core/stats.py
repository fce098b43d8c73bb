"""Repeat statistics: a figure is its median with min and max, never a single run."""

from __future__ import annotations

import statistics


def spread(values: list[float]) -> dict[str, float]:
    vals = [v for v in values if v is not None]
    if not vals:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(vals), "min": min(vals), "max": max(vals), "n": len(vals)}


def sustained_rate(nbytes: list, durable_s: list) -> float | None:
    """The one sustained durable throughput: the saves' bytes over their median time until durable, in GB/s (as
    compare, history and the efficiency take the median time; the median of the rates differs from it for an even
    count: 0.341 against 0.284 GB/s for two saves). None when no time is known."""
    times = [t for t in durable_s if t is not None]
    sizes = [b for b in nbytes if b is not None]
    if not times or not sizes:
        return None
    median = spread(times)["median"]
    return spread(sizes)["median"] / median / 1e9 if median > 0 else None
