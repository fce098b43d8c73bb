"""Why a watched restore was slow: the job's own figures against what this storage gives ckptbench on the same
files, read the same way it measures everything (cold where it can evict, otherwise said), and against this box's
floor (what `ckptbench floor` measured and cached), with the fix."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ckptbench.system import binding, probes
from ckptbench.system import floor as fl
from ckptbench.core.errors import name_source
from ckptbench.core.units import human_bytes, human_pct
from ckptbench.core.verdicts import Verdict
from ckptbench.watch.results import source_of
from ckptbench.watch.phases import CPU_BUSY, FAULT_BYTES
from ckptbench.watch.sampler import WatchReport
from ckptbench.watch.window import finer

KINDS = ("storage-bound", "loader-cpu-bound", "loader-parallelism-bound", "fault-bound", "network-bound",
         "memory-pressure-bound", "unknown")
LOADER_BOUND_RATIO = 1.5  # the storage gives at least this multiple of the loader's rate: the loader holds it back
AT_FLOOR = 0.9  # a loader at this share of the box's floor or more is held back by the box, not by itself
STORAGE_FIX = ("the storage is the limit: faster or striped storage, a local cache of the checkpoint, or fewer bytes "
               "(compare formats); `ckptbench check` lists its settings")
BOX_BOUND = {"storage": ("storage-bound", STORAGE_FIX),
             "network": ("network-bound", "the link is the limit: a closer endpoint, more bandwidth, or fewer bytes; "
                                          "`ckptbench check` lists the endpoint's settings")}
# the classes a loader's rate against the storage's decides: a floor under the fixed costs leaves them undecided
RATE_KINDS = ("storage-bound", "loader-cpu-bound", "loader-parallelism-bound", "fault-bound")
RETRANS_BAD = 0.01
MEMORY_BAD = 0.9


@dataclass(frozen=True)
class StorageProbe:
    gbps: float | None
    cache: str  # what the probe read: "cold (verified)", "as-is, 87% cached", ...
    files: int
    bytes: int


BOTTLENECK = "bottleneck"
TITLE = "Why the restore was slow"
ALIASES = {"kind": "verdict", "summary": "why"}  # a watch document's keys before verdicts were one type


def _verdict(kind: str, summary: str, evidence: dict, fix: str) -> Verdict:
    return Verdict(BOTTLENECK, TITLE, kind, evidence, summary, fix, ALIASES)


def probe_storage(paths: list[str], *, concurrency: int = 16) -> StorageProbe:
    """The same files read by ckptbench (fastio, --read auto), cold when they can be evicted."""
    from ckptbench.restore.reading import read_source
    from ckptbench.sources import ReadOptions, open_targets

    paths = [p for p in paths if os.path.isfile(p)]
    if not paths:
        return StorageProbe(None, "no checkpoint file to read (none seen open or mapped, or gone since)", 0, 0)
    source = open_targets(paths)
    listing = source.list()
    report = read_source(source, listing, ReadOptions(concurrency=concurrency, read="auto", hash="none"),
                         cache="cold")
    c = report.cache
    cache = "cold (verified)" if c.verified else f"not cold: {human_pct(c.residency_before)} stayed cached ({c.note})"
    return StorageProbe(report.read_gbps, cache, len(paths), report.result.bytes)


FLOOR_KEYS = fl.FIELDS


def floor_fields(w: WatchReport, files: list[str] | None = None) -> dict:
    """The watched restore against this box's floor: its bytes over the figures `ckptbench floor` cached for the
    files' mount, against its reading window. A watch never measures the floor: that would evict the loader's
    files while it reads them. `files` are the checkpoint's (--source), else the ones the job opened or mapped."""
    paths = files or sorted(w.files)
    if not w.bytes or not paths:
        return dict.fromkeys(FLOOR_KEYS) | {"floor_times_s": {}, "floor_note": "no checkpoint bytes seen read: "
                                            "nothing to hold against this box's floor"}
    if (short := _unseen(w)):
        return dict.fromkeys(FLOOR_KEYS) | {"floor_times_s": {}, "floor_note": short}
    m = probes.mount_of(paths[0])
    mount = fl.mount_key({"mount_point": m.mount_point, "fs_type": m.fs_type}) if isinstance(m, probes.Mount) else None
    untimed = w.reading.note  # the bytes are known, the time they took is not: a floor, and no efficiency
    out = dict.fromkeys(FLOOR_KEYS) | fl.restore_fields(fl.cached(mount), bytes_read=restore_bytes(w),
                                                        measured_s=None if untimed else w.io_span_s or None,
                                                        hash_alg="none", hot=bool(w.hot))
    # every command in the note names these files' checkpoint, as `run` does: `floor DIR --remeasure` too
    out["floor_note"] = name_source(out["floor_note"], checkpoint_of(w, paths))
    if untimed and out["floor_s"] is not None:
        out["floor_note"] = f"no efficiency: {untimed}; {out['floor_note']}"
    return out


def checkpoint_of(w: WatchReport, paths: list[str] | None = None) -> str:
    """The checkpoint a command in a note or fix should name: --source as given, else the directory of the files
    the job was seen to read ("" when none)."""
    return w.source or source_of(paths or sorted(w.files))


def _files_total(w: WatchReport) -> int:
    """The size of the files the job itself opened, mapped or read between samples (`files` holds them all), each
    once whatever name it came by: a load of the weights out of a checkpoint that holds an optimizer too read all
    it wanted, and is held to the weights, not to every file of --source."""
    return sum({os.path.realpath(p): n for p, n in w.files.items()}.values())


def restore_bytes(w: WatchReport) -> int:
    """The bytes the floor is sized on: for a job that mapped its files or read one between samples, the files
    whole, as its count of them is a lower bound (and _unseen refuses one under SEEN_MIN of them; a cold load sized
    on the 576 of its 1008 MiB counted read at 37 % of a floor it beat); its count when that is more (a file it read
    that the watch never saw it hold, without --source). A job that only read through read calls is counted exactly,
    and may read part of a file: its count."""
    total = _files_total(w)
    return max(w.bytes, total) if (w.mapped or w.unseen) else w.bytes


SEEN_MIN = 0.9  # of the bytes of the files the job mapped: less, and the watch missed what it read


def _unseen(w: WatchReport) -> str:
    """Why the job's bytes cannot be held to the floor, or "": a job that maps its files, or reads one between two
    samples, is counted from its mappings' pages, the disk's counter and the pages that came into the page cache,
    each a lower bound. A hot load maps, reads and unmaps a shard between two samples (1 GiB in 0.1 s): a new user's
    was 'at 11 % of this box's floor' on 129 MB of its 1.06 GB; and cold, the disk's counter missed read-ahead (576
    of 1008 MiB, 'at 37 %' of a loader at 140 %). Read calls alone are counted whole (rchar)."""
    if not (w.mapped or w.unseen):
        return ""
    total = _files_total(w)
    if not total or w.bytes >= SEEN_MIN * total:
        return ""
    # in the headline's unit: "read at least 215.6 MiB" stood above "it counted 0.23 of the files' 0.27 GB"
    counted = f"it counted {human_bytes(w.bytes)} of the files' {human_bytes(total)}"
    if w.hot:
        # cold, the pages that come into the page cache count it however it read; --source only when not given
        how = "watch it with the files cold" + ("" if w.source else " and `--source DIR`")
        return (f"no efficiency: the job maps its files from the page cache faster than the watch samples its mappings "
                f"({counted}); {how}: the pages that come into the page cache are counted however the job read them")
    return (f"no efficiency: the job's bytes are undercounted ({counted}: its read calls, its mappings' pages, the "
            "disk's counter and the pages that came into the page cache all saw less); it may have read only part of "
            "them, or the box let go of pages as it read (memory pressure)"
            + ("" if w.unseen or w.arrived_bytes or w.source else "; `--source DIR` counts the pages of files it "
                                                                  "reads between two samples"))


HOT_MAPPED = ("it mapped its files from the page cache, faster than the watch samples: a mapping made, read and let go "
              "of between two samples is not seen, and nothing comes into the page cache to show it")


def lower_bound(w: WatchReport) -> str:
    """Why the job's bytes, and so its rate, are only a lower bound, or "" when they are counted whole: a count known
    to be short (_unseen), or a hot load through mappings, which can slip between samples unseen (a new user's hot
    load of 1008 MiB in 0.39 s read "388.3 MiB ... 0.87 GB/s", given as its rate)."""
    if (short := _unseen(w)):
        return short.removeprefix("no efficiency: ")
    return HOT_MAPPED if w.hot and (w.mapped or w.unseen) else ""


def floor_sentence(floor: dict | None) -> str:
    """"your loader runs at 31 % of this box's floor (floor 1.71 s, bound by storage 2.1 GB/s)", or "" unknown."""
    if not floor or floor.get("floor_s") is None or floor.get("efficiency") is None:
        return ""
    return (f"your loader runs at {human_pct(floor['efficiency'])} of this box's floor "
            f"(floor {floor['floor_s']:.3f} s, bound by {binding.text(floor)})")  # as the floor line says it


PICKLED = (".bin", ".pt", ".pth", ".ckpt", ".pkl")  # torch.save's: unpickled a tensor at a time, in Python


def _one_thread_fix(files) -> str:
    """The fix for a loader one thread holds up, by what it reads: safetensors already (a new user loading them was
    told to use safetensors), or pickled state (deserialized in Python, one object at a time)."""
    names = [str(p).lower() for p in files]
    pickled = any(n.endswith(PICKLED) for n in names)
    if names and not pickled and all(n.endswith(".safetensors") for n in names):
        return ("load the shards in parallel (a thread per shard: safetensors copies with the GIL released), or use "
                "a parallel loader (ckptbench's, Run:ai Model Streamer)")
    if pickled or not names:
        return ("load shards in parallel (one thread or process per shard), avoid per-tensor Python work "
                "(safetensors instead of pickle), or use a parallel loader")
    return "load shards in parallel (one thread or process per shard), or use a parallel loader"


def judge(w: WatchReport, storage: StorageProbe, *, cpus: int | None = None, mem_total: int | None = None,
          floor: dict | None = None) -> Verdict:
    """The class of bottleneck, with the evidence that decides it and the fix; with `floor` (floor_fields), the
    loader's share of this box's floor leads the summary and joins the evidence."""
    v = _judge(w, storage, cpus=cpus, mem_total=mem_total)
    # its commands name the checkpoint, as the floor's note does: `ckptbench sweep` alone is refused for no SOURCE
    v = replace(v, fix=name_source(v.fix, checkpoint_of(w) or None))
    if floor is None:
        return v
    evidence = v.evidence | {k: floor.get(k) for k in ("floor_s", "efficiency", "binding", "binding_gbps", "binding_how")}
    said = floor_sentence(floor)
    eff, box = floor.get("efficiency"), BOX_BOUND.get(floor.get("binding") or "")
    if fl.says_little(floor.get("floor_s")) and v.verdict in RATE_KINDS:
        return _too_small(v, evidence, floor["floor_s"])
    if said and w.bytes and eff > fl.OVER_FLOOR:  # said: there is an efficiency
        return _over_floor(v, evidence, said, checkpoint_of(w))
    if said and w.bytes and eff >= AT_FLOOR and box and v.verdict.startswith("loader-"):
        # the loader is at the floor (within a good ceiling's spread), and the floor is the device's or the link's:
        # the re-read that called it slow read into buffers it reuses, which the loader's fresh destination cannot
        # (a new user saw "runs at 112 % of this box's floor" and "loader-cpu-bound" in one verdict; over 105 % the
        # floor itself is wrong, _over_floor)
        kind, fix = box
        return replace(v, verdict=kind, evidence=evidence, fix=fix,
                       why=f"{said}: the {floor['binding']} sets this restore's time, not the loader (ckptbench's "
                           f"re-read into buffers it reuses, faster, does not land bytes in fresh memory: {v.why})")
    return replace(v, evidence=evidence, why=f"{said}; {v.why}" if said and w.bytes else v.why)


def source_files(source: str | None, pick: str | None = None) -> tuple[list[str], int | None]:
    """The checkpoint the job restores, when named (`pick`: which of a folder's several): its files (what the
    verdict reads) and its size (the ETA)."""
    if not source:
        return [], None
    from ckptbench.sources import open_source

    listing = open_source(source, pick).list()
    return [f.path for f in listing.files], listing.bytes


def document(w: WatchReport, files: list[str] | None = None, *, judge_it: bool = True) -> dict:
    """A watch's document, as `watch --json` prints it and the watch screen shows it: the report, whether its bytes
    are a lower bound (`count_note`), the floor fields and their sentence, and unless `judge_it` is false the storage
    re-read (cold: it evicts the files) and the verdict. `files`: the checkpoint's files under `--source`."""
    doc = w.to_json()
    doc["count_note"] = lower_bound(w)  # "" when the bytes (and the rate) are counted whole
    floor = floor_fields(w, files)  # from the floor `ckptbench floor` cached: never measured here
    doc |= floor | {"floor_sentence": floor_sentence(floor)}
    if judge_it:
        probe = probe_storage(files or sorted(w.files))
        doc["storage"] = {"gbps": probe.gbps, "cache": probe.cache, "files": probe.files, "bytes": probe.bytes}
        doc["verdict"] = judge(w, probe, floor=floor).to_json()
    return doc


def _too_small(v: Verdict, evidence: dict, floor_s: float) -> Verdict:
    """No class of bottleneck for a checkpoint whose floor is under the fixed costs: what the job spent went to
    opening files, parsing headers and its own start, not to the bytes (a 35 KiB checkpoint loaded by safetensors'
    load_file was "loader-cpu-bound" at 0.2 % of the floor, told to load its shards in parallel)."""
    return replace(v, verdict="unknown", evidence=evidence | {"too_small": True},
                   why=f"the checkpoint is too small to judge its loader by: its floor, {floor_s * 1e3:.1f} ms, is "
                       f"under the {fl.FIXED_COSTS_S * 1e3:.0f} ms that opening files, parsing headers and starting "
                       f"threads take (the rates alone said {v.verdict}: {v.why})",
                   fix="watch the restore of a checkpoint of tens of MiB or more")


def _over_floor(v: Verdict, evidence: dict, said: str, source: str) -> Verdict:
    """The verdict beside a floor the loader beat by more than a good ceiling's spread: that floor is wrong (a ceiling
    measured low), so it cannot say the box binds; the loader's own diagnosis stands (a loader at 255 % of a floor
    measured low was called storage-bound, and told to buy faster storage, beside one thread at 88 % of a core)."""
    again = name_source("`ckptbench floor SOURCE --remeasure`", source or None)
    return replace(v, evidence=evidence | {"floor_unreliable": True},
                   why=f"{said}: over the {human_pct(fl.OVER_FLOOR)} a good ceiling allows, so that floor is "
                       f"unreliable (a ceiling measured low: {again} when the box is quiet) and the verdict is the "
                       f"loader's own evidence; {v.why}")


def _median(values: list, empty):
    return sorted(values)[len(values) // 2] if values else empty


def _watch_again(w: WatchReport) -> str:
    """How to watch a load too short to time again: with what this watch lacked (--source, a finer interval)."""
    lacked = [x for x in ("" if w.source else "`--source DIR`", finer(w.interval_s, "{}")) if x]
    return f"watch it with {' and '.join(lacked)}, the files cold" if lacked else "watch it with the files cold"


LOAD_PHASES = ("reading", "faulting", "deserializing")  # a load's work: not its start, its freeing, nor its waits


def _load_intervals(w: WatchReport) -> list:
    """The intervals the load's thread and device figures are taken over: those of its reading window that read,
    faulted or deserialized (not the job's start, nor its teardown or what it did after); the whole watch's when
    the window holds none."""
    t0, t1 = w.window
    inside = [i for i in w.intervals if i.phase in LOAD_PHASES and min(i.t1, t1) > max(i.t0, t0)]
    return inside or [i for i in w.intervals if i.phase in LOAD_PHASES]


def _judge(w: WatchReport, storage: StorageProbe, *, cpus: int | None, mem_total: int | None) -> Verdict:
    cpus = cpus or os.cpu_count() or 1
    if mem_total is None:
        mi = probes.meminfo()
        mem_total = mi.get("MemTotal") if isinstance(mi, dict) else None
    io = _load_intervals(w)
    loader = w.loader_gbps
    # medians over the same intervals: a thread at 80 % or more in most of them is a busy one in most of them, so the
    # busy count is 1 or more beside it (the busiest of any one interval beside a median of 0 read "one thread at
    # 100 % of a core did the work (0 busy thread(s))")
    top = _median([i.top_thread_cores for i in io], 0.0)
    busy = _median([i.busy_threads for i in io], 0)
    cores = _median([i.cpu_cores for i in io], 0.0)
    fault_share = min(1.0, w.majflt * FAULT_BYTES / w.bytes) if w.bytes else 0.0
    ratio = storage.gbps / loader if storage.gbps and loader > 0 else None
    util = _median([i.device_util_pct for i in io if i.device_util_pct is not None], None)
    doubt = _unseen(w) or w.reading.note  # the loader's rate is a lower bound: it cannot be called slow on it
    evidence = {"loader_gbps": None if w.untimed else round(loader, 3),
                "storage_gbps": round(storage.gbps, 3) if storage.gbps else None, "storage_read": storage.cache,
                "bytes": w.bytes, "io_span_s": round(w.io_span_s, 3),
                "intervals_judged": len(io), "busiest_thread_cores_median": round(top, 2), "busy_threads_median": busy,
                "cpu_cores_median": round(cores, 2), "count_or_time_doubt": doubt or None,
                "cpus": cpus, "major_faults": w.majflt, "peak_rss_bytes": w.peak_rss_bytes,
                "tcp_retransmit_rate": w.tcp_retransmit_rate, "sockets_peak": w.sockets_peak,
                "device_util_pct_median": round(util, 1) if util is not None else None}
    got = f"the loader got {'at least ' if lower_bound(w) else ''}{loader:.2f} GB/s"  # as the headline says it
    if w.untimed:
        got = "the loader's rate is unknown (no sample saw it reading its files: too short to time)"
    # into which memory, as the floor says its storage rates: "gives 2.16 GB/s" stood beside the floor's "storage
    # (1.28 GB/s read into fresh memory)" of the same files, and a new user could not tell which was the storage's
    gives = f"this storage gives {storage.gbps:.2f} GB/s to ckptbench read into reused buffers, {storage.cache}" \
        if storage.gbps else \
        f"the storage could not be measured ({storage.cache})"
    if w.bytes == 0 and w.exit_code is not None:  # started here: watched from its first instant, so it read none
        return _verdict("unknown", "the job read no file that looks like a checkpoint's while it ran", evidence,
                        f"check that the job loads the files under --source ({w.source}); a hot load (from the page "
                        "cache, read or mapped) can open, read and let go of them between two samples: watch it "
                        f"with the files cold{finer(w.interval_s, ', or with {}')}" if w.source else
                        "name the checkpoint: `ckptbench watch --source DIR -- COMMAND` counts every file under DIR")
    if w.bytes == 0:
        return _verdict("unknown", "the job read nothing while watched (it had finished before the first sample, or "
                       "it maps files that do not look like a checkpoint's)", evidence,
                       "watch from the start: `ckptbench watch -- COMMAND`, or give a longer restore")
    if w.sockets_peak and w.tcp_retransmit_rate is not None and w.tcp_retransmit_rate > RETRANS_BAD:
        return _verdict("network-bound", f"{got}; {human_pct(w.tcp_retransmit_rate)} of TCP segments were "
                       "retransmitted while it read", evidence,
                       "the network or the object store is dropping or throttling: fewer concurrent requests, "
                       "larger parts, or a closer endpoint; check `ckptbench check SOURCE` for the endpoint")
    if mem_total and w.peak_rss_bytes > MEMORY_BAD * mem_total:
        return _verdict("memory-pressure-bound", f"{got}; its memory peaked at {human_bytes(w.peak_rss_bytes)} of "
                       f"{human_bytes(mem_total)}", evidence,
                       "load shard by shard into the model (meta-device init, assign=True) instead of a whole "
                       "state dict plus a model; or restore fewer ranks per node")
    if ratio is not None and ratio >= LOADER_BOUND_RATIO and doubt:
        return _verdict("unknown", f"the loader got at least {loader:.2f} GB/s; {gives}; it cannot be called slow on "
                       f"that: {doubt.removeprefix('no efficiency: ')}", evidence,
                       f"mark the load (`from ckptbench.mark import stage`) and {_watch_again(w)}")
    if ratio is not None and ratio >= LOADER_BOUND_RATIO:
        if fault_share >= 0.5:
            return _verdict("fault-bound", f"{got}; {gives}; most bytes came in through page faults "
                           f"({w.majflt} major faults): the loader maps the files and reads them a fault at a time",
                           evidence, "read the files with large parallel reads instead of through mmap (safetensors "
                           "load from bytes, or ckptbench's loader); on a network filesystem raise read-ahead")
        if top >= 0.8 and busy <= 1:
            return _verdict("loader-cpu-bound", f"{got}; {gives}; one thread at {human_pct(top)} of a core did the "
                           f"work, the only busy one (medians over the {len(io)} intervals of the load): "
                           "single-threaded deserialization or read loop", evidence, _one_thread_fix(w.files))
        if cores >= CPU_BUSY * cpus:
            return _verdict("loader-cpu-bound", f"{got}; {gives}; the job kept {cores:.1f} of {cpus} cores busy",
                           evidence, "the CPUs are the limit: fewer copies (load in place), or more cores per rank")
        return _verdict("loader-parallelism-bound", f"{got}; {gives}; the job's threads mostly waited "
                       f"({cores:.1f} cores busy): too few reads in flight for this storage", evidence,
                       "read with more concurrency (several files or chunks at once); `ckptbench sweep SOURCE` "
                       "shows the concurrency where this storage stops gaining")
    if w.untimed:  # check would not time this job either: a mark, or finer samples, would
        return _verdict("unknown", f"{got}; {gives}", evidence,
                        f"mark the load (`from ckptbench.mark import stage`) and {_watch_again(w)}")
    if ratio is None:
        return _verdict("unknown", f"{got}; {gives}", evidence,
                        "run `ckptbench check SOURCE` on the checkpoint directory")
    busy_dev = f"; the device was {human_pct(util / 100)} busy" if util is not None else ""
    return _verdict("storage-bound", f"{got}; {gives}: the loader is within {LOADER_BOUND_RATIO:g}× of what the storage "
                   f"delivers{busy_dev}", evidence, STORAGE_FIX)
