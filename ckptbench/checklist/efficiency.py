"""Restore efficiency: a short cold restore of the source's largest files held against this box's floor (its measured
ceilings), the resource that binds named, and a fix for where the gap is.

An object store's floor is its network figure, taken from the cache `ckptbench floor s3://...` fills, never measured
here: that figure is the best of a concurrency sweep (up to three reads of 256 MiB, each egress and seconds to
minutes on a slow link), and the one read check can afford, at its own concurrency, would hold the restore against
itself. So check reads the floor's sample once, as the restore, and only when there is a figure to hold it against.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

import fastio

from ckptbench.core.errors import CkptbenchError, printable
from ckptbench.core.units import human_bytes, human_pct
from ckptbench.core.verdicts import Verdict
from ckptbench.restore.efficiency import hash_of
from ckptbench.restore.sweep import Advice
from ckptbench.system import binding
from ckptbench.system import floor as fl
from ckptbench.system import pagecache, probes, readmode

ID, TITLE = "efficiency", "Restore efficiency"
GOOD = 0.85  # at or above this share of the floor a restore is as fast as this box allows
WHY = ("a restore slower than the box's own ceilings (storage, fresh memory, copy, hashing) leaves time on the table; "
       "the ceiling that binds says where to look")
FLOOR_CMD = "`ckptbench floor SOURCE` (64 MiB or more of files on the same mount)"
FRESH_WORDS = "fresh memory (a restore's)"  # where the short restore's bytes land: said beside its rate
# the words `run` adds to its floor note under FIXED_COSTS_S (system/floor.py:restore_fields)
TOO_SMALL = (f"a floor under {fl.FIXED_COSTS_S * 1e3:.0f} ms counts the bytes alone: at this size opening files, "
             "parsing headers and starting threads outweigh them, so the efficiency says little")
LINK_CMD = "`ckptbench floor {source}` (the link's rate per endpoint and bucket, cached for a day)"


@dataclass(frozen=True)
class RestoreProbe:
    """The short restore this check ran: the sample's bytes read cold into fresh memory and hashed."""

    bytes: int
    files: int
    seconds: float
    hash: str
    read: str
    concurrency: int
    cold: bool  # eviction verified: the bytes came from the device, not the page cache
    residency_before: float
    part_size: int = 0  # an object store's bytes per ranged GET; 0 for files
    # the files read whole whose digest the manifest records: how many matched, and what differed in the others (a
    # restore refuses those; the bytes were hashed anyway, so the check says so)
    digests_matched: int = 0
    mismatches: tuple[str, ...] = ()


@dataclass(frozen=True)
class FloorFacts:
    """The floor and the short restore, or why there are none (then `why` says what to run)."""

    floor: fl.Floor | None = None
    restore: RestoreProbe | None = None
    why: str = ""
    thp_enabled: str | probes.Unknown | None = None
    thp_defrag: str | probes.Unknown | None = None


def thp_mode(name: str, root: str = "/") -> str | probes.Unknown:
    """The [selected] word of /sys/kernel/mm/transparent_hugepage/<name> (enabled, defrag)."""
    path = os.path.join(root, "sys/kernel/mm/transparent_hugepage", name)
    try:
        with open(path) as f:
            words = f.read().split()
    except OSError as exc:
        return probes.Unknown(f"{path}: {exc.strerror or exc}")
    return next((w.strip("[]") for w in words if w.startswith("[")), probes.Unknown(f"{path}: no [selected] mode"))


def _sample(files: list[tuple[str, int]]) -> list[fastio.FileSpec]:
    """The largest files up to the floor's storage sample; the last one cut to a prefix so no more is read."""
    out, total = [], 0
    for path, size in sorted(files, key=lambda ps: -ps[1]):
        if total >= fl.STORAGE_SAMPLE:
            break
        take = min(size, fl.STORAGE_SAMPLE - total)
        out.append(fastio.FileSpec(path, size) if take == size else fastio.FileSpec(path, take, 0))
        total += take
    return out


def reference_of(listing, hash_alg: str) -> dict[str, tuple[int, str]]:
    """Each file's (size, digest) as the manifest records them, by path, where it records digests of `hash_alg`."""
    man = listing.manifest
    if man is None or man.hash == "none" or man.hash != hash_alg:
        return {}
    return {os.path.normpath(os.path.join(listing.source, e.path)): (e.bytes, e.digest) for e in man.files}


def _matched(res, specs: list[fastio.FileSpec], reference: dict[str, tuple[int, str]],
             hash_alg: str) -> tuple[int, tuple[str, ...]]:
    """How many of the files read whole matched the manifest's digest, and a line for each that did not."""
    whole = {s.path for s in specs if s.offset is None}
    matched, bad = 0, []
    for r in res.files:
        ref = reference.get(os.path.normpath(r.path))
        if r.path not in whole or ref is None or r.error is not None or r.bytes != ref[0]:
            continue
        if r.digest == ref[1]:
            matched += 1
        else:
            bad.append(f"{printable(r.path)}: {hash_alg} {r.digest}, manifest says {ref[1]}")
    return matched, tuple(bad)


def short_restore(files: list[tuple[str, int]], concurrency: int, hash_alg: str,
                  reference: dict[str, tuple[int, str]] | None = None) -> RestoreProbe:
    """Reads the sample cold (evicted, checked) into fresh anonymous memory with the read path a cold restore takes,
    hashing as the manifest does, and matches each file read whole against `reference` (reference_of); raises
    CkptbenchError when a file cannot be read."""
    specs = _sample(files)
    paths = sorted({s.path for s in specs})
    cond = pagecache.prepare(paths, "cold")
    mode = readmode.choose([(s.path, s.size) for s in specs], cond.residency_before, 1 << 20).mode
    t0 = time.perf_counter()
    res = fastio.read_files(specs, concurrency=concurrency, read=mode, hash=hash_alg, into_memory=True, nofollow=True)
    seconds = time.perf_counter() - t0
    if res.failed:
        raise CkptbenchError(f"{res.failed[0].path}: unreadable ({res.failed[0].error.message})")
    matched, mismatches = _matched(res, specs, reference or {}, hash_alg)
    return RestoreProbe(res.bytes, len(specs), seconds, hash_alg, mode, concurrency, cond.verified,
                        cond.residency_before, digests_matched=matched, mismatches=mismatches)


def gather(source, listing, concurrency: int, root: str = "/", unreadable: frozenset[str] = frozenset(),
           measure: bool = True) -> FloorFacts:
    """The floor (measured now, or this box's cached figures; the cached ones only without `measure`) and a short
    restore of the files this user can read (the readable item judges the rest); fails soft into `why`."""
    thp = {"thp_enabled": thp_mode("enabled", root), "thp_defrag": thp_mode("defrag", root)}
    if not source.files_on_disk:
        return _gather_link(source, listing, concurrency, thp)
    files = [(f.path, f.size) for f in listing.files if f.size and f.path not in unreadable]
    if not files:
        return FloorFacts(why=f"{listing.source}: no readable file with bytes; point check at a checkpoint", **thp)
    alg = hash_of(None, listing)  # the manifest's (validated when it was read), else none
    mount = fl.mount_key(source.describe())
    floor = None if measure else fl.cached(mount)
    if not measure and floor is None:
        return FloorFacts(why=f"{fl.not_measured()}; then run this item again", **thp)
    try:
        floor = floor or fl.measure(files, mount)
        probe = short_restore(files, concurrency, alg, reference_of(listing, alg))
    except (CkptbenchError, fastio.FastIOError, OSError) as exc:
        return FloorFacts(why=f"the floor could not be measured: {exc}; fix that, then run {FLOOR_CMD}", **thp)
    return FloorFacts(floor, probe, **thp)


def _gather_link(source, listing, concurrency: int, thp: dict) -> FloorFacts:
    """An object store's floor from the cache (see the module's note) and one read of the floor's own sample."""
    mount = fl.mount_key(source.describe())
    floor = fl.cached(mount)
    if floor is None or not fl.storage_usable(floor):
        return FloorFacts(why=f"{listing.source}: no network figure cached for {mount} on this box (check does not "
                              f"sweep the link); run {LINK_CMD.format(source=listing.source)}, then check again",
                          **thp)
    chosen = dict(fl.link_sample([(f.path, f.size or 0) for f in listing.files]))
    if not chosen:
        return FloorFacts(why=f"{listing.source}: no object with bytes; point check at a checkpoint", **thp)
    alg = hash_of(None, listing)
    try:
        probe = short_link_read(source, listing, chosen, concurrency, alg)
    except (CkptbenchError, fastio.FastIOError, OSError) as exc:
        return FloorFacts(why=f"the short restore could not read {listing.source}: {exc}", **thp)
    return FloorFacts(floor, probe, **thp)


def short_link_read(source, listing, chosen: dict[str, int], concurrency: int, hash_alg: str) -> RestoreProbe:
    """The floor's sample (its largest objects, up to floor.LINK_SAMPLE) read once into fresh memory through the
    source's own client at `concurrency`, hashed as the manifest does: the restore at the check's settings."""
    import dataclasses

    from ckptbench.sources import ReadOptions, drive

    sample = dataclasses.replace(listing, files=[f for f in listing.files if f.path in chosen])
    opts = ReadOptions(concurrency=concurrency, hash=hash_alg)
    driven = drive(lambda: source.start_read(sample, opts, into="memory"))
    if driven.result.failed:
        bad = driven.result.failed[0]
        raise CkptbenchError(f"{bad.path}: unreadable ({bad.error.message})")
    return RestoreProbe(driven.result.bytes, len(sample.files), driven.wall_s, hash_alg, "ranged GET", concurrency,
                        True, 0.0, opts.part_size)  # no local page cache: every read is cold


# ---- the verdict -------------------------------------------------------------------------------------------------

def _ceiling(c: fl.Ceiling | None) -> dict | None:
    return None if c is None else {"gbps": round(c.gbps, 3), "method": c.method, "age_s": round(c.age_s)}


def _kernels(floor: fl.Floor) -> dict[str, float]:
    return {k.removeprefix("hash_"): c.gbps for k, c in floor.ceilings.items() if k.startswith("hash_")}


def ceilings(floor: fl.Floor, hash_alg: str, nbytes: int = 0) -> dict:
    """Every ceiling the model holds a restore against: rate, method, age (storage, fresh memory, copy, cpu)."""
    storage = _ceiling(floor.storage)
    if storage is not None:
        storage["sample_bytes"] = floor.storage.sample_bytes
        storage["usable"] = fl.storage_usable(floor)
    else:
        storage = {"missing": f"not measured for this {'endpoint' if floor.resource == 'network' else 'mount'}"}
    fresh = _ceiling(fl.populate_ceiling(floor, nbytes))
    if fresh is not None:
        fresh |= {f"{k}_gbps": round(floor.ceilings[k].gbps, 3) for k in ("populate_4k", "populate_thp")
                  if k in floor.ceilings}
    cpu = _ceiling(floor.ceilings.get(f"hash_{hash_alg}")) or {"hash": "none"}
    cpu |= {"hash": hash_alg, "per": "core", "cores": floor.box.get("cores"),
            "kernels_gbps": {k: round(v, 3) for k, v in _kernels(floor).items()}}
    if "scan" in floor.ceilings:
        cpu["scan_gbps"] = round(floor.ceilings["scan"].gbps, 3)
    out = {floor.resource: storage, "fresh memory": fresh, "page cache copy": _page_cache(floor), "cpu": cpu}
    if (link := _ceiling(floor.ceilings.get("h2d_pinned"))) is not None:  # a box with a GPU
        out["host-to-device"] = link | ({"pageable_gbps": round(floor.ceilings["h2d_pageable"].gbps, 3)}
                                        if "h2d_pageable" in floor.ceilings else {})
    return out


def _page_cache(floor: fl.Floor) -> dict | None:
    """The page cache's copy a hot restore is held to: the mount's (pread, measured by `floor SOURCE`), else the
    memmove's, said as such."""
    if floor.storage is not None and floor.storage.hot_gbps:
        return {"gbps": round(floor.storage.hot_gbps, 3), "method": "pread out of this mount's page cache into "
                "populated memory (with its storage figure)", "age_s": round(floor.storage.age_s)} | (
            {"reused_gbps": round(floor.storage.hot_reused_gbps, 3)} if floor.storage.hot_reused_gbps else {})
    copy = _ceiling(floor.ceilings.get("copy"))
    return copy | {"note": "a memmove's rate: this mount's own is not measured"} if copy else None


def _storage_fix(probe: RestoreProbe, advised: Advice) -> str:
    m = advised.measured
    if m is not None and probe.concurrency < m.knee:
        parts = [f"raise --concurrency from {probe.concurrency} to {m.knee}, the {m.basis}"]
    elif m is not None:
        parts = [f"--concurrency {probe.concurrency} is at or past the knee already ({m.basis}), so the gap is not it"]
    else:
        parts = ["measure the knee (`ckptbench check SOURCE --quick-sweep`) and set --concurrency to it"]
    if probe.read != "direct":
        parts.append(f"this read used {probe.read}: read with O_DIRECT (--read direct) where the mount takes it")
    parts.append("check the mount (the mount-options item: read_ahead_kb, rsize, stripes)")
    return "; ".join(parts)


def _link_level(floor: fl.Floor) -> int | None:
    """The concurrency at which `ckptbench floor` measured the link's rate (its method says so)."""
    found = re.search(r"concurrency (\d+) of", floor.storage.method) if floor.storage else None
    return int(found.group(1)) if found else None


def _network_fix(floor: fl.Floor, probe: RestoreProbe, advised: Advice) -> str:
    m, level = advised.measured, _link_level(floor)
    if m is not None and probe.concurrency < m.knee:
        parts = [f"raise --concurrency from {probe.concurrency} to {m.knee}, the {m.basis}"]
    elif m is None and level and probe.concurrency < level:
        parts = [f"raise --concurrency from {probe.concurrency} to {level}, where `ckptbench floor` measured the "
                 f"link's {floor.storage.gbps:.2f} GB/s (or measure the knee: `ckptbench check SOURCE --quick-sweep`)"]
    elif m is not None or level:
        parts = [f"--concurrency {probe.concurrency} is at or past the knee already "
                 f"({m.basis if m is not None else f'the floor measured the link at concurrency {level}'}), so the "
                 "gap is not it"]
    else:
        parts = ["measure the knee (`ckptbench check SOURCE --quick-sweep`) and set --concurrency to it"]
    now = f" ({probe.part_size >> 20} MiB now)" if probe.part_size else ""
    parts.append(f"larger ranged GETs (--part-size 16M or 32M{now}) pay a request's latency fewer times per byte")
    parts.append("check the link: the endpoint's region against this box's (each request pays the distance), and any "
                 "HTTP(S) proxy on the way (HTTPS_PROXY, NO_PROXY; the network-path item)")
    return "; ".join(parts)


def _thp_advice(enabled, defrag) -> str:
    state = (f"transparent_hugepage is {enabled if isinstance(enabled, str) else 'unknown'} "
             f"(defrag {defrag if isinstance(defrag, str) else 'unknown'})")
    if enabled == "never":
        return f"{state}: echo madvise > /sys/kernel/mm/transparent_hugepage/enabled, then madvise(MADV_HUGEPAGE)"
    if enabled == "madvise":
        return f"{state}: madvise(MADV_HUGEPAGE) the destination before it is touched"
    return state


def _memory_fix(floor: fl.Floor, ff: FloorFacts) -> str:
    if not ff.restore.cold:
        pop = fl.populate_gbps(floor, ff.restore.bytes) or 0.0
        return (f"the bytes came from the page cache, and populating fresh memory for them binds ({pop:.2f} GB/s "
                "here; each page is populated, then copied into, one after the other): reuse a destination "
                "allocated once (the reused contract), or more cores")
    c4k, thp = floor.ceilings.get("populate_4k"), floor.ceilings.get("populate_thp")
    rates = ", ".join(f"{c.gbps:.2f} GB/s with {label}" for c, label in ((c4k, "4 KiB pages"), (thp, "huge pages"))
                      if c is not None)
    fix = (f"this box populates fresh memory at {rates}: that rate limits every loader that lands bytes in memory "
           "it did not own; pre-populate the destination before the restore (MADV_POPULATE_WRITE), or reuse one "
           "allocated once")
    state = _thp_advice(ff.thp_enabled, ff.thp_defrag)
    if thp is not None and (c4k is None or thp.gbps > c4k.gbps):
        return f"{fix}, or back it with huge pages ({thp.gbps:.2f} GB/s here): {state}"
    return f"{fix}; huge pages measured no faster here, so they are not the lever ({state})"


def _cpu_fix(floor: fl.Floor, probe: RestoreProbe) -> str:
    kernels = _kernels(floor)
    cores = floor.box.get("cores") or 1
    fastest = max(kernels, key=kernels.get) if kernels else None
    mine = kernels.get(probe.hash)
    what = f"hashing with {probe.hash} ({mine:.2f} GB/s per core) on {cores} core(s)" if mine else "the CPU work"
    if fastest and fastest != probe.hash:
        return (f"{what} binds: a lighter hash ({fastest}, measured {kernels[fastest]:.2f} GB/s per core here), or "
                "more cores")
    return f"{what} binds: more cores, or a structural check instead of a digest where that suffices"


def _fix(binding: str | None, floor: fl.Floor, ff: FloorFacts, advised: Advice) -> str:
    probe = ff.restore
    if binding == "storage":
        return _storage_fix(probe, advised)
    if binding == "network":
        return _network_fix(floor, probe, advised)
    if binding == "page cache":
        return ("the bytes came from the page cache (eviction did not hold): its copy binds; raise --concurrency so "
                "more cores copy, or read with mmap; for a device figure see the cold-cache item")
    if binding == "fresh memory":
        return _memory_fix(floor, ff)
    if binding == "cpu":
        return _cpu_fix(floor, probe)
    return f"nothing binds in the model; measure the floor again: {FLOOR_CMD}"


def judge(ff: FloorFacts, advised: Advice) -> Verdict:
    """ok at or above GOOD of the floor; warn below, with a fix for the binding resource; unknown without a floor, or
    with one too short to say anything (under FIXED_COSTS_S, as a run notes)."""
    if ff.floor is None or ff.restore is None:
        return Verdict(ID, TITLE, "unknown", {"reason": ff.why or "not measured"}, WHY,
                       ff.why or f"run {FLOOR_CMD}")
    floor, probe = ff.floor, ff.restore
    if probe.mismatches:  # a restore refuses these bytes: there is no restore to hold against the floor
        from ckptbench.checklist.loads import NOT_LOADED

        return Verdict(ID, TITLE, "unknown", {"reason": NOT_LOADED}, WHY, NOT_LOADED)
    m = fl.model(floor, bytes_read=probe.bytes, hash_alg=probe.hash, destination=fl.FRESH, hot=not probe.cold)
    ev = {"sample_bytes": probe.bytes, "sample_files": probe.files, "measured_s": round(probe.seconds, 4),
          "measured_gbps": round(probe.bytes / probe.seconds / 1e9, 3) if probe.seconds > 0 else None,
          "concurrency": probe.concurrency, "read": probe.read, "hash": probe.hash, "into": FRESH_WORDS,
          "cold": probe.cold,
          # the box's figures from the cache; the storage figure may still be measured now (a larger sample)
          "floor_cached": floor.cached, "storage_measured_now": floor.storage_now,
          "ceilings": ceilings(floor, probe.hash, probe.bytes),
          "notes": list(floor.notes)}
    if m["floor_s"] is None:
        return Verdict(ID, TITLE, "unknown", ev | {"reason": "no ceiling applies to this restore"}, WHY,
                       f"run {FLOOR_CMD}")
    eff = fl.efficiency(m["floor_s"], probe.seconds)
    if eff is None:
        return Verdict(ID, TITLE, "unknown", ev | {"reason": "the short restore took no measurable time"}, WHY,
                       "point check at a larger checkpoint")
    ev |= {"binding": m["binding"], "floor_s": round(m["floor_s"], 4),
           "times_s": {k: round(v, 4) for k, v in m["times_s"].items()}}
    if probe.cold and not fl.storage_usable(floor):
        # a cold restore held to the memory and CPU part of its floor: `run` gives no efficiency there (one read as
        # slow as 15 %), and this item said 32 % with a warning beside run's "no efficiency is given"
        sample = floor.storage.sample_bytes if floor.storage else 0
        ev["storage_missing"] = (f"a {human_bytes(sample)} sample, under the {fl.MIN_STORAGE_SAMPLE >> 20} MiB a "
                                 "bandwidth figure needs")
        return Verdict(ID, TITLE, "unknown", ev | {
            "reason": f"the floor has no storage figure ({ev['storage_missing']}): it counts memory and CPU only, so "
                      "no efficiency is given, as a run gives none"}, WHY,
            f"run {fl.LARGER_FLOOR_CMD}, then check again")
    eff = round(eff, 3)  # as the evidence says it: the verdict and the fix read the same figure
    ev |= {"efficiency": eff, "gap_s": round(max(0.0, probe.seconds - m["floor_s"]), 4)}
    return _verdict(eff, m, ev, ff, advised)


def _verdict(eff: float, m: dict, ev: dict, ff: FloorFacts, advised: Advice) -> Verdict:
    """The verdict on an efficiency the model gave, with its evidence."""
    if m["floor_s"] < fl.FIXED_COSTS_S:  # run says its efficiency says little at this size: no verdict on it here
        return Verdict(ID, TITLE, "unknown", ev | {"reason": TOO_SMALL}, WHY,
                       "none at this size; point check at a checkpoint of tens of MiB or more to judge its efficiency")
    if eff > fl.OVER_FLOOR:  # faster than the box can go: a ceiling read low, and the item says so, as a run does
        ev["over_floor"] = (f"the short restore ran at {human_pct(eff)} of the floor: a ceiling measured low (a busy "
                            "box, a noisy sample)")
        return Verdict(ID, TITLE, "ok", ev, WHY, "none for the restore; for the floor: `ckptbench floor SOURCE "
                                                 "--remeasure` when the box is quiet (64 MiB or more of files on the "
                                                 "same mount)")
    if eff >= GOOD:
        return Verdict(ID, TITLE, "ok", ev, WHY, "none")
    return Verdict(ID, TITLE, "warn", ev, WHY, f"at {human_pct(eff)} of the floor, bound by {binding.of_model(m)}: "
                                               f"{_fix(m['binding'], ff.floor, ff, advised)}")
