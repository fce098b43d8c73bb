"""Rank 0's view of a distributed restore: the ranks' reports combined into one result, and on record.

Each rank's clock starts when the start barrier releases it, so every rank starts at 0: the restore's RTO is the
last rank's end; the aggregate read rate (`aggregate_gbps`; `read_gbps` is one rank's bytes over its own read stage)
is all ranks' bytes over the span from the first read start to the last read end; skew is last done minus first done.
Read amplification is bytes read by all ranks over the unique bytes they needed (the union of their byte ranges): 1.0
when no byte is read twice.
"""

from __future__ import annotations

from ckptbench.records.results import (RESTORE_SETTINGS, append, append_document, document, row,
                                         settings_of)
from ckptbench.core.stages import STAGES
from ckptbench.core.stats import spread


def _union_bytes(reports: list[dict]) -> int:
    per_file: dict[str, list[tuple[int, int]]] = {}
    for r in reports:
        for rel, ivs in r["intervals"].items():
            per_file.setdefault(rel, []).extend(tuple(iv) for iv in ivs)
    total = 0
    for ivs in per_file.values():
        end = -1
        for a, b in sorted(ivs):
            if b > end:
                total += b - max(a, end)
                end = b
    return total


def combine(reports: list[dict]) -> dict:
    """One repeat: the ranks' reports (rank order) as the repeat's figures."""
    ok = [r for r in reports if r["status"] == "ok"]
    failed = [r for r in reports if r["status"] != "ok"]
    bytes_read = sum(r["bytes_read"] for r in reports)
    unique = _union_bytes(reports)
    doc = {"status": "ok" if not failed else "failed",
           "problems": [f"rank {r['rank']} ({r['host']}): {r['error']}" for r in failed],
           "bytes_read": bytes_read, "unique_bytes": unique, "index_bytes": sum(r["index_bytes"] for r in reports),
           "amplification": bytes_read / unique if unique else None,
           # verified only when every rank matched every file it read against a reference digest
           "verified": bool(reports) and all(r.get("verified") for r in reports),
           "ranks": [{k: v for k, v in r.items() if k != "intervals"} for r in reports]}
    nodes = [r["cache"] for r in reports if r.get("cache") and "residency_before" in r["cache"]]
    if nodes:  # one rank per node set the page cache for the node and measured it held
        doc["cache"] = {"residency_before": max(c["residency_before"] for c in nodes),
                        # the least resident node too: a hot condition holds where every node is at least so
                        "residency_before_min": min(c["residency_before"] for c in nodes),
                        "verified": all(c["cache_verified"] for c in nodes),
                        "notes": sorted({c["note"] for c in nodes if c.get("note")})}
    if not ok or failed:
        return doc
    ends = [r["end_s"] for r in reports]
    slow = max(reports, key=lambda r: r["end_s"])
    span = max(r["read_end_s"] for r in reports) - min(r["read_start_s"] for r in reports)
    doc.update({"rto_s": max(ends), "first_done_s": min(ends), "last_done_s": max(ends),
                "skew_s": max(ends) - min(ends), "slowest_rank": slow["rank"], "slowest_stages": slow["stages"],
                "read_span_s": span, "aggregate_gbps": bytes_read / span / 1e9 if span > 0 else None})
    doc["assemble_s"] = max(r.get("assemble_s", 0.0) for r in reports)
    # every rank's fresh memory, together: CPU time per byte is per core whichever rank spent it (efficiency.met_ranks)
    doc["populated"] = {"bytes": sum(r.get("populated_bytes", 0) for r in reports),
                        "cpu_s": sum(r.get("populate_cpu_s", 0.0) for r in reports)}
    ours = [r["plan"].get("ours") or {"requests": 0, "backward_seeks": 0, "files_touched": 0} for r in reports]
    doc["read_plan"] = {"requests": sum(p["requests"] for p in ours),
                        "bytes_per_request": bytes_read / max(1, sum(p["requests"] for p in ours)),
                        "backward_seeks": sum(p["backward_seeks"] for p in ours),
                        "files_touched_per_rank": [p["files_touched"] for p in ours]}
    plans = [r["plan"] for r in reports]
    if all("dcp_reader" in p for p in plans):  # what torch's DCP reader would have read for the same shares
        stock = sum(p["dcp_reader"]["bytes"] for p in plans)
        doc["dcp_reader"] = {"bytes": stock, "amplification": stock / unique if unique else None,
                             "requests": sum(p["dcp_reader"]["requests"] for p in plans),
                             "backward_seeks": sum(p["dcp_reader"]["backward_seeks"] for p in plans)}
    return doc


def summarize(run_id: str, listing, world, options: dict, policy: str, saved: int | None, repeats: list[dict],
              env: dict) -> dict:
    ok = [r for r in repeats if r["status"] == "ok"]
    hosts = sorted({r["host"] for rep in repeats for r in rep["ranks"]})
    body = {"format": listing.format, "world_size": world.size, "nodes": len(hosts), "hosts": hosts,
            "backend": world.backend, "each_rank": policy, "saved_world": saved,
            "resharded": saved is not None and saved != world.size, "options": options,
            "problems": [p for r in repeats for p in r["problems"]], "repeats": repeats}
    lay = getattr(listing, "layout", None)
    if lay is not None:
        body["layout"] = lay.describe()
    if ok:
        body.update({"rto_stats": spread([r["rto_s"] for r in ok]),
                     "aggregate_gbps_stats": spread([r["aggregate_gbps"] for r in ok if r["aggregate_gbps"]]),
                     "skew_stats": spread([r["skew_s"] for r in ok]),
                     "amplification": ok[0]["amplification"], "unique_bytes": ok[0]["unique_bytes"],
                     "bytes_read": ok[0]["bytes_read"]})
        if "dcp_reader" in ok[0]:
            body["dcp_reader"] = ok[0]["dcp_reader"]
    caches = [r["cache"] for r in repeats if "cache" in r]
    if caches:
        body["cache"] = {"requested": options.get("cache"),
                         "residency_before": max(c["residency_before"] for c in caches),
                         "residency_before_min": min(c.get("residency_before_min", c["residency_before"])
                                                     for c in caches),
                         "verified": all(c["verified"] for c in caches),
                         "notes": sorted({n for c in caches for n in c["notes"]})}
    # the checkpoint restored, as `run` records it (a Lightning .ckpt of a folder holding several, Listing.restored)
    return document("run", "dist", run_id, getattr(listing, "restored", listing.source), body, env,
                    status="ok" if len(ok) == len(repeats) else "failed",
                    verified=bool(ok) and all(r.get("verified") for r in ok),
                    success_rate=len(ok) / len(repeats) if repeats else 0.0)


def record(path: str, doc: dict, options) -> None:
    """The run document in results.csv.jsonl, and one results.csv row per repeat (kind `dist`: the RTO and stages of
    the slowest rank, the aggregate read rate, all ranks' bytes, `ranks` the world size). An interrupted run keeps
    its finished repeats so, and the repeat under way is one row `cancelled`, as a single-process run records it."""
    stopped = doc.get("interrupted") or {}
    if doc["repeats"] or not stopped:  # a run stopped before any repeat finished has only its cancelled row
        append_document(path, doc)
    settings = settings_of(options, RESTORE_SETTINGS[1:]) | {
        "format": doc["format"], "mode": f"distributed-{doc['each_rank']}", "ranks": doc["world_size"]}
    rows = []
    for i, rep in enumerate(doc["repeats"], 1):
        slow, cache = rep.get("slowest_stages") or {}, rep.get("cache", {})
        figures = {"cache_verified": cache.get("verified", ""), "residency_before": cache.get("residency_before", ""),
                   **{f"{s}_s": slow.get(s) for s in STAGES}, "rto_s": rep.get("rto_s"), "bytes": rep["bytes_read"],
                   "files": sum(r["files"] for r in rep["ranks"]), "aggregate_gbps": rep.get("aggregate_gbps")}
        ranks_ok = sum(r["status"] == "ok" for r in rep["ranks"])
        rows.append(row("dist", doc["run_id"], i, doc["source"], settings, figures, doc["env"], status=rep["status"],
                        verified=bool(rep.get("verified")), success_rate=ranks_ok / len(rep["ranks"])
                        if rep["ranks"] else 0.0))
    if stopped.get("repeat"):
        rows.append(row("dist", doc["run_id"], stopped["repeat"], doc["source"], settings,
                        {f"{s}_s": "" for s in STAGES}, doc["env"], status="cancelled", verified=False,
                        success_rate=None))
    append(path, rows)
