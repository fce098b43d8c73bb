"""Distributed restores on record: the run documents of kind `dist` in a results file's .jsonl, and one rank's
read rate over time from the byte counts it sampled while reading (its `timeline`)."""

from __future__ import annotations

import os

from ckptbench.errors import CkptbenchError
from ckptbench.results import jsonl_path, read_documents, recorded_text


def dist_runs(path: str) -> list[dict]:
    """The distributed run documents beside results file `path`, oldest first ([] when there are none)."""
    return [d for d in read_documents(path, "run") if d.get("kind") == "dist"]


def newest_dist_run(path: str) -> dict:
    """The last distributed run recorded beside `path`; one clear error when there is none."""
    runs = dist_runs(path)
    if runs:
        return runs[-1]
    where = recorded_text(jsonl_path(path))
    why = "no such file" if not os.path.exists(jsonl_path(path)) else "no distributed run recorded in it"
    raise CkptbenchError(f"{where}: {why}; record one with `torchrun ... -m ckptbench run SOURCE --distributed "
                         f"--results {recorded_text(path)}`")


def read_rates(rank: dict) -> list[tuple[float, float, float]]:
    """(from_s, to_s, GB/s) between the rank's successive timeline samples, from its read start (0 bytes then);
    [] when it sampled nothing."""
    points = [(float(t), int(b)) for t, b in rank.get("timeline") or []]
    start = rank.get("read_start_s")
    if points and start is not None and start < points[0][0]:
        points.insert(0, (float(start), 0))
    return [(t0, t1, (b1 - b0) / (t1 - t0) / 1e9)
            for (t0, b0), (t1, b1) in zip(points, points[1:]) if t1 > t0]
