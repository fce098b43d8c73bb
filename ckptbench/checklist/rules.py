"""The troubleshooting checklist: rules over gathered facts → verdict, evidence, why it matters, and the fix; the
rules on the path to storage (network, mount options) are mounts.py's."""

from __future__ import annotations

import shlex

from ckptbench.checklist import efficiency, loads
from ckptbench.checklist import fuse as checklist_fuse
from ckptbench.system import floor as fl
from ckptbench.system import probes
from ckptbench.checklist.facts import Facts, reason, unknown
from ckptbench.checklist.mounts import mount_options, network_path
from ckptbench.checkpoint.layouts import picked_name, picked_why
from ckptbench.core import options as o
from ckptbench.core.errors import name_source, printable, redact
from ckptbench.core.paths import source_identity
from ckptbench.core.units import human_bytes, human_figure
from ckptbench.core.verdicts import Verdict
from ckptbench.restore.sweep import KNEE_MARGIN, MeasuredKnee, advice

VERDICTS = ("ok", "warn", "fail", "unknown")
REUSED = "reused buffers (a read's)"  # where a measured rate's bytes landed, said beside it
SMALL_FILE_DEFAULT = 256 << 10
# evidence that is a share: a fraction in the JSON, a percent wherever a person reads it, as `run` prints efficiency
SHARES = {"efficiency", "residency_now", "residency_after_evict", "measured_dirty_peak_fraction"}


def _measured(f: Facts) -> MeasuredKnee | None:
    """The knee measured for this source: this check's quick sweep, else the newest one recorded (sweep, auto-tune)."""
    if f.knee is not None:
        return f.knee
    if f.sweep is None:
        return None
    gbps = {int(k): v["median"] for k, v in f.sweep["gbps"].items()}
    return MeasuredKnee(f.source, f.sweep["knee"], f.sweep["best"], gbps, "quick sweep",
                        f.sweep.get("date", "this check"))


def _measure_it(f: Facts) -> str:
    """The commands that measure a knee this check then advises from: a plain `sweep` records nothing, and check kept
    saying "no measurement" after one."""
    results = shlex.quote(printable(f.results or o.RESULTS.default))
    again = "" if f.results else f" (then `ckptbench check SOURCE --results {results}`)"
    return (f"measure it: `ckptbench check SOURCE --quick-sweep`, `ckptbench sweep SOURCE --results {results}` (the "
            f"knee it records in {results}.jsonl is what check reads){again}, or auto-tune (t) in the dashboard")


def _rates_of(f: Facts) -> dict:
    """What this check's quick sweep read with, beside its rates: they land in a read's reused buffers, unlike the
    restore-efficiency item's fresh memory, and the two rates at one concurrency differ for that."""
    if f.knee is None or f.sweep is None:
        return {}
    return {"read": f.sweep.get("read") or "unknown", "hash": f.sweep.get("hash"), "into": REUSED}


def _skipped_knee(f: Facts) -> dict:
    """The newest knee recorded for this source when it is malformed, which advice passes over (to an older one, or
    none): one line saying so, as a malformed results row is said, where the user would otherwise see no reason."""
    if f.sweep is not None or not f.results:
        return {}
    from ckptbench.records.results import jsonl_path, read_documents

    mine = source_identity(f.source)
    for doc in reversed(read_documents(f.results, "knee")):
        if not isinstance(doc.get("source"), str) or source_identity(doc["source"]) != mine:
            continue
        if doc.get("status", "ok") != "ok":
            continue  # an interrupted sweep's levels: no knee, and on record as such
        why = MeasuredKnee.malformed(doc)
        if why is None:
            return {}
        where = printable(redact(jsonl_path(f.results)))
        return {"knee_record": f"{where}: the newest knee record of this checkpoint is malformed ({why}): not used; "
                               "measure the knee again"}
    return {}


def _knee_is_noise(f: Facts, m: MeasuredKnee) -> bool:
    """Whether the knee was measured over a floor under the fixed costs: this check's sweep's floor, else (none
    known) the best level's own read of the checkpoint, which no floor is longer than."""
    floor_s = f.sweep.get("floor_s") if f.sweep is not None else None
    best = m.gbps.get(m.best)
    if floor_s is None and f.bytes and best:
        floor_s = f.bytes / (best * 1e9)
    return fl.says_little(floor_s)


def concurrency(f: Facts) -> Verdict:
    why = "too few parallel reads leave bandwidth unused; far more than the knee only adds contention"
    title = "Concurrency"
    advised = advice(_measured(f), f.preset)
    m = advised.measured
    if m is None:
        floor = advised.concurrency
        ev = {"concurrency": f.concurrency, "preset": f.preset.name if f.preset else None, "preset_minimum": floor,
              "basis": advised.basis} | _skipped_knee(f)
        measure = _measure_it(f)
        if floor and f.concurrency < floor:
            return Verdict("concurrency", title, "warn", ev, why,
                           f"raise --concurrency to at least {floor} ({advised.basis}); {measure}")
        return Verdict("concurrency", title, "unknown", ev, why, measure)
    gbps, knee, best = m.gbps, m.knee, m.best
    if _knee_is_noise(f, m):  # as sweep says of such a knee: its levels' rates are fixed costs, no advice
        ev = {"concurrency": f.concurrency, "knee": knee, "best": best, "gbps_by_level": gbps, "too_small": True,
              "reason": f"{fl.SMALL_SWEEP_WHY} ({fl.SHORT_FLOOR})", "basis": advised.basis} | _rates_of(f) \
            | _skipped_knee(f)
        return Verdict("concurrency", title, "unknown", ev, why, f"none from this knee; {fl.SMALL_SWEEP_FIX}")
    current = gbps.get(f.concurrency)
    ev = {"concurrency": f.concurrency, "knee": knee, "best": best, "gbps_by_level": gbps,
          "gbps_at_current": current, "gbps_at_knee": gbps[knee]} | _rates_of(f) | {"basis": advised.basis}
    ev |= _skipped_knee(f)
    if f.concurrency < knee:
        if current is None:  # a level the measurement did not read (an auto-tune stops past the knee)
            return Verdict("concurrency", title, "warn", ev, why, f"--concurrency {knee}, the {advised.basis}")
        lost = 1 - current / gbps[best] if gbps[best] else 0
        verdict = "fail" if lost > 0.5 else "warn"
        return Verdict("concurrency", title, verdict, ev | {"throughput_left_pct": round(lost * 100, 1)}, why,
                       f"--concurrency {knee}, the {advised.basis}")
    if current is not None and gbps[best] and current < (1 - KNEE_MARGIN) * gbps[best]:
        # past the knee and slower than it beyond the knee's own margin: contention, which "ok ... --concurrency 1
        # does as well" hid where the current level read 1.70 GB/s against the knee's 2.16
        lost = 1 - current / gbps[best]
        return Verdict("concurrency", title, "warn", ev | {"throughput_left_pct": round(lost * 100, 1)}, why,
                       f"--concurrency {knee}: {f.concurrency} reads {human_figure('gbps_at_current', current)}, "
                       f"{lost * 100:.0f} % under the best level's {human_figure('gbps_at_best', gbps[best])} "
                       f"(contention); the {advised.basis}")
    return Verdict("concurrency", title, "ok", ev, why,
                   "none" if f.concurrency <= 4 * knee else
                   f"--concurrency {knee} does as well with fewer threads: the {advised.basis}")


def _small_limit(f: Facts) -> int:
    """The size under which a file costs a metadata round trip: the storage preset's, else the default."""
    return (f.preset.small_file_bytes if f.preset else None) or SMALL_FILE_DEFAULT


def small_files(f: Facts) -> Verdict:
    limit = _small_limit(f)
    small = sum(1 for s in f.sizes if s < limit)
    avg = f.bytes / f.files if f.files else 0
    if f.files == 0:
        return Verdict("small_files", "Too many small files", "unknown", {"files": 0},
                       "each file costs an open, a stat and a round trip", "list the source: no files were found")
    ev = {"files": f.files, "avg_bytes": int(avg), "small_files": small, "small_limit_bytes": limit,
          "histogram": probes.size_histogram(f.sizes),
          "open_per_s": round(f.open_rate, 1) if f.open_rate else None}
    if f.open_rate:
        ev["open_seconds_all_files"] = round(f.files / f.open_rate, 3)
    why = "each file costs an open, a stat and (on NFS, Lustre, S3) a round trip; thousands of them dominate the list stage"
    fix = (f"ckptbench pack {f.source} PACKED --target-files 4: packs only the small files no loader opens by name "
           "(a data loader's state, logs: in folders without weights or a config) into a few large ones, which "
           "ckptbench run, load and verify read; weights, shards, and config.json, tokenizer and trainer-state files "
           "(everything at the top or beside the weights) stay files, so from_pretrained and a resume still load "
           "PACKED, while a trainer reads a packed file only after `ckptbench unpack`")
    if f.packable == 0:  # pack refuses it, "nothing to pack": the advice sent a user to a command that does nothing
        fix = ("fewer, larger files when the checkpoint is saved (save_pretrained's max_shard_size, one file per rank "
               "rather than per tensor): its small files are all ones a loader opens by name (weights, shards, "
               "format metadata, or beside them), so `ckptbench pack` has nothing it may pack")
    if small >= 1000 or (f.files > 100 and avg < limit):
        ev |= {"packable_files": f.packable} if f.packable is not None else {}
        return Verdict("small_files", "Too many small files", "fail" if small >= 5000 else "warn", ev, why, fix)
    return Verdict("small_files", "Too many small files", "ok", ev, why, "none")


def fuse_mount(f: Facts) -> Verdict:
    """What a FUSE mount of an object store does to a checkpoint (judged only for a source on one: see evaluate)."""
    verdict, ev, fix = checklist_fuse.judge(f, _small_limit(f))
    return Verdict("fuse", "FUSE object-store mount", verdict, ev, checklist_fuse.WHY, fix)


def limits_and_interference(f: Facts) -> Verdict:
    why = "too low an open-file limit fails a restore outright; a scanner or indexer reading the same files halves it"
    title = "System limits and scanning agents"
    ev: dict = {"concurrency": f.concurrency, "files": f.files}
    need = f.concurrency + 64
    if unknown(f.ulimit):
        ev["ulimit"] = reason(f.ulimit)
        verdict = "unknown"
        fix = "check `ulimit -n` in the training job's shell"
    else:
        soft, hard = f.ulimit
        ev.update(ulimit_soft=soft, ulimit_hard=hard, fds_in_use=None if unknown(f.fds) else f.fds)
        if soft != -1 and soft < need:
            verdict, fix = "fail", f"ulimit -n {max(65536, need)} (and LimitNOFILE= in the service unit)"
        elif soft != -1 and soft < f.files:
            verdict, fix = "warn", f"ulimit -n {max(65536, f.files + need)}: a loader that opens every shard at once needs {f.files}"
        else:
            verdict, fix = "ok", "none"
    if unknown(f.openers):
        ev["other_readers"] = reason(f.openers)
        if verdict == "ok":
            verdict, fix = "unknown", "check other readers with `fuser -vm SOURCE` or `lsof +D SOURCE`"
    else:
        ev["other_readers"] = [{"pid": p, "command": c, "open_files": n} for p, c, n in f.openers]
        if f.openers and verdict in ("ok", "unknown"):
            names = ", ".join(sorted({c for _, c, _ in f.openers}))
            verdict, fix = "warn", f"exclude the checkpoint directory from {names} (antivirus, backup, indexer)"
    return Verdict("limits", title, verdict, ev, why, fix)


def oom(f: Facts) -> Verdict:
    why = "a restore that holds more than the box has is killed, usually after most of the read"
    title = "Out of memory at restore"
    if unknown(f.meminfo) or "MemAvailable" not in f.meminfo:
        return Verdict("oom", title, "unknown", {"reason": reason(f.meminfo)}, why,
                       "check `free -g` before the restore")
    avail = f.meminfo["MemAvailable"]
    need = f.bytes
    ev = {"checkpoint_bytes": need, "mem_available_bytes": avail, "ratio": round(need / avail, 3) if avail else None}
    fix = ("load with mmap or safetensors and meta-device init (ckptbench run --mode fused), or restore per rank "
           "under torchrun so each process holds only its shard")
    if need > 0.9 * avail:
        return Verdict("oom", title, "fail", ev, why, fix)
    if need > 0.6 * avail:
        return Verdict("oom", title, "warn", ev, why, fix)
    return Verdict("oom", title, "ok", ev, why, "none")


def device_mapping(f: Facts) -> Verdict:
    why = "a checkpoint saved on N ranks restored on M GPUs needs resharding, or ranks load the wrong shards"
    title = "Device mapping"
    ev = {"checkpoint_ranks": f.world_size}
    if unknown(f.gpus):
        return Verdict("device_mapping", title, "unknown", ev | {"reason": reason(f.gpus)}, why,
                       "check `nvidia-smi -L`")
    ev["gpus"] = f.gpus["count"]
    if f.gpus["count"] == 0:
        return Verdict("device_mapping", title, "unknown", ev | {"reason": "no GPU on this box"}, why,
                       "run the check on the training node")
    if f.world_size is None:
        return Verdict("device_mapping", title, "unknown", ev | {"reason": "rank count unknown (no manifest)"}, why,
                       "compare the checkpoint's shard count with the job's world size")
    if f.world_size % f.gpus["count"] and f.gpus["count"] % f.world_size:
        return Verdict("device_mapping", title, "warn", ev, why,
                       "reshard: save/load with torch.distributed.checkpoint, which maps shards to the new world size")
    return Verdict("device_mapping", title, "ok", ev, why, "none")


def cold_cache(f: Facts) -> Verdict:
    why = "a 'cold' benchmark that reads from the page cache reports the cache, not the storage"
    title = "Cold-cache validity"
    ev = {"residency_now": f.residency_now}
    if not f.page_cache:  # what `run --cache cold` calls verified: nothing local can serve a read
        return Verdict("cold_cache", title, "ok", ev | {"page_cache": f"none ({f.scheme or 'this source'})"}, why,
                       f"none: {f.scheme or 'this source'} keeps no local page cache, so every read is cold "
                       "(nothing to evict)")
    if unknown(f.evict_residency):
        return Verdict("cold_cache", title, "unknown", ev | {"reason": reason(f.evict_residency)}, why,
                       f"fix the '{loads.TITLE}' item first" if f.headers.error is not None
                       else "run as a user who can open the files")
    ev["residency_after_evict"] = round(f.evict_residency, 4)
    if f.evict_residency > 0.05:
        fs = f.mount.fs_type if isinstance(f.mount, probes.Mount) else "this filesystem"
        return Verdict("cold_cache", title, "fail", ev, why,
                       f"pages stay resident after eviction on {fs} (tmpfs? pages mapped elsewhere?): measure cold reads "
                    "on a disk-backed copy, or drop caches as root (sync; echo 1 > /proc/sys/vm/drop_caches)")
    return Verdict("cold_cache", title, "ok", ev, why, "none: --cache cold evicts and verifies")


def write_side(f: Facts) -> Verdict:
    why = "a save larger than the dirty limit blocks the trainer on writeback; writeback in flight slows reads"
    title = "Write side: dirty pages"
    ratio, bg = f.sysctls.get("vm.dirty_ratio"), f.sysctls.get("vm.dirty_background_ratio")
    dbytes = f.sysctls.get("vm.dirty_bytes")
    if unknown(f.meminfo) or unknown(ratio) and unknown(dbytes):
        return Verdict("write_side", title, "unknown", {"reason": reason(f.meminfo if unknown(f.meminfo) else ratio)},
                       why, "check `sysctl vm.dirty_ratio vm.dirty_background_ratio` and Dirty in /proc/meminfo")
    avail = f.meminfo.get("MemAvailable", 0)
    limit = dbytes if isinstance(dbytes, int) and dbytes > 0 else (ratio * avail // 100 if isinstance(ratio, int) else 0)
    dirty_now = f.meminfo.get("Dirty", 0) + f.meminfo.get("Writeback", 0)
    ev = {"dirty_ratio": None if unknown(ratio) else ratio, "dirty_background_ratio": None if unknown(bg) else bg,
          "dirty_limit_bytes": limit, "checkpoint_bytes": f.bytes, "dirty_now_bytes": f.meminfo.get("Dirty"),
          "writeback_now_bytes": f.meminfo.get("Writeback")}
    total = f.meminfo.get("MemTotal", 0)
    m = f.measured_save
    if m is not None:  # a save was measured: its figures decide, not the arithmetic
        ev |= {"measured_run": m["run_id"], "measured_target": m["target"], "measured_gbps": m["sustained_gbps"],
               "measured_dirty_peak_fraction": m["dirty_peak_fraction"], "measured_throttled": m["throttled"],
               "measured_overruns": m["overran"]}
        if m["throttled"]:
            return Verdict("write_side", title, "warn", ev, why,
                        f"the last measured save (run {m['run_id']}) was throttled at the dirty limit: writeback "
                        "could not keep up; sysctl -w vm.dirty_background_ratio=5 so it starts early, fsync per "
                        "shard, or save to faster local storage and drain asynchronously")
        if m["overran"]:
            return Verdict("write_side", title, "warn", ev, why,
                        f"{m['overran']} save(s) of run {m['run_id']} ran into the next interval: lengthen the "
                        "interval, save asynchronously (DCP async_save), or write to faster storage")
    if total and dirty_now > 0.1 * total:
        return Verdict("write_side", title, "warn", ev, why,
                       f"{human_bytes(dirty_now)} waiting for writeback now: stagger saves, or lower vm.dirty_background_ratio")
    if limit and f.bytes > limit:
        return Verdict("write_side", title, "warn", ev, why,
                       "a save of this size stalls at the dirty limit: sysctl -w vm.dirty_background_ratio=5 so writeback "
                    "starts early, and fsync per shard; or save to local NVMe and drain asynchronously")
    return Verdict("write_side", title, "ok", ev, why, "none")


def readable(f: Facts) -> Verdict:
    why = "a file the restoring user cannot read fails the restore; a directory it cannot enter hides files"
    title = "Readable by this user"
    ev = {"unreadable": [f"{p}: {why_}" for p, why_ in f.unreadable[:20]], "unreadable_count": len(f.unreadable)}
    if f.unreadable:
        return Verdict("readable", title, "fail", ev, why,
                       "give the job's user read access (chmod -R u+rX, or chown to that user), or run as that user")
    return Verdict("readable", title, "ok", ev, why, "none")


def restore_efficiency(f: Facts) -> Verdict:
    """A short cold restore against this box's floor (judged only when the check measured one: see evaluate)."""
    return efficiency.judge(f.floor_facts or efficiency.FloorFacts(why="not measured by this check"),
                            advice(_measured(f), f.preset))


RULES = (concurrency, small_files, network_path, mount_options, limits_and_interference, oom, device_mapping,
         cold_cache, write_side, readable)


on_fuse = checklist_fuse.on_fuse


def evaluate(f: Facts) -> list[Verdict]:
    """Whether the checkpoint loads first (nothing else matters if it does not), every rule, the FUSE item after the
    mount options when the source sits on a FUSE mount, and the restore efficiency last when the check measured the
    floor."""
    items = [loads.judge(f.headers, f.floor_facts.restore if f.floor_facts else None)] + [rule(f) for rule in RULES]
    if on_fuse(f):
        items.insert(1 + RULES.index(mount_options) + 1, fuse_mount(f))  # after the loads item and mount options
    if f.floor_facts is not None:
        items.append(restore_efficiency(f))
    return items


def report(source: str, items: list[Verdict], layout: dict | None = None, named: str | None = None) -> dict:
    """The checklist's document; `layout`: which checkpoint of the folder was checked and why; `named`: what each
    fix's commands name where they say SOURCE (the checkpoint --pick chose: no fix command takes --pick), else
    `source`."""
    counts = {v: sum(1 for i in items if i.verdict == v) for v in VERDICTS}
    shown = [i.to_json() | {"fix": name_source(i.fix, named or source)} for i in items]
    return {"source": source, "layout": layout, "items": shown, "summary": counts, "ok": counts["fail"] == 0}


def evidence_text(key: str, value) -> str:
    """One evidence figure as `check`, its Markdown and the dashboard show it: in its key's units (human_figure)."""
    return human_figure(key, value, SHARES)


def evidence_line(evidence: dict) -> str:
    """The evidence's plain figures on one line (its lists and tables are the JSON's)."""
    return ", ".join(f"{k}={evidence_text(k, v)}" for k, v in evidence.items() if not isinstance(v, (dict, list)))


def markdown(doc: dict, note=lambda text: text) -> str:
    """The report as a markdown table, each item's floor notes (a busy box, a figure kept) under its why, as `note`
    words them."""
    lay = doc.get("layout") or {}
    picked = [f"checked {picked_name(lay.get('root'), lay.get('tag'))} ({lay['name']}): "
              f"{picked_why(lay.get('root'), lay.get('tag'), lay['why'])}", ""] if lay.get("why") else []
    lines = [f"# ckptbench check: {doc['source']}", "", *picked,
             " · ".join(f"{k}: {v}" for k, v in doc["summary"].items()), "",
             "| item | verdict | evidence | fix |", "|---|---|---|---|"]
    for i in doc["items"]:
        ev = evidence_line(i["evidence"])
        lines.append(f"| {i['title']} | **{i['verdict']}** | {ev.replace('|', '/')} | {i['fix'].replace('|', '/')} |")
    lines += [""] + [f"- **{i['title']}**: {i['why']}" + "".join(f"\n  - note: {note(n)}"
                                                                  for n in i["evidence"].get("notes") or [])
                     for i in doc["items"]]
    return "\n".join(lines) + "\n"
