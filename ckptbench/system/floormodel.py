"""The floor model: a restore's floor on this box, from the figures `floor` measured (floor.Floor), per resource
its bytes over its rate and the CPU work over the cores; the largest binds (from the page cache, where every part
is the cores' work, they add up). floor.py measures and keeps the figures; this reads them (every `floor` here is
a floor.Floor, left unannotated: floor.py imports this module)."""

from __future__ import annotations

from ckptbench.system import binding as binding_words
from ckptbench.system.binding import FRESH, REUSED
from ckptbench.system.ceilings import LARGE_MAX, POP_BYTES, Ceiling, large_reach, large_size, size_class
from ckptbench.system.sourcefigures import MIN_STORAGE_SAMPLE


def storage_usable(floor) -> bool:
    """A storage figure the model may use: read cold, from a sample large enough to measure bandwidth."""
    return floor.storage is not None and floor.storage.cold and floor.storage.sample_bytes >= MIN_STORAGE_SAMPLE


def populate_ceiling(floor, nbytes: int = 0) -> Ceiling | None:
    """Fresh memory for a restore of `nbytes`: measured at its size class (or the nearest one measured, within a
    factor of two) when it is LARGE_MIN or more; else, and when no such figure is cached, the faster of the base
    samples' 4 KiB and huge pages (None: not measured)."""
    if (want := size_class(nbytes)) and (near := _nearest_large(floor, want)) is not None:
        return near
    return max((floor.ceilings[k] for k in ("populate_4k", "populate_thp") if k in floor.ceilings),
               key=lambda c: c.gbps, default=None)


def _nearest_large(floor, want: int) -> Ceiling | None:
    # a figure is at its key's size (populate_large writes both): one that says otherwise was not written by us
    sizes = {large_size(k): c for k, c in floor.ceilings.items() if large_size(k) and c.sample_bytes == large_size(k)}
    near = min(sizes, key=lambda s: abs(s.bit_length() - want.bit_length()), default=0)
    return sizes[near] if near and want // 2 <= near <= want * 2 else None


def size_note(floor, nbytes: int) -> str:
    """What the fresh-memory figure a restore of `nbytes` is held to stands on, when it is not its own size."""
    if not (want := size_class(nbytes)) or "populate_4k" not in floor.ceilings:
        return ""
    near = _nearest_large(floor, want)
    if near is None:
        how = ("`ckptbench floor SOURCE` measures it at this size" if large_reach(nbytes) else
               f"the floor populates {LARGE_MAX >> 30} GiB at most, and half the memory this box has free: not this "
               "size")
        return (f"fresh memory measured on {POP_BYTES >> 20} MiB samples, not at this restore's {nbytes / 2**30:.1f} "
                f"GiB (a VM's host may back a large allocation slower): {how}; ")
    return "" if near.sample_bytes == want else (f"fresh memory measured at {near.sample_bytes >> 20} MiB, the size "
                                                 f"nearest this restore's {nbytes >> 20} MiB; ")


def populate_gbps(floor, nbytes: int = 0) -> float | None:
    c = populate_ceiling(floor, nbytes)
    return c.gbps if c is not None else None


def page_cache_gbps(floor, destination: str = FRESH) -> float | None:
    """The page cache's copy: the source mount's own (pread, storage.hot_gbps) where it was measured — into a
    reused block buffer per thread for a REUSED destination (it stays in the CPU's caches: a hot `read` beat the
    populated-memory figure by 21-69 %) — else a memmove's (faster than the kernel's copy into populated memory: 13
    against 8-9 GB/s on this VM, so a floor on it is lower than the box's)."""
    s = floor.storage
    if s is not None and destination == REUSED and s.hot_reused_gbps:
        return s.hot_reused_gbps
    if s is not None and s.hot_gbps:
        return s.hot_gbps
    return floor.ceilings["copy"].gbps if "copy" in floor.ceilings else None


def landing_gbps(floor, hot: bool, nbytes: int = 0) -> float | None:
    """The rate bytes land in fresh memory at, in GB/s: from the device, the population's (the device's reads
    and the faults overlap where the box lets them: the storage figure into fresh memory says how far); from the
    page cache, populating then copying, one after the other (both are the cores' work, and a page is copied
    into only once it exists: a C loop of MADV_POPULATE_WRITE then pread took the sum of the two, 1.16-1.36 s
    for 4.2 GB on 2 cores).

    Not the kernel's copy-on-write of a private file mapping, though it skips the zeroing (4.1-4.4 against
    3.2-3.7 GB/s on 2 cores): truncating the file later takes the copied pages back out of the mapping (POSIX), so
    the restored bytes would fault (SIGBUS) when a trainer rewrites its checkpoint; that memory is not owned."""
    pop = populate_gbps(floor, nbytes)
    if not hot or pop is None or (copy := page_cache_gbps(floor)) is None:
        return pop
    return 1 / (1 / pop + 1 / copy)


def storage_gbps(floor, destination: str) -> float:
    """The storage figure for this destination: into fresh memory where it was measured so (on a box whose
    device reads and page faults share the cores, reads into fresh pages run slower than into reused buffers)."""
    fresh = floor.storage.fresh_gbps if destination == FRESH else 0.0
    return fresh or floor.storage.gbps


IN_ORDER = frozenset({"md5", "sha256", "xxh64"})  # digests of a file's bytes in order: one file, one core at a time


def largest_unit(sizes, hash_alg: str, chunk: int = 0) -> int:
    """The most bytes one core must hash alone: a file, for a digest of its bytes in order (a chunk where the
    digest is per chunk, `chunk` > 0); 0 where the work divides over the cores (none, crc32c: chunk CRCs combine)."""
    if hash_alg not in IN_ORDER:
        return 0
    big = max((s or 0 for s in sizes), default=0)
    return min(big, chunk) if chunk else big


def model(floor, *, bytes_read: int, floating_bytes: int = 0, hash_alg: str = "none",
          destination: str = FRESH, cores: int | None = None, hot: bool = False, device_bytes: int = 0,
          unit_bytes: int = 0, fresh_scale: float = 1.0) -> dict:
    """A restore's floor on this box: per resource, its bytes over its rate (storage — the device when cold, the
    page cache's copy when `hot`; fresh memory for a fresh owned destination, none for a reused or mapped one) and
    the CPU work (hashing, scanning) over the cores; the floor is the largest, and names what binds. From the page
    cache (`hot`) every part is the cores' work, populating and copying as much as hashing and scanning: a core
    does not copy one page while it populates or hashes another, so there the parts add up (the largest binds).
    `unit_bytes` (largest_unit): the most one core hashes alone; the CPU part is never under its time (md5 over a
    single 4 GiB file on 64 cores is one core's work, and its floor divided by 64 put a read at 2 % of it).
    `fresh_scale`: the fresh-memory figure times this (as_met: the rate a run met over the rate the floor measured)."""
    cores = cores or floor.box.get("cores") or 1
    rates: dict[str, float] = {}
    if hot and (copy := page_cache_gbps(floor, destination)) is not None:
        rates["page cache"] = copy
    elif not hot and storage_usable(floor):
        rates[floor.resource] = storage_gbps(floor, destination)
    if destination == FRESH and (pop := populate_gbps(floor, bytes_read)) is not None:
        # the population alone: from the page cache the copy is its own part, above
        rates["fresh memory"] = pop * fresh_scale
    if device_bytes and "h2d_pinned" in floor.ceilings:  # the state moved to a GPU, at the pinned link's rate
        rates["host-to-device"] = floor.ceilings["h2d_pinned"].gbps
    times = {k: (device_bytes if k == "host-to-device" else bytes_read) / (r * 1e9) for k, r in rates.items()}
    cpu, work, alone = 0.0, [], 0.0
    if hash_alg != "none" and f"hash_{hash_alg}" in floor.ceilings:
        rate = floor.ceilings[f"hash_{hash_alg}"].gbps * 1e9
        cpu += bytes_read / rate
        alone = min(unit_bytes, bytes_read) / rate
        work.append(f"hashing ({hash_alg})")
    if floating_bytes and "scan" in floor.ceilings:
        cpu += floating_bytes / (floor.ceilings["scan"].gbps * 1e9)
        work.append("scanning for NaN/Inf")
    used = cores
    if cpu:
        times["cpu"] = max(cpu / cores, alone)
        if alone > cpu / cores:  # one file's digest, in order on one core, outlasts the rest spread over the cores
            used = 1
        rates["cpu"] = bytes_read / times["cpu"] / 1e9  # the rate the cores get through the bytes at
    if not times:
        return {"floor_s": None, "binding": None, "times_s": {}}
    shared = hot and len([k for k in times if k != "host-to-device"]) > 1
    floor_s, binding = combined(times, shared)
    s = floor.storage
    said = binding_words.how(binding, destination=destination, hot=hot, cores=used, cpu_work=" and ".join(work),
                             one_file=used < cores,
                             read_fresh=s is not None and bool(s.fresh_gbps),
                             own_page_cache=s is not None and bool(s.hot_gbps),
                             reused_copy=s is not None and destination == REUSED and bool(s.hot_reused_gbps))
    return {"floor_s": floor_s, "binding": binding, "times_s": times, "destination": destination,
            "gbps": rates.get(binding), "how": said, "cores_shared": shared}


def combined(times: dict[str, float], shared: bool) -> tuple[float, str]:
    """The floor of per-resource `times`, and what binds it: the largest, or with `shared` (from the page cache)
    the cores' parts added up, every one being the cores' work one after the other (a page is populated, then
    copied into, then hashed or scanned), the largest of them named; the link's transfers overlap the cores' work,
    as the device's do cold, and bind only past their sum."""
    if not shared:
        binding = max(times, key=times.get)
        return times[binding], binding
    cores_part = {k: t for k, t in times.items() if k != "host-to-device"}
    total, link = sum(cores_part.values()), times.get("host-to-device", 0.0)
    return (link, "host-to-device") if link > total else (total, max(cores_part, key=cores_part.get))


def efficiency(floor_s: float | None, measured_s: float | None) -> float | None:
    """Floor over measured: 1.0 is this box's best; None when either is unknown."""
    if not floor_s or not measured_s or measured_s <= 0:
        return None
    return floor_s / measured_s
