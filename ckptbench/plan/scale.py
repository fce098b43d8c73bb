"""`plan --nodes`: where a restore on N nodes saturates the storage, and its RTO floor.

No cluster is involved: per-rank read rates (measured in results.csv, else assumed from the preset) are
multiplied out and held against the storage preset's per-client, aggregate and request-rate ceilings."""

from __future__ import annotations

import math
import os

from ckptbench.core.errors import CkptbenchError, printable, redact, shown
from ckptbench.plan.shape import plan
from ckptbench.checkpoint.profiles import Profile
from ckptbench.core.units import human_age, human_gbps
from ckptbench.system.pagecache import COLD_MAX
from ckptbench.system.storage import MIN_FIGURE, Preset

MAX_READ_GBPS = 1000.0  # far beyond any storage a rank reads from: a recorded rate above it is damaged, not measured
MAX_RANKS = 1 << 20  # a recorded ranks of 1e308 divided the aggregate into 1e-308 GB/s per rank
COORDINATION_S = 5.0  # process-group init, a barrier and the index broadcast: an assumption, not measured
RESTORE_STATUSES = ("ok", "unverified")  # an unverified restore still read every byte at the rate recorded


def _aggregate(row: dict) -> float | None:
    """A distributed row's rate over all its ranks: aggregate_gbps (schema 3), read_gbps in older files."""
    v = row.get("aggregate_gbps")
    return v if isinstance(v, float) else row.get("read_gbps") if isinstance(row.get("read_gbps"), float) else None


def _ranks_ok(row: dict) -> bool:
    """A dist row's ranks: a whole number a run can have had, and its aggregate a rate each rank could read at."""
    n, rate = row.get("ranks"), _aggregate(row)
    return isinstance(n, float) and 1 <= n <= MAX_RANKS and n == int(n) and rate is not None and \
        rate / n >= MIN_FIGURE


def _runs(rows: list[dict], keep, rate=lambda r: r.get("read_gbps")) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for r in rows:
        v = rate(r)
        if keep(r) and isinstance(v, float) and MIN_FIGURE <= v <= MAX_READ_GBPS:
            runs.setdefault(r["run_id"], []).append(r)
    return runs


def _median(values: list[float]) -> float:
    from ckptbench.core.stats import spread

    return spread(values)["median"]


def _said(text) -> str:
    """A recorded field as the plan quotes it (text and --json): a source path or a run id edited to carry a
    credential was printed whole."""
    return shown(redact(str(text)))


def _from_storage(row: dict) -> bool:
    """A row whose bytes came from the storage: not hot, and (as-is too) no more than a cold read's share of them in
    the page cache before it — an as-is restore of files just read read them from memory."""
    resident = row.get("residency_before")
    return row.get("cache") != "hot" and not (isinstance(resident, float) and resident > COLD_MAX)


def measured_rank_read(results_path: str, on=None) -> dict | None:
    """The per-rank read rate of the newest distributed run (its aggregate rate ÷ its ranks), else of the
    newest restore run, neither read from the page cache (_from_storage), of the rows `on(row)` keeps; None when
    results.csv holds neither."""
    from ckptbench.records.results import read_rows

    if not results_path or not os.path.exists(results_path):
        return None
    rows = [r for r in read_rows(results_path) if _from_storage(r) and (on is None or on(r))]
    dist = _runs(rows, lambda r: r["kind"] == "dist" and r["status"] in RESTORE_STATUSES and _ranks_ok(r), _aggregate)
    if dist:
        run = list(dist.values())[-1]
        return {"source": "measured-dist", "run_id": _said(run[0]["run_id"]),
                "date": _said(run[0]["timestamp"]), "where": _said(run[0]["source"]),
                "ranks": int(run[0]["ranks"]),
                "gbps": _median([_aggregate(r) / r["ranks"] for r in run])}
    restore = _runs(rows, lambda r: r["kind"] == "restore" and r["status"] in RESTORE_STATUSES)
    if restore:
        run = list(restore.values())[-1]
        return {"source": "measured-restore", "run_id": _said(run[0]["run_id"]),
                "date": _said(run[0]["timestamp"]), "where": _said(run[0]["source"]), "ranks": 1,
                "gbps": _median([r["read_gbps"] for r in run])}
    return None


def _newest_storage(results_path: str, run_id: str) -> str:
    """What the run `run_id` (as measured_rank_read quotes it) read, as the plan's note names it."""
    from ckptbench.records.results import read_rows

    found = next((_storage_of(r) for r in reversed(read_rows(results_path)) if _said(r["run_id"]) == run_id), None)
    return _said(found) if found else "storage it did not record"


def _storage_of(row: dict) -> str | None:
    """What a recorded run read from: its URL scheme, else its filesystem as its environment recorded it; None when
    neither is known (it matches no preset)."""
    source = str(row.get("source") or "")
    found = source.split("://", 1)[0] if "://" in source else row["env"].get("source_fs")
    return found if isinstance(found, str) and found else None


def rank_read_on(results_path: str, preset: Preset) -> tuple[dict | None, str]:
    """The measured per-rank read rate from runs on the preset's storage (its filesystems or URL schemes), and why
    a newer run was not used: a restore of a local ext4 checkpoint, found in ./results.csv, was the "MEASURED" rate
    of an FSx for Lustre plan. A preset that names no filesystem takes any run."""
    kinds = set(preset.fs_types) | set(preset.schemes)
    if not kinds:
        return measured_rank_read(results_path), ""
    mine = measured_rank_read(results_path, on=lambda r: _storage_of(r) in kinds)
    if mine is not None:
        return mine, ""
    other = measured_rank_read(results_path)
    if other is None:
        return None, ""
    # named by what it read: "read other storage than efs's (nfs, nfs4)" read as if the run had read NFS
    read = _newest_storage(results_path, other["run_id"])
    return None, (f"; the newest run read from storage in {printable(redact(results_path))} ({other['run_id']}, {other['where']}) read "
                  f"{read}, not {preset.name} ({', '.join(sorted(kinds))}), the storage this plan is for: not used")


def _requests(profile: Profile, base: dict, preset: Preset) -> dict | None:
    """What a matching-world restore asks of the request or metadata rate: how many, how fast, of what."""
    files = base["files"]
    if preset.per_prefix_get_per_s is not None:
        part, world = preset.part_bytes, profile.world_size
        shards = world * (math.ceil(profile.weights_bytes / world / part)
                          + math.ceil(profile.optimizer_bytes / world / part))
        count = shards + (files - 2 * world) + (files if preset.head_per_file else 0)  # small files: one GET each
        return {"kind": "GET" + ("+HEAD" if preset.head_per_file else ""), "count": count,
                "per_s": preset.prefixes * preset.per_prefix_get_per_s, "part_bytes": part,
                "prefixes": preset.prefixes}
    if preset.metadata_ops_per_s is not None:
        return {"kind": "open", "count": files, "per_s": preset.metadata_ops_per_s}
    return None


def _floor(read_bytes: int, gbps: float, requests: int | None, per_s: float | None, coordination_s: float):
    read_s = read_bytes / (gbps * 1e9)
    requests_s = requests / per_s if requests is not None else 0.0
    return {"read_s": read_s, "requests_s": requests_s, "rto_floor_s": max(read_s, requests_s) + coordination_s,
            "bound": "requests" if requests_s > read_s else "bandwidth"}


def _at(nodes: int, ranks_per_node: int, per_node: float, preset: Preset, total: int, req: dict | None,
        coordination_s: float) -> dict:
    """Aggregate rate, what binds it, and the RTO floors (matching world; every rank reads everything) at `nodes`."""
    ranks = nodes * ranks_per_node
    rates = {}
    if preset.aggregate_gbps is not None:
        rates["aggregate"] = preset.aggregate_gbps
    if req is not None:
        rates["requests"] = total / (req["count"] / req["per_s"]) / 1e9  # the bandwidth the request rate allows
    rates["per_node"] = nodes * per_node  # last: on a tie the storage binds, it is saturated
    binding = min(rates, key=lambda k: rates[k])
    bw = min(rates["per_node"], rates.get("aggregate", math.inf))
    count = req["count"] if req else None
    match = _floor(total, bw, count, req and req["per_s"], coordination_s)
    every = _floor(total * ranks, bw, count * ranks if req else None, req and req["per_s"], coordination_s)
    return {"nodes": nodes, "ranks": ranks, "gbps": rates[binding], "binding": binding, "rates_gbps": rates,
            "rto_floor_s": match["rto_floor_s"], "rto_floor_everything_s": every["rto_floor_s"],
            "matching": match, "everything": every}


def _node_counts(nodes: int) -> list[int]:
    counts, n = [], 1
    while n < nodes:
        counts.append(n)
        n *= 2
    return counts + [nodes]


def box_memory(floor, given_gbps: float | None = None) -> dict | None:
    """A node's fresh-memory ceiling: every node lands its share of the bytes in memory it did not own, so no node
    restores faster than its memory is populated. `given_gbps` (--node-memory) is the nodes' own figure; else this
    box's (the floor's best population rate) stands in for each node's, which holds only where the plan runs on a
    training node: its age, and whether it was measured while other work held the cores, go with it (a busy 2-core
    VM's 2.58 GB/s capped every node of a 32-node plan, unsaid)."""
    if given_gbps is not None:
        return {"gbps": given_gbps, "method": "given (--node-memory)", "age_s": None, "busy": "", "given": True}
    pops = [c for k, c in (floor.ceilings.items() if floor is not None else ()) if k.startswith("populate_")]
    if not pops:
        return None
    best = max(pops, key=lambda c: c.gbps)
    return {"gbps": best.gbps, "method": best.method, "age_s": best.age_s, "busy": floor.busy, "given": False}


def scale(profile: Profile, nodes: int, ranks_per_node: int, storage: Preset, measured: dict | None = None,
          coordination_s: float = COORDINATION_S, memory: dict | None = None, unmeasured_why: str = "") -> dict:
    """The restore of `profile` on `nodes` × `ranks_per_node` ranks from `storage`: ceilings, the binding one,
    where the storage saturates, the RTO floor, and a table over node counts (1, 2, 4, ... nodes)."""
    if nodes < 1 or ranks_per_node < 1:
        raise CkptbenchError(f"nodes and ranks per node must be at least 1, got {nodes} and {ranks_per_node}")
    base = plan(profile)
    total, ranks = base["total_bytes"], nodes * ranks_per_node
    if measured is not None:
        rank = dict(measured)
    else:
        rank = {"source": "assumed", "gbps": storage.client_gbps / ranks_per_node,
                "why": f"no distributed or restore run measured: {storage.name}'s per-client ceiling "
                       f"{storage.client_gbps:g} GB/s shared by {ranks_per_node} ranks{unmeasured_why}"}
    from_ranks = ranks_per_node * rank["gbps"]
    caps = {"ranks": from_ranks, "client": storage.client_gbps}  # on a tie the client binds: it is saturated
    if memory is not None:
        caps["fresh memory"] = memory["gbps"]
    capped_by = min(reversed(list(caps)), key=lambda k: caps[k])
    per_node = caps[capped_by]
    req = _requests(profile, base, storage)
    row = _at(nodes, ranks_per_node, per_node, storage, total, req, coordination_s)
    limit = min((v for k, v in row["rates_gbps"].items() if k != "per_node"), default=None)
    out = {
        "profile": profile.name,
        "storage": storage.name,
        "nodes": nodes,
        "ranks_per_node": ranks_per_node,
        "ranks": ranks,
        "total_bytes": total,
        "files": base["files"],
        "bytes_per_rank": total / ranks,
        "bytes_per_rank_everything": total,
        "per_rank": rank,
        "ceilings": {
            "per_node_gbps": per_node,
            "per_node_capped_by": capped_by,
            "fresh_memory": memory,
            "client_gbps": storage.client_gbps,
            "nodes_gbps": row["rates_gbps"]["per_node"],
            "aggregate_gbps": storage.aggregate_gbps,
            "shared": storage.shared,
            "requests": None if req is None else req | {"s": req["count"] / req["per_s"],
                                                        "implied_gbps": row["rates_gbps"]["requests"]},
        },
        "binding": row["binding"],
        "gbps": row["gbps"],
        # the first node count at which the nodes together reach the storage's own limit
        "saturates_at_nodes": None if limit is None else max(1, math.ceil(limit / per_node - 1e-9)),
        "coordination_s": coordination_s,
        "read_s": row["matching"]["read_s"],
        "requests_s": row["matching"]["requests_s"],
        "rto_floor_s": row["rto_floor_s"],
        "everything": {"read_amplification": ranks, "bytes_read": total * ranks,
                       "requests": None if req is None else req["count"] * ranks,
                       "read_s": row["everything"]["read_s"], "requests_s": row["everything"]["requests_s"],
                       "rto_floor_s": row["rto_floor_everything_s"], "bound": row["everything"]["bound"]},
        "table": [{k: r[k] for k in ("nodes", "ranks", "gbps", "binding", "rto_floor_s", "rto_floor_everything_s")}
                  for r in (_at(n, ranks_per_node, per_node, storage, total, req, coordination_s)
                            for n in _node_counts(nodes))],
        "assumptions": _assumptions(storage, coordination_s),
    }
    if storage.per_connection_gbps:
        out["ceilings"]["connections_per_node"] = math.ceil(per_node / storage.per_connection_gbps)
    return out


def _assumptions(storage: Preset, coordination_s: float) -> list[str]:
    notes = [f"a fixed {coordination_s:g} s of coordination (process groups, a barrier, the index) is added",
             "a matching-world restore reads each byte once; the everything case reads all of it on every rank"]
    if not storage.shared:
        notes.append(f"{storage.name} is not shared: every node reads its own copy, so nodes add bandwidth freely")
    elif storage.aggregate_gbps is None:
        notes.append(f"{storage.name} publishes no aggregate bandwidth ceiling: only the request rate caps the nodes")
    return notes


# what each binding key names, as the text says it (the document keeps the key)
BINDING_SAID = {"per_node": "the nodes", "aggregate": "the storage's aggregate", "requests": "the request rate"}


def _rate(doc: dict) -> str:
    r = doc["per_rank"]
    if r["source"] == "assumed":
        return f"per-rank read {r['gbps']:.3f} GB/s ASSUMED ({r['why']})"
    what = f"distributed run {r['run_id']}, {r['ranks']} ranks" if r["source"] == "measured-dist" \
        else f"restore run {r['run_id']}"
    return f"per-rank read {r['gbps']:.3f} GB/s MEASURED ({what}, {r['date']}, from {r['where']})"


def _memory_said(m: dict) -> str:
    if m.get("given"):
        return "the nodes' fresh memory, given with --node-memory"
    age = f", {human_age(m['age_s'])} ago" if m.get("age_s") is not None else ""
    busy = " while other work held the cores (it may read low)" if m.get("busy") else ""
    return (f"this box's fresh memory, measured{age}{busy}: it stands in for each node's; plan on a training node, "
            "or give theirs with --node-memory GB/S")


def _ceilings(doc: dict) -> str:
    c = doc["ceilings"]
    by = {"client": "the client ceiling", "ranks": "its ranks",
          "fresh memory": _memory_said(c.get("fresh_memory") or {})}[c["per_node_capped_by"]]
    parts = [f"per node {c['per_node_gbps']:.2f} GB/s ({by}), {doc['nodes']} nodes {c['nodes_gbps']:.2f} GB/s"]
    if c["aggregate_gbps"] is not None:
        parts.append(f"aggregate {c['aggregate_gbps']:.2f} GB/s")
    elif not c["shared"]:
        parts.append("no shared aggregate (each node reads its own copy)")
    q = c["requests"]
    if q is not None:
        parts.append(f"{q['count']} {q['kind']} requests at {q['per_s']:,.0f}/s take {q['s']:.2f} s "
                     f"(a bandwidth of {human_gbps(q['implied_gbps'])} GB/s at most)")
    return "ceilings: " + "; ".join(parts)


def text(doc: dict) -> list[str]:
    """The scale document as the lines `plan --nodes` prints."""
    from ckptbench.core.units import human_bytes

    e = doc["everything"]
    sat = doc["saturates_at_nodes"]
    lines = [
        f"{doc['profile']} on {doc['nodes']} nodes × {doc['ranks_per_node']} ranks ({doc['ranks']} ranks) from "
        f"{doc['storage']}: {human_bytes(doc['total_bytes'])} in {doc['files']} files; each rank reads "
        f"{human_bytes(doc['bytes_per_rank'])} (or all {human_bytes(doc['bytes_per_rank_everything'])})",
        _rate(doc),
        _ceilings(doc),
        f"binding: {BINDING_SAID.get(doc['binding'], doc['binding'])} at {human_gbps(doc['gbps'])} GB/s; "
        + ("the storage never saturates" if sat is None else f"the storage saturates at {sat} nodes"),
        # the larger of the two, not their sum: the requests are issued while the bytes are read
        f"RTO floor {doc['rto_floor_s']:.1f} s (the larger of read {doc['read_s']:.1f} s and requests "
        f"{doc['requests_s']:.1f} s, + {doc['coordination_s']:g} s coordination); every rank reading everything "
        f"(read amplification "
        f"×{e['read_amplification']}): {e['rto_floor_s']:.1f} s",
        f"{'nodes':>7} {'ranks':>7} {'GB/s':>9}  {'binding':<10} {'RTO floor':>10} {'everything':>11}",
    ]
    for r in doc["table"]:
        said = {"per_node": "nodes"}.get(r["binding"], r["binding"])  # the column's short form of BINDING_SAID
        lines.append(f"{r['nodes']:>7} {r['ranks']:>7} {r['gbps']:>9.2f}  {said:<10} "
                     f"{r['rto_floor_s']:>8.1f} s {r['rto_floor_everything_s']:>9.1f} s")
    return lines
