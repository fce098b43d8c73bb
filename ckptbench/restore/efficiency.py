"""Every restore, read and sweep held against this box's floor: the floor fields their documents carry (floor_s,
efficiency, binding, binding_gbps, floor_times_s, floor_note, floor_gbps), said one way for every kind.

From the figures `ckptbench floor` cached, never measured here: measuring reads the checkpoint cold, which would
evict the very files a restore is about to read (or has just made hot).
"""

from __future__ import annotations

from ckptbench.core.errors import name_source
from ckptbench.core.stages import CHECK
from ckptbench.core.units import human_figure
from ckptbench.core.stats import spread
from ckptbench.system import floor as fl

HOT = 0.9  # a read of files at least this resident came from the page cache, not from the device


def hash_of(asked: str | None, listing) -> str:
    """The digest a restore computes: the one asked for, else the manifest's, else none (no manifest, no reference:
    hashing would cost CPU for a digest nothing checks)."""
    return asked or (listing.manifest.hash if listing.manifest is not None else "none")


def no_reference(alg: str, man) -> str:
    """Why a restore computing `alg` has no reference to check its digests against in the manifest `man` (the
    runner's NOT VERIFIED note, the dashboard's settings line), or "" when every digest it computes is checked."""
    if man is None:
        return "no manifest"
    if alg != man.hash:
        return f"--hash {alg} is not the manifest's {man.hash}"
    if man.hash == "none":  # sizes alone: a shard rewritten at the same size would pass
        return "the manifest records no digests (hash none)"
    return ""


def fields(source, bytes_read: int, *, measured_s: float | None, hash_alg: str, hot: bool,
           floating_bytes: int = 0, destination: str = fl.FRESH, device_bytes: int = 0, unit_bytes: int = 0,
           met_gbps_per_core: float | None = None) -> dict:
    """The floor fields of `bytes_read` moved from `source` in `measured_s`: a restore lands them in memory it did
    not own before (`fresh`), a read or a sweep in buffers it reuses (`reused`: no population in the floor);
    `unit_bytes` the most one core hashes alone (floor.largest_unit)."""
    out = fl.restore_fields(fl.cached(fl.mount_key(source.describe())), bytes_read=bytes_read, measured_s=measured_s,
                            hash_alg=hash_alg, floating_bytes=floating_bytes, hot=hot, destination=destination,
                            device_bytes=device_bytes, unit_bytes=unit_bytes, met_gbps_per_core=met_gbps_per_core)
    return out | {"floor_note": name_source(out["floor_note"], getattr(source, "url", None))}  # this checkpoint's


def of_restore(source, listing, opts, *, measured_s: float | None = None, residency: float | None = None,
               structural: bool = False, met_gbps_per_core: float | None = None) -> dict:
    """A restore's floor: before it runs (`residency` what the source holds now, `opts.cache` what it will do) or
    after (`measured_s` its RTO, `residency` what it found, `structural` when its check scanned every byte,
    `met_gbps_per_core` the fresh-memory rate it met: met_fresh)."""
    hot = opts.cache == "hot" or (opts.cache == "as-is" and (residency or 0.0) >= HOT)
    if residency is not None and measured_s is not None:
        hot = residency >= HOT  # what the run found, not what it was asked for
    alg = hash_of(opts.hash, listing)
    return fields(source, listing.bytes, measured_s=measured_s, hash_alg=alg, hot=hot,
                  floating_bytes=listing.bytes if structural else 0,
                  device_bytes=listing.bytes if opts.device != "cpu" else 0,
                  unit_bytes=fl.largest_unit((f.size for f in listing.files), alg),
                  met_gbps_per_core=met_gbps_per_core)


def fresh_reference(source, listing) -> float | None:
    """The floor's fresh-memory rate per core that a restore of `listing` is held to as it meets the box
    (floor.like_for_like), for a live view to set the rate a read meets beside; None when the floor is not measured."""
    floor = fl.cached(fl.mount_key(source.describe()))
    return fl.like_for_like(floor, listing.bytes) if floor is not None else None


def _met_rates(reps) -> list[float]:
    """Each repeat's fresh-memory rate a core, for those that populated enough to time (fl.MET_MIN_BYTES)."""
    return [x for r in reps if (x := fl.populate_rate(r.populated_bytes, r.populate_cpu_s)) is not None]


def met_fresh(reps) -> float | None:
    """The fresh-memory rate the repeats met, per core (the median over those that populated enough to time), or
    None."""
    rates = _met_rates(reps)
    return spread(rates)["median"] if rates else None


FIRST_SLOWER = 1.5  # a first repeat this much slower at fresh memory than the later ones is said


def later_repeats_faster(reps) -> str:
    """The note's words when the later repeats met fresh memory much faster than the first: on a VM whose host takes
    freed memory back a few seconds after the free, a repeat lands in the memory its predecessor just freed, which
    comes back several times faster (bench: 0.9 s against 3.7-4.1 s for the same 4 GiB); a restore in a new
    process after a failure meets the first repeat's rate, and the median RTO is the later ones'. "" otherwise."""
    rates = _met_rates(reps)
    if len(rates) < 2 or len(rates) != len(reps):
        return ""
    later = spread(rates[1:])["median"]
    if later < FIRST_SLOWER * rates[0]:
        return ""
    return (f"; the first repeat met fresh memory at {rates[0]:.2f} GB/s a core and the later ones at {later:.2f} "
            "(memory the repeat before had just freed, which a VM's host gives back faster): a restore in a new "
            "process meets the first repeat's rate, and the median RTO is the later ones'")


def of_loop(source, listing, opts, *, residency: float | None = None) -> dict:
    """A loop pass's floor (restore/loop.py: the listing and a read of every file into reused buffers, hashed with
    the restore's digest): a read's, not a restore's; held to the restore's fresh-memory floor a cold pass read 300 %
    of it."""
    alg = hash_of(opts.hash, listing)
    hot = opts.cache == "hot" or (opts.cache == "as-is" and (residency or 0.0) >= HOT)
    return fields(source, listing.bytes, measured_s=None, hash_alg=alg, hot=hot, destination=fl.REUSED,
                  unit_bytes=fl.largest_unit((f.size for f in listing.files), alg))


def of_repeats(source, listing, opts, reps) -> dict:
    """A finished run's floor, against the median RTO of its repeats that finished."""
    ok = [r for r in reps if r.status == "ok"]
    if not ok:  # no time to hold; the floor still of what the repeats found (an as-is run from the page cache is hot)
        found = [r.cache.residency_before for r in reps if getattr(r, "cache", None) is not None]
        return of_restore(source, listing, opts, residency=min(found) if found else None)
    # a model step is the model's compute, which no ceiling of the box measures: the floor is the data path's
    # (list, read, verify, load, device), and so is the time held to it (the demo's 1.09 s CPU forward made a 0.36 s
    # data path read as 15 % of its floor)
    step = ok[0].check_kind == "model step"
    held = spread([r.rto_s - (r.stages.get(CHECK, 0.0) if step else 0.0) for r in ok])["median"]
    out = of_restore(source, listing, opts, measured_s=held, residency=ok[0].cache.residency_before,
                     structural=ok[0].check_kind == "structural", met_gbps_per_core=met_fresh(ok))
    if step and out.get("efficiency") is not None:  # only beside an efficiency: without one there is none to explain
        firsts = sorted(r.stages.get(CHECK, 0.0) for r in ok)
        # restore_fields ends the note with it, and fields() named the source in it: said after this, as there
        over = name_source(fl.over_floor(out["efficiency"]), getattr(source, "url", None))
        if len(firsts) == 1:
            said = (f"the RTO less its first step ({human_figure('_s', firsts[0])}, the model's compute, not held to "
                    f"the floor): {human_figure('_s', held)}")
        else:  # a median of differences: "RTO 0.179 s less a median step 0.052 s: 0.114 s" did not subtract
            said = (f"each repeat's RTO less its first step (the model's compute, not held to the floor: "
                    f"{human_figure('_s', firsts[0])} to {human_figure('_s', firsts[-1])}), their median "
                    f"{human_figure('_s', held)}")
        out["floor_note"] = out["floor_note"].removesuffix(over) + f"; the efficiency is over {said}" + over
    if out.get("floor_note"):
        out["floor_note"] += later_repeats_faster(ok)
    return out


def of_read(source, report, hash_alg: str) -> dict:
    """A plain read's floor (`ckptbench read`): its bytes into reused buffers, hashed with `hash_alg`."""
    return fields(source, report.result.bytes, measured_s=report.driven.wall_s, hash_alg=hash_alg,
                  hot=report.cache.residency_before >= HOT, destination=fl.REUSED,
                  # with --multipart a file's chunks are hashed in parallel (multipart_digest set): a chunk is the unit
                  unit_bytes=fl.largest_unit((f.bytes for f in report.result.files), hash_alg,
                                             chunk=report.result.chunk_size if any(
                                                 f.multipart_digest for f in report.result.files) else 0))


def of_sweep(source, bytes_read: int, medians_gbps: dict[int, float], hash_alg: str, hot: bool,
             sizes=()) -> dict:
    """A sweep's floor, and each level's efficiency (its median rate over the floor's); `sizes` its files'."""
    out = fields(source, bytes_read, measured_s=None, hash_alg=hash_alg, hot=hot, destination=fl.REUSED,
                 unit_bytes=fl.largest_unit(sizes, hash_alg))
    rate = out["floor_gbps"]
    out["efficiency_by_level"] = {lv: (g / rate if rate and g else None) for lv, g in medians_gbps.items()}
    best = max(medians_gbps.values(), default=0.0)
    out["efficiency"] = best / rate if rate and best else None
    if out["floor_note"]:  # the best level past the floor says so, as a run does (a hot sweep read 109 %, unremarked)
        out["floor_note"] += fl.over_floor(out["efficiency"])
    return out


def met_ranks(repeats) -> float | None:
    """The fresh-memory rate a distributed run's ranks met, per core: each finished repeat's bytes populated by
    all its ranks over their workers' CPU time in it (a core's rate whichever rank spent it), the median over the
    repeats that populated enough to time; None where none did (O_DIRECT, too little, runs from before it was kept)."""
    rates = [x for r in repeats if r.get("status") == "ok" and isinstance(p := r.get("populated"), dict)
             and (x := fl.populate_rate(p.get("bytes") or 0, p.get("cpu_s") or 0.0)) is not None]
    return spread(rates)["median"] if rates else None


def of_ranks(source, listing, opts, doc: dict) -> dict:
    """A distributed run's floor: each node's share of the bytes its ranks read (they share the node's storage
    path, memory and cores), against the run's median RTO (the slowest rank's), and as the ranks met the box."""
    rto = (doc.get("rto_stats") or {}).get("median")
    per_node = (doc.get("bytes_read") or listing.bytes) // max(1, doc.get("nodes") or 1)
    hot = ((doc.get("cache") or {}).get("residency_before") or 0.0) >= HOT
    alg = hash_of(opts.hash, listing)
    return fields(source, per_node, measured_s=rto, hash_alg=alg, hot=hot,
                  unit_bytes=min(per_node, fl.largest_unit((f.size for f in listing.files), alg)),
                  met_gbps_per_core=met_ranks(doc.get("repeats") or ()))
