"""`plan`: the arithmetic of a checkpoint shape — sizes by part, files, save bandwidth, restore memory."""

from __future__ import annotations

import math
import os

from ckptbench.core.errors import CkptbenchError, printable, shown
from ckptbench.checkpoint.profiles import DTYPE_BYTES, Profile
from ckptbench.save.report import HEADROOM
from ckptbench.save.series import MAX_WAIT_S

SMALL_FILE_AVG = 56 << 10  # the generator's data-loader files average 56 KiB
MAX_WRITE_GBPS = 1000.0  # far beyond any one machine's storage: a recorded figure above it is damaged, not measured
MIN_WRITE_GBPS = 1e-4  # 100 kB/s: below, a save of 7B took 10^300 s and plan printed every digit of it
MIN_INTERVAL_S = 1e-3  # --interval 1e-320 needed an infinite bandwidth: an OverflowError traceback
# how far the measured save's size may be from the planned checkpoint's before its throughput gives no verdict: a
# save's rate depends on its size (fixed costs of fsync, rename and manifest; the dirty limit a large one meets)
SIZE_FACTOR = 2.0


def _in_range(gbps) -> bool:
    return isinstance(gbps, float) and math.isfinite(gbps) and MIN_WRITE_GBPS <= gbps <= MAX_WRITE_GBPS


def _same_target(recorded, target: str) -> bool:
    """Whether a recorded save target is `target`, by real path; a recorded one no path can be (a NUL byte in it
    raised ValueError out of realpath: a traceback) is not."""
    try:
        return os.path.realpath(str(recorded)) == os.path.realpath(target)
    except (ValueError, OSError):
        return False


def measured_save(results_path: str, target: str | None = None) -> dict | None:
    """The newest recorded save run (to `target` when given, compared by real path): its sustained durable
    throughput, its bytes over the median time until durable of its saves after the first, as `save` reports it;
    None when there is none.

    A run whose throughput is out of range (negative, zero, absurd: a damaged or hand-edited row) is unknown:
    `sustained_gbps` None and `unknown` saying why in one line, never a figure an interval is judged by."""
    from ckptbench.records.results import read_rows
    from ckptbench.core.stats import sustained_rate

    if not os.path.exists(results_path):
        return None
    runs: dict[str, list[dict]] = {}
    for r in read_rows(results_path):
        if r["kind"] == "save" and r["status"] == "ok" and r["write_gbps"] is not None and (
                target is None or _same_target(r["target"], target)):
            runs.setdefault(r["run_id"], []).append(r)
    if not runs:
        return None
    # a --no-fsync save's "durable" ends at the rename: its 3.1 GB/s (to memory) stood for the sustained durable
    # throughput an interval was judged by, where the durable save before it made 0.95 GB/s
    unsynced = _unsynced(results_path)
    durable = [run_id for run_id in runs if run_id not in unsynced]
    rows = runs[durable[-1]] if durable else list(runs.values())[-1]
    steady = [r for r in rows if r["repeat"] != 1] or rows
    # recorded text is anyone's: printable, and cut (a 100 kB run id or date was printed whole)
    out = {"run_id": shown(rows[0]["run_id"]), "date": shown(rows[0]["timestamp"], 40),
           "target": shown(rows[0]["target"], 200), "format": shown(rows[0]["format"], 40), "saves": len(rows),
           "sustained_gbps": None,
           "dirty_peak_fraction": max((r["dirty_peak_fraction"] for r in rows
                                       if _fraction(r.get("dirty_peak_fraction"))), default=None),
           "throttled": any(str(r.get("throttled")) == "True" for r in rows),
           "overran": sum(1 for r in rows if str(r.get("overran")) == "True")}
    out |= _page_cache_of_run(results_path, rows[0]["run_id"])
    if not durable:
        out["unknown"] = (f"save run {out['run_id']} in {printable(results_path)} was made with --no-fsync: its "
                          "'durable' times end at the rename, the bytes perhaps only in memory, so it measured no "
                          "durable throughput; run `ckptbench save` without --no-fsync")
        return out
    bad = [r["write_gbps"] for r in rows if not _in_range(r["write_gbps"])]
    if bad:
        out["unknown"] = (f"save run {out['run_id']} in {printable(results_path)} records write_gbps {bad[0]:g}, out "
                          f"of range ({MIN_WRITE_GBPS:g} to {MAX_WRITE_GBPS:g} GB/s): its save time is unknown; run "
                          "`ckptbench save` again")
        return out
    # save's one definition (core.stats.sustained_rate): bytes over the median time until durable, each row's
    # bytes taken as the rate × time it was recorded from
    durable = [r.get("durable_s") if _seconds(r.get("durable_s")) else None for r in steady]
    rate = sustained_rate([r["write_gbps"] * d * 1e9 if d else None for r, d in zip(steady, durable)], durable)
    if not _in_range(rate):
        out["unknown"] = (f"save run {out['run_id']} in {printable(results_path)} records no time until durable "
                          "(durable_s) to take its sustained throughput over; run `ckptbench save` again")
        return out
    out["sustained_gbps"] = rate
    sizes = sorted(r["bytes"] for r in rows if isinstance(r.get("bytes"), (int, float)) and r["bytes"] > 0)
    out["bytes"] = int(sizes[len(sizes) // 2]) if sizes else None  # what each save of the run wrote
    return out


def _unsynced(results_path: str) -> set[str]:
    """The save runs whose documents say they ran with --no-fsync."""
    from ckptbench.records.compare import save_option
    from ckptbench.records.results import read_documents

    return {d.get("run_id") for d in read_documents(results_path, "run") if save_option(d, "fsync") is False}


def _page_cache_of_run(results_path: str, run_id: str) -> dict:
    """The run's page-cache figures from its run document, over every sample of the series: since each save goes on
    record as it ends, its row holds its own samples' only (none for a save shorter than a sample). Nothing when the
    run has no document (killed outright) or an older file's rows hold the run's figures in each."""
    from ckptbench.records.results import read_documents

    doc = next((d for d in reversed(read_documents(results_path, "run")) if d.get("run_id") == run_id), None)
    if doc is None:
        return {}
    out = {}
    if _fraction(doc.get("dirty_peak_fraction")):
        out["dirty_peak_fraction"] = doc["dirty_peak_fraction"]
    if isinstance(doc.get("throttled"), bool):
        out["throttled"] = doc["throttled"]
    return out


def _seconds(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _fraction(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and 0 <= x <= 100


def _against(total: int, interval_s: float, measured: dict) -> dict:
    """The measured throughput applied to this checkpoint's size; no verdict (meets_interval None, size_mismatch
    saying why) where the measured save was more than SIZE_FACTOR smaller or larger: its rate is not this size's."""
    from ckptbench.core.units import human_bytes

    durable = total / (measured["sustained_gbps"] * 1e9)
    out = measured | {"planned_bytes": total, "durable_s_estimate": durable,
                      "shortest_safe_interval_s": durable * HEADROOM, "meets_interval": durable * HEADROOM <= interval_s}
    size = measured.get("bytes")
    if size and max(size, total) / min(size, total) > SIZE_FACTOR:
        out["meets_interval"] = None
        out["size_mismatch"] = (
            f"measured on a {human_bytes(size)} save; this plan is for {human_bytes(total)} "
            f"({max(size, total) / min(size, total):.1f}x {'larger' if total > size else 'smaller'}): small saves run "
            "below the throughput large ones reach, and large ones can meet the dirty limit, so no verdict on the "
            f"interval from it; measure this size (`ckptbench save PROFILE TARGET --count 3`, `--scale F` to match)")
    return out


def plan(profile: Profile, interval_s: float | None = None, measured: dict | None = None) -> dict:
    if interval_s is not None and not MIN_INTERVAL_S <= interval_s <= MAX_WAIT_S:  # save's own bound above
        raise CkptbenchError(f"--interval must be {MIN_INTERVAL_S:g} to {MAX_WAIT_S} seconds (a week), got "
                             f"{interval_s:g}")
    p = profile.dims.param_count
    obytes = DTYPE_BYTES[profile.optimizer_dtype]
    parts = {
        "weights": profile.weights_bytes,
        "optimizer_master": p * obytes,
        "optimizer_exp_avg": p * obytes,
        "optimizer_exp_avg_sq": p * obytes,
        "small_files": profile.small_files * SMALL_FILE_AVG,
    }
    total = sum(parts.values())
    world = profile.world_size
    files = 2 * world + 1 + profile.small_files + 1  # model+optimizer shard per rank, index, tail, manifest
    largest_shard = (profile.weights_bytes + profile.optimizer_bytes) // world
    out = {
        "profile": profile.name,
        "reference": profile.reference,
        "params": p,
        "dims": vars(profile.dims),
        "world_size": world,
        "bytes": parts,
        "total_bytes": total,
        "files": files,
        "avg_file_bytes": total // files,
        "restore_memory": {
            # model and optimizer hold every tensor; a shard being deserialized adds one more copy at most
            "held_bytes": profile.weights_bytes + profile.optimizer_bytes,
            "peak_bytes_mmap_or_safetensors": profile.weights_bytes + profile.optimizer_bytes,
            "peak_bytes_full_read": profile.weights_bytes + profile.optimizer_bytes + largest_shard,
            "per_rank_bytes": (profile.weights_bytes + profile.optimizer_bytes) // world,
        },
    }
    if interval_s:
        out["save"] = {"interval_s": interval_s, "required_gbps": total / interval_s / 1e9,
                       "per_rank_gbps": total / interval_s / 1e9 / world}
        if measured is not None and _in_range(measured.get("sustained_gbps")):
            out["save"]["measured"] = _against(total, interval_s, measured)
        elif measured is not None and measured.get("unknown"):
            out["save"]["measured_unknown"] = measured["unknown"]
    return out
