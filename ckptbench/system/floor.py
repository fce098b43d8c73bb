"""The floor: what this box can physically do for a restore, measured, and the restore's time at those rates.

The ceilings (storage or network, fresh memory, copy, hashes and scan; each with its method, its spread over
repeats and when it was measured) are measured in ceilings.py and sourcefigures.py, the save side's write figure in
writefloor.py. Box figures are cached per box (kernel, CPU model and count, memory) and the storage figure per mount
(an object store's per endpoint and bucket, never with credentials), in the user cache directory (floorcache.py); a
figure older than a day, or from another box or mount, is measured again, never used. busy.py says when other work
held the cores as they were measured.

The model: a restore's floor is the largest of its bytes over each resource it passes through (storage; fresh
memory when it lands bytes in memory it did not own before) and of its CPU work (copying, hashing, scanning) over
the cores; its efficiency is floor / measured, and the resource that sets the floor is named.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field, replace

from ckptbench.core import jsontext
from ckptbench.core.errors import CkptbenchError, printable
from ckptbench.core.units import human_age, human_bytes, human_pct

# the measurements are ceilings.py's and sourcefigures.py's; their names are bound here too, so that measure() finds them (and a test
# can stand in for one) where it looks them up
from ckptbench.system.ceilings import (  # noqa: F401  (the floor's one face: callers name these through it)
    DEVICE_FIGURES, LARGE_MAX, LARGE_MIN, POP_BYTES, Ceiling, ceiling_of, cpu_ceilings, device_ceilings, files_key,
    gpu_models, large_key, large_reach, large_size, memory_ceilings, populate_large, size_class, thread_counts,
)
from ckptbench.system.binding import FRESH, REUSED  # noqa: F401  (as above)
from ckptbench.system.busy import OtherWork, busy as _busy  # a test stands in for either here
# the cache: its names bound here too (callers and tests name them through the floor)
from ckptbench.system.floormodel import (  # noqa: F401  (the floor's one face, as above)
    IN_ORDER, efficiency, landing_gbps, largest_unit, model, page_cache_gbps, populate_ceiling, populate_gbps,
    size_note, storage_gbps, storage_usable,
)
from ckptbench.system.floorcache import (  # noqa: F401
    BOX_FIGURES, CACHE_MAX, MAX_AGE_S, METHOD_MAX, MOUNTS_MAX, OVER_FLOOR, SCHEMA, _load_cache, box_key, cache_path,
    known_figure, valid_ceiling, write_cache,
)
from ckptbench.system.sourcefigures import (  # noqa: F401  (as above)
    LINK_SAMPLE, MIN_STORAGE_SAMPLE, STORAGE_SAMPLE, link_ceiling, link_sample, page_cache_figure, storage_ceiling,
)


@dataclass
class Floor:
    """The box's ceilings (and the storage ceiling of one mount), as measured or as cached."""

    box: dict
    ceilings: dict[str, Ceiling] = field(default_factory=dict)
    storage: Ceiling | None = None
    mount: str | None = None
    notes: list[str] = field(default_factory=list)
    cached: bool = False  # the box's figures came from the cache (the storage figure may not: storage_now)
    storage_now: bool = False  # the storage figure was measured by this call (none kept, or a smaller sample)
    kept: bool = True  # False when the figures could not be cached: every later run says "not measured"
    busy: str = ""  # the box figures were measured while other work held the cores (_busy): kept with them

    @property
    def resource(self) -> str:
        """What the storage figure is the rate of: an object store's is the network's, not a device's."""
        return resource_of(self.mount)

    def to_json(self) -> dict:
        doc = {"schema": SCHEMA, "box": self.box, "mount": self.mount, "resource": self.resource,
               "cached": self.cached, "notes": self.notes,
               "ceilings": {k: _box_figure(c) for k, c in self.ceilings.items()}}
        doc["storage"] = asdict(self.storage) | {"age_s": self.storage.age_s} if self.storage else None
        return doc


STORAGE_ONLY = ("cold", "fresh_gbps", "hot_gbps", "hot_reused_gbps")  # a storage figure's: no box figure has them


def _box_figure(c: Ceiling) -> dict:
    """A box ceiling in a document: without the storage figure's fields (a memory ceiling read `cold: true,
    fresh_gbps: 0`), and its sample's size only where it has one (the size-class population's)."""
    out = {k: v for k, v in asdict(c).items() if k not in STORAGE_ONLY}
    if not out["sample_bytes"]:
        del out["sample_bytes"]
    return out | {"age_s": c.age_s}


def measure(paths_sizes: list[tuple[str, int]] | None = None, mount: str | None = None, *, remeasure: bool = False,
            path: str | None = None, size: int = POP_BYTES, read=None, read_bytes: int = 0,
            read_what: str = "the source's objects read through its client", restore_bytes: int = 0) -> Floor:
    """This box's floor: the cached figures when they are this box's (and this mount's) and fresh, else measured
    now and cached. The storage figure comes from `paths_sizes` (local files, read here cold) or, for a source
    that is not files on a mount, from `read(concurrency) -> bytes/s` over `read_bytes` (link_ceiling). Fresh
    memory is measured at the size of a restore of `restore_bytes` too, when that is LARGE_MIN or more: each size
    class is cached beside the others."""
    if paths_sizes is not None and read is None and not sum(s for _, s in paths_sizes):
        raise CkptbenchError("the floor's storage figure needs the source's files: none to read (every file is "
                             "empty)")
    path = path or cache_path()
    box = box_key()
    kept_doc = _load_cache(path)
    doc = {"box": kept_doc.get("box")} if remeasure else kept_doc  # other mounts' figures stay: not these
    now = time.time()
    floor = Floor(box, mount=mount)
    mine = kept_doc.get("box") == box
    others = {k: asdict(c) for k, v in (kept_doc.get("storage") or {}).items()
              if mine and isinstance(k, str) and k != mount and (c := valid_ceiling(v, now))}
    cached = {k: c for k, v in (doc.get("ceilings") or {}).items() if mine and (c := valid_ceiling(v, now))
              and known_figure(k)}
    want = size_class(restore_bytes)
    if all(k in cached for k in BOX_FIGURES):
        floor.ceilings, floor.cached = cached, True
        floor.busy = printable(doc.get("busy", "")) if mine else ""  # anyone who can write the cache wrote it
        floor.notes += [f"{floor.busy} (when these figures were measured)"] if floor.busy else []
        # only this size is new: the box's other figures stand (the size this box can reach: its class, or less
        # where memory is short, and then that one is the figure to find next time)
        if want and (reach := large_reach(restore_bytes)) and large_key(reach) not in cached:
            large, held = populate_large(restore_bytes)
            if held is not None:
                held.close()
            floor.ceilings |= {large_key(large.sample_bytes): large} if large is not None else {}
    else:  # the box's figures again: a size class kept from before them would be from another moment of the host's
        before, during = _busy(), OtherWork()
        floor.ceilings = memory_ceilings(size=size, **({"restore_bytes": restore_bytes} if want else {})) | \
            cpu_ceilings()
        floor.busy = before or during.note()  # said, and kept: the cached figures are as low as they were measured
        floor.notes += [floor.busy] if floor.busy else []
    if box.get("gpus") and not all(k in floor.ceilings for k in DEVICE_FIGURES):  # a GPU's link, when there is one
        try:
            floor.ceilings |= device_ceilings()
        except RuntimeError as exc:  # a GPU another process holds (out of memory), a driver that fails: the box's
            # other figures stand and are kept
            why = printable(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)[:200]
            floor.notes.append(f"the GPU's link is not measured ({why}): `ckptbench floor` again when the GPU is "
                               "free")
    storages = doc.get("storage") if mine and isinstance(doc.get("storage"), dict) else {}
    if paths_sizes or read is not None:
        kept = valid_ceiling(storages.get(mount or ""), now) if storages and mount else None
        wanted = read_bytes if read is not None else min(STORAGE_SAMPLE, sum(s for _, s in paths_sizes))
        if kept is not None and kept.sample_bytes >= wanted:  # a smaller sample than this source's is measured again
            floor.storage = kept
            if read is None and not kept.hot_gbps:  # kept before the page cache's figure was measured (or where it
                # could not be): that one alone, now, not the device's again
                hot, reused, words = page_cache_figure(paths_sizes)
                floor.storage = replace(kept, hot_gbps=hot, hot_reused_gbps=reused,
                                        method=kept.method[:METHOD_MAX - len(words)] + words) if hot else kept
            if read is None and kept.of_files and kept.of_files == files_key(paths_sizes):
                # reading a sample too small for bandwidth again changes nothing: the note below says what would
                # the command by name: `check` and `run` take no --remeasure (a new user typed it after `check`)
                again = (": `ckptbench floor SOURCE --remeasure` reads them again"
                         if kept.sample_bytes >= MIN_STORAGE_SAMPLE else "")
                floor.notes.append(f"the {floor.resource} figure was read from this checkpoint's files "
                                   f"{human_age(kept.age_s)} ago and kept{again}")
            elif read is None and wanted < MIN_STORAGE_SAMPLE <= kept.sample_bytes:
                # --remeasure would read this one's files, evict them and still keep the mount's: a new user was sent
                # to do that for a 38 MiB checkpoint
                floor.notes.append(f"the {floor.resource} figure is this mount's, kept from {human_age(kept.age_s)} "
                                   f"ago from a {human_bytes(kept.sample_bytes)} sample (its method names the files "
                                   f"it read): this checkpoint's {human_bytes(wanted)} would measure latency more than "
                                   "bandwidth, so the mount's is the one used")
            elif read is None:  # perhaps another checkpoint's files on this mount: said, as the help promises
                floor.notes.append(f"the {floor.resource} figure is this mount's, kept from {human_age(kept.age_s)} "
                                   "ago (its method names the files it read): `ckptbench floor SOURCE --remeasure` "
                                   "reads this checkpoint's")
            if not storage_usable(floor):  # said whenever it is shown, not only when it was measured
                floor.notes.append(f"the {human_bytes(kept.sample_bytes)} sample measures latency more than "
                                   "bandwidth: the floor does not use it (point at a larger checkpoint)")
        else:
            floor.storage, note = (link_ceiling(read, read_bytes, read_what) if read is not None
                                   else storage_ceiling(paths_sizes))
            floor.storage_now = True
            if read is None:
                floor.storage = replace(floor.storage, of_files=files_key(paths_sizes))
            floor.notes += [note] if note else []
            if kept is not None:  # replaced for the mount: every run on it is held to this one from now on (`check`
                # did this silently, and a new user's unchanged run went from 70 % to 137 % of its floor)
                floor.notes.append(f"the {floor.resource} figure was measured now, from a larger sample "
                                   f"({human_bytes(floor.storage.sample_bytes)}) than the "
                                   f"{human_bytes(kept.sample_bytes)} kept from {human_age(kept.age_s)} ago, and "
                                   "replaces it for this mount")
    # a sample too small to measure bandwidth does not replace a mount's figure that was large enough (a 17 MiB
    # checkpoint floored after a 282 MiB one left every restore on the mount without a storage figure)
    prev = valid_ceiling((kept_doc.get("storage") or {}).get(mount or ""), now) if mine and mount else None
    keep_prev = (floor.storage is not None and floor.storage.sample_bytes < MIN_STORAGE_SAMPLE
                 and prev is not None and prev.sample_bytes >= MIN_STORAGE_SAMPLE)
    if keep_prev:
        others = others | {mount: asdict(prev)}
        floor.notes = [n for n in floor.notes if "measures latency more than bandwidth" not in n]  # said once, below
        floor.notes.append(f"this checkpoint's {human_bytes(floor.storage.sample_bytes)} sample measures latency more "
                           f"than bandwidth: the mount's figure from a {human_bytes(prev.sample_bytes)} sample is kept "
                           "and is the one used")
    if (trouble := _save(path, floor, others, store=not keep_prev)):
        floor.kept = False
        floor.notes.append(f"{path}: cannot keep these figures ({trouble}); every run will say the floor is not "
                           "measured: set XDG_CACHE_HOME to a directory you can write")
    if keep_prev:  # what this floor is then held to: the figure every restore on the mount uses, not the small one
        floor.storage = prev
    return floor


def _save(path: str, floor: Floor, storages: dict, store: bool = True) -> str | None:
    """Keeps the figures (a storage figure only when it was read cold, and `store`); why it could not, or None."""
    if store and floor.storage is not None and floor.mount and floor.storage.cold:
        storages = dict(storages) | {floor.mount: asdict(floor.storage)}
    storages = dict(sorted(storages.items(), key=lambda kv: -kv[1]["measured_at"])[:MOUNTS_MAX])
    doc = {"schema": SCHEMA, "box": floor.box, "ceilings": {k: asdict(c) for k, c in floor.ceilings.items()},
           "storage": storages} | ({"busy": floor.busy} if floor.busy else {})
    before = _load_cache(path)
    if before.get("box") == floor.box and isinstance(before.get("write"), dict):
        doc["write"] = before["write"]  # the save side's figures (writefloor.py) stay beside the restore's
    return write_cache(path, doc)


# ---- the model ---------------------------------------------------------------------------------------------------





S3_KEY = " (s3)"


def mount_key(where: dict) -> str:
    """The storage figure's key: a source's mount point and filesystem (what Source.describe gives); for S3 its
    endpoint (and bucket, when describe names it) without user-info, query or fragment: no credential is a key."""
    if where.get("fs_type") != "s3":
        return f"{where.get('mount_point')} ({where.get('fs_type')})"
    from ckptbench.core.errors import redact

    endpoint = redact(str(where.get("mount_point") or "AWS")).split("?")[0].split("#")[0].rstrip("/")
    bucket = where.get("bucket")
    return f"{endpoint}/{bucket}{S3_KEY}" if bucket else f"{endpoint}{S3_KEY}"


def resource_of(mount: str | None) -> str:
    """The model's name for what a mount's figure measures: an object store is reached over the network."""
    return "network" if mount and mount.endswith(S3_KEY) else "storage"


def cached(mount: str | None = None, path: str | None = None) -> Floor | None:
    """This box's cached floor (and `mount`'s storage figure) when fresh, else None; never measures."""
    doc = _load_cache(path or cache_path())
    if doc.get("box") != box_key():
        return None
    now = time.time()
    ceilings = {k: c for k, v in (doc.get("ceilings") or {}).items()
                if known_figure(k) and (c := valid_ceiling(v, now))}
    if not all(k in ceilings for k in BOX_FIGURES):  # a floor on part of the figures would be some other floor
        return None
    storages = doc.get("storage") if isinstance(doc.get("storage"), dict) else {}
    storage = valid_ceiling(storages.get(mount or ""), now) if mount else None
    return Floor(doc["box"], ceilings, storage, mount, cached=True, busy=printable(doc.get("busy", "")))


NOT_MEASURED = "this box's floor is not measured yet: `ckptbench floor SOURCE` measures it in seconds"
# The floor fields every run document carries, in every kind (records/schema.py fills the ones a kind leaves out):
# floor_s, efficiency (floor / measured), the binding resource, its rate and what that rate is of (binding.py), each
# resource's time, what the floor stands on, the rate the floor moves the bytes at (what a throughput chart draws),
# and the floor as the run met the box (as_met: None where the run populated no fresh memory it could time).
FIELDS = ("floor_s", "efficiency", "binding", "binding_gbps", "binding_how", "floor_times_s", "floor_note",
          "floor_gbps", "floor_as_met")
MET_MIN_BYTES = 64 << 20  # fewer bytes populated in a run time its first faults and start-up, not a rate
MET_OFF = 0.15  # the met rate this far from the floor's is said in the note (the floor's own spread is about this)


def threads_in(method: str) -> int | None:
    """The thread count a population figure's method line names ("…, 2 thread(s) of 1, 2, …"), or None."""
    import re

    m = re.search(r"\b(\d{1,5}) thread\(s\)", method)
    return int(m.group(1)) if m else None


def as_met(floor: Floor, met_gbps_per_core: float | None, *, bytes_read: int, measured_s: float | None,
           **model_args) -> dict | None:
    """The floor as a run met the box: its fresh-memory figure scaled by the rate the run's own population ran at
    (fastio's workers' CPU time in MADV_POPULATE_WRITE, per core) over the rate the floor measured it at, per core.

    Why: on a VM fresh memory is the host's to give, and it gave 0.5 to 9 GB/s in one afternoon here (a page the
    host took back is backed again on first touch, and the vCPU stalls for it: a thread's CPU time shows it, a
    thread waiting for a core does not). A floor measured minutes earlier held a restore to a rate the host no longer
    gave. Like for like: both are MADV_POPULATE_WRITE on plain pages, per core of CPU time, so a restore that
    populates on too few threads still reads slow; None where the run populated too little to time, or the
    destination is not fresh."""
    if not met_gbps_per_core or model_args.get("destination", FRESH) != FRESH:
        return None
    if (per_core := like_for_like(floor, bytes_read, model_args.get("cores"))) is None:
        return None
    scale = met_gbps_per_core / per_core
    m = model(floor, bytes_read=bytes_read, fresh_scale=scale, **model_args)
    return {"fresh_gbps_per_core": met_gbps_per_core, "floor_fresh_gbps_per_core": per_core, "scale": scale,
            "floor_s": m["floor_s"], "efficiency": efficiency(m["floor_s"], measured_s), "binding": m["binding"],
            "floor_times_s": m["times_s"]}


def like_for_like(floor: Floor, bytes_read: int, cores: int | None = None) -> float | None:
    """The floor's fresh-memory rate per core measured the way a restore populates (MADV_POPULATE_WRITE on the
    pages a plain allocation gets: the restore's size class where it was measured, else the 4 KiB figure), which a
    run's own rate is held against; the model's figure (it may be the huge pages') is scaled by the two's ratio.
    None: not measured."""
    pop = populate_ceiling(floor, bytes_read)
    if pop is None:
        return None
    key = next((k for k, c in floor.ceilings.items() if c is pop), "")
    ref = pop if large_size(key) else floor.ceilings.get("populate_4k", pop)
    cores = cores or floor.box.get("cores") or 1
    return ref.gbps / max(1, min(threads_in(ref.method) or cores, cores))


def met_off(met: dict | None) -> bool:
    """Whether a run met fresh memory more than MET_OFF off the floor's figure (then the efficiency as met is said
    beside the floor's, in the text, the note and the dashboard alike)."""
    return bool(met) and abs(met["scale"] - 1) > MET_OFF


def populate_rate(nbytes: int, cpu_s: float) -> float | None:
    """GB/s a core of a read that populated `nbytes` in `cpu_s` of its workers' CPU time; None under MET_MIN_BYTES
    (too little to time) or without a time."""
    return nbytes / cpu_s / 1e9 if nbytes >= MET_MIN_BYTES and cpu_s > 0 else None


def met_words(met: dict | None) -> str:
    """The note's words for a run that met fresh memory at a rate off the floor's; "" within MET_OFF or unknown."""
    if not met_off(met):
        return ""
    eff = f", {human_pct(met['efficiency'])} of it" if met["efficiency"] is not None else ""
    how = ("slower than when the floor was measured (on a VM the host backs memory it took back again on first "
           "touch; another process's memory use does the same)" if met["scale"] < 1 else
           "faster than the floor's figure (memory freed a moment before comes back faster on a VM)")
    return (f"; fresh memory ran at {met['fresh_gbps_per_core']:.2f} GB/s a core in this run against the floor's "
            f"{met['floor_fresh_gbps_per_core']:.2f}, {how}: held to the box as it met it, the floor is "
            f"{met['floor_s']:.3f} s{eff}")


def unmeasured(note: str | None = None) -> dict:
    """The floor fields when there is no floor to hold a figure against, and `note` saying why (unless told: not
    measured, or, where the cache cannot be written, that `floor` could not keep its figures)."""
    return dict.fromkeys(FIELDS) | {"floor_times_s": {}, "floor_note": note or not_measured()}


def not_measured() -> str:
    """Why there is no floor: not measured yet, or measured and not kept (sending the user back to `floor` would go
    round in circles: a new user did, with a read-only cache)."""
    d = os.path.dirname(cache_path())
    while not os.path.isdir(d) and os.path.dirname(d) != d:
        d = os.path.dirname(d)  # the directory `floor` would create its cache under
    if os.access(d, os.W_OK | os.X_OK):
        return _gone() or NOT_MEASURED
    return (f"this box's floor cannot be kept: {d} is not writable; set XDG_CACHE_HOME to a directory you can "
            "write, then `ckptbench floor SOURCE`")


def _gone() -> str | None:
    """Why a floor that was cached is not used, when that is the reason: it is older than a day, or was measured on
    another box (a new user read "not measured yet" about a floor measured two days before)."""
    doc = _load_cache(cache_path())
    ats = [at for v in (doc.get("ceilings") or {}).values()
           if isinstance(v, dict) and (at := jsontext.number(v.get("measured_at"))) is not None]
    if not ats:
        return None
    if doc.get("box") != box_key():
        return ("the cached floor is another box's (its CPU, memory or kernel differ from this one's): "
                "`ckptbench floor SOURCE` measures this one in seconds")
    age = time.time() - max(ats)
    if age > MAX_AGE_S:
        return (f"this box's floor is stale (measured {human_age(age)} ago; figures are kept a day): "
                "`ckptbench floor SOURCE` measures it again in seconds")
    return None


FIXED_COSTS_S = 0.01  # a floor shorter than this is dwarfed by what it does not count (a 116 KiB restore read 0.1 %)
# beside an efficiency over such a floor (history, the dashboard): run's note says it, these said the figure bare
SHORT_FLOOR = f"a floor under {FIXED_COSTS_S * 1e3:.0f} ms: says little"
# a knee over such a floor (sweep's text, check's Concurrency item): the levels' rates are fixed costs, not storage
SMALL_SWEEP_WHY = "at this size the levels differ by fixed costs, not by what the storage gives"
SMALL_SWEEP_FIX = "sweep a checkpoint of tens of MiB or more before setting it"


def says_little(floor_s: float | None) -> bool:
    """Whether an efficiency over `floor_s` is over a floor too short to tell a slow restore from fixed costs."""
    return floor_s is not None and 0 < floor_s < FIXED_COSTS_S


def over_floor(eff: float | None) -> str:
    """The note's words for an efficiency beyond a good ceiling's spread (kept as measured: hiding it would hide a
    ceiling that reads low); "" within it."""
    if eff is None or eff <= OVER_FLOOR:
        return ""
    return (f"; faster than the floor ({human_pct(eff)}): a ceiling measured low (a busy box, a noisy sample, another "
            "checkpoint's figure, or memory another process had just freed, which a VM populates faster): "
            "`ckptbench floor SOURCE --remeasure` when the box is quiet")


# the command that gives a mount its storage figure where the checkpoint in hand is too small to: not SOURCE (a
# new user was told `ckptbench floor` of their 38 MiB checkpoint, and it measured nothing the floor could use)
LARGER_FLOOR_CMD = f"`ckptbench floor DIR` on a checkpoint of {MIN_STORAGE_SAMPLE >> 20} MiB or more on this mount"


def measure_hint(nbytes: int) -> str:
    """The command that gives a mount its storage figure: this checkpoint, or where it is under the bandwidth bar, a
    larger one on the same mount (LARGER_FLOOR_CMD)."""
    if nbytes >= MIN_STORAGE_SAMPLE:
        return f"`ckptbench floor SOURCE` on {MIN_STORAGE_SAMPLE >> 20} MiB or more"
    return f"{LARGER_FLOOR_CMD}: this one's {human_bytes(nbytes)} measures latency more than bandwidth"


def restore_fields(floor: Floor | None, *, bytes_read: int, measured_s: float | None, hash_alg: str,
                   floating_bytes: int = 0, hot: bool = False, destination: str = FRESH,
                   device_bytes: int = 0, unit_bytes: int = 0, met_gbps_per_core: float | None = None) -> dict:
    """What every restore document carries: floor_s, efficiency (floor / measured), binding, the per-resource
    times, a note saying what the floor stands on (or that it is not measured), and the floor as the run met the
    box where it timed its own fresh memory (`met_gbps_per_core`: as_met)."""
    if floor is None:
        return unmeasured()
    args = dict(floating_bytes=floating_bytes, hash_alg=hash_alg, hot=hot, destination=destination,
                device_bytes=device_bytes, unit_bytes=unit_bytes)
    m = model(floor, bytes_read=bytes_read, **args)
    partial = not hot and not storage_usable(floor)  # a cold read's floor without what it reads from
    own = floor.storage is not None and bool(floor.storage.hot_gbps)
    note = (("the read was from the page cache; " if own else "the read was from the page cache (its copy held to "
             "a memmove's rate, faster than the kernel's: `ckptbench floor SOURCE` measures this mount's, from 64 "
             "MiB or more of files it can evict); ")
            if hot else "" if not partial else
            f"no {floor.resource} figure for this {'endpoint' if floor.resource == 'network' else 'mount'} "
            f"({measure_hint(bytes_read)}): the floor counts memory and CPU only, so no efficiency "
            "is given (a cold restore held to part of its floor read as slow as 15 %); ")
    note += "into reused buffers (no fresh memory to populate); " if destination == REUSED else \
        size_note(floor, bytes_read)
    note += ("every part on the cores, one after the other, so the parts add up" + (
        " (the link's transfers overlap them)" if "host-to-device" in m["times_s"] else "") + "; ") \
        if m.get("cores_shared") else ""
    if device_bytes and "h2d_pinned" not in floor.ceilings:
        note += ("no host-to-device figure (`ckptbench floor` measures the GPU's link where there is one): the "
                 "device stage is not in the floor; ")
    if m["floor_s"] and m["floor_s"] < FIXED_COSTS_S and not partial:  # with no efficiency given (a cold floor
        # without its storage or network figure), "the efficiency says little" stood beside "no efficiency is given"
        note += (f"a floor under {FIXED_COSTS_S * 1e3:.0f} ms counts the bytes alone: at this size opening files, "
                 "parsing headers and starting threads outweigh them, so the efficiency says little; ")
    ages = [c.age_s for c in floor.ceilings.values()] + ([floor.storage.age_s] if floor.storage else [])
    note += f"ceilings measured {human_age(max(ages))} ago at most"
    note += " while the box was busy (they may be low)" if floor.busy else ""
    eff = None if partial else efficiency(m["floor_s"], measured_s)
    met = None if partial else as_met(floor, met_gbps_per_core, bytes_read=bytes_read, measured_s=measured_s, **args)
    note += met_words(met) + over_floor(eff)  # over_floor last: of_repeats finds it at the end
    return {"floor_s": m["floor_s"], "efficiency": eff, "binding": m["binding"],
            "binding_gbps": m.get("gbps"), "binding_how": m.get("how"), "floor_times_s": m["times_s"],
            "floor_note": note,
            "floor_gbps": bytes_read / m["floor_s"] / 1e9 if m["floor_s"] else None, "floor_as_met": met}
