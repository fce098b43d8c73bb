"""Distributed restores on record: the run documents of kind `dist` in a results file's .jsonl, and one rank's
read rate over time from the byte counts it sampled while reading (its `timeline`)."""

from __future__ import annotations

import os

from ckptbench.core.errors import CkptbenchError
from ckptbench.records.results import jsonl_path, read_documents, recorded_text


_NUM = (int, float)
# what the history and ranks screens read of a run, a repeat and a rank: None is allowed where a field is optional
_RUN = {"run_id": str, "world_size": int, "nodes": int, "source": str, "format": str, "backend": str,
        "each_rank": str, "status": str, "repeats": list}
_RUN_OPT = {"options": dict, "amplification": _NUM, "problems": list, "dcp_reader": dict, "rto_stats": dict,
            "aggregate_gbps_stats": dict, "skew_stats": dict}
_REPEAT = {"status": str, "ranks": list}
_REPEAT_OPT = {"problems": list, "aggregate_gbps": _NUM, "rto_s": _NUM, "skew_s": _NUM, "slowest_rank": int}
_RANK = {"rank": int, "host": str, "local_rank": int, "status": str, "bytes_read": int, "requests": int}
_RANK_OPT = {"bytes_needed": int, "read_gbps": _NUM, "end_s": _NUM, "read_start_s": _NUM, "error": str,
             "stages": dict, "timeline": list}


def _is(v, kind) -> bool:
    return isinstance(v, kind) and not isinstance(v, bool)


def _fields(d, where: str, required: dict, optional: dict) -> str | None:
    if not isinstance(d, dict):
        return f"{where} is not an object"
    for k, kind in required.items():
        if not _is(d.get(k), kind):
            return f"{where}.{k} is {str(d.get(k))[:40]!r}"
    for k, kind in optional.items():
        if d.get(k) is not None and not _is(d[k], kind):
            return f"{where}.{k} is {str(d[k])[:40]!r}"
    return None


def _malformed(doc: dict) -> str | None:
    """The first field the screens read that a distributed run document lacks or holds as the wrong type."""
    bad = _fields(doc, "run", _RUN, _RUN_OPT)
    for k in ("rto_stats", "aggregate_gbps_stats", "skew_stats", "dcp_reader"):
        if bad is None and doc.get(k) is not None:
            bad = next((f"run.{k}.{f} is {str(v)[:40]!r}" for f, v in doc[k].items()
                        if v is not None and not _is(v, _NUM)), None)
    for i, rep in enumerate(doc["repeats"] if bad is None else ()):
        bad = bad or _fields(rep, f"repeats[{i}]", _REPEAT, _REPEAT_OPT)
        for j, rank in enumerate(rep["ranks"] if bad is None else ()):
            bad = bad or _fields(rank, f"repeats[{i}].ranks[{j}]", _RANK, _RANK_OPT)
            if bad is None and not all(isinstance(p, list) and len(p) == 2 and all(_is(x, _NUM) for x in p)
                                       for p in rank.get("timeline") or ()):
                bad = f"repeats[{i}].ranks[{j}].timeline is not a list of [seconds, bytes]"
    return bad


def dist_runs(path: str) -> list[dict]:
    """The distributed run documents beside results file `path`, oldest first ([] when there are none); one line
    for a document the screens could not show (a foreign or hand-edited .jsonl)."""
    runs = [d for d in read_documents(path, "run") if d.get("kind") == "dist"]
    for doc in runs:
        bad = _malformed(doc)
        if bad:
            raise CkptbenchError(f"{recorded_text(jsonl_path(path))}: a distributed run document is malformed "
                                 f"({recorded_text(bad)}); repair or move the file")
    return runs


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
