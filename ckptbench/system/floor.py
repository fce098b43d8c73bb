"""The floor: what this box can physically do for a restore, measured, and the restore's time at those rates.

Ceilings, each with its method, its spread over repeats and when it was measured:
- storage: the source's own files read back cold (evicted and checked), at the best of a short concurrency sweep,
  with O_DIRECT where the filesystem takes it (readmode decides, as for a restore); for an object store, the
  network: the source's own objects read through its client (a callable the caller gives: this floor is below the
  sources), at the best of a short concurrency sweep;
- fresh memory: anonymous pages populated, 4 KiB and transparent huge pages, with MADV_POPULATE_WRITE where the
  kernel has it (a write per page where it has not), over 1, 2, 4.. cores threads;
- copy: into memory populated already, 1, 2, 4.. cores threads;
- every hash kernel and the finite scan, per core.
Box figures are cached per box (kernel, CPU model and count, memory) and the storage figure per mount (an object
store's per endpoint and bucket, never with credentials), in the user cache directory; a figure older than a day,
or from another box or mount, is measured again, never used.

The model: a restore's floor is the largest of its bytes over each resource it passes through (storage; fresh
memory when it lands bytes in memory it did not own before) and of its CPU work (copying, hashing, scanning) over
the cores; its efficiency is floor / measured, and the resource that sets the floor is named.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import platform
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field

import fastio

from ckptbench.core.errors import CkptbenchError

MADV_POPULATE_WRITE = 23  # Linux 5.14: populate (prefault) writable pages, in the kernel, without touching them
MAX_AGE_S = 86400.0
POP_BYTES = 256 << 20  # enough pages that faults, not setup, are what is timed
HASH_BYTES = 64 << 20
STORAGE_SAMPLE = 1 << 30  # the most of the source's files read per level
MIN_STORAGE_SAMPLE = 64 << 20  # below this, a read measures the device's latency, not its bandwidth
LINK_SAMPLE = 256 << 20  # the most of an object store's bytes read per level: seconds, not minutes, on a slow link
LINK_LEVELS = (4, 16, 64)  # an object store wants many connections; one would measure a request's latency
KNEE_GAIN = 1.1  # a level that gains less than this over the best so far ends a link sweep: the link is full
REPEATS = 3
SCHEMA = 1
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


@dataclass
class Ceiling:
    """One measured rate: bytes per second (median of the repeats), their min and max, how it was measured."""

    gbps: float
    min_gbps: float
    max_gbps: float
    method: str
    measured_at: float  # time.time()
    sample_bytes: int = 0  # storage: the bytes the figure read (a small sample measures latency, not bandwidth)

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.measured_at)


def _ceiling(rates: list[float], method: str) -> Ceiling:
    return Ceiling(statistics.median(rates) / 1e9, min(rates) / 1e9, max(rates) / 1e9, method, time.time())


def _parallel(n: int, work) -> float:
    """Seconds for `work(i)` run on n threads at once (each releases the GIL in native code)."""
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def _populate(size: int, threads: int, huge: bool) -> tuple[float, str]:
    """Bytes/s of populating `size` fresh anonymous bytes on `threads` threads, and how it was done."""
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        region.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
        base = ctypes.addressof(ctypes.c_char.from_buffer(region))
        part = size // threads // mmap.PAGESIZE * mmap.PAGESIZE
        how = ["MADV_POPULATE_WRITE"]

        def one(i: int) -> None:
            if _LIBC.madvise(base + i * part, part, MADV_POPULATE_WRITE) != 0:  # an older kernel: one write per page
                how[0] = "a write per page"
                ctypes.memset(base + i * part, 1, part)  # ctypes calls drop the GIL: the threads run in parallel

        seconds = _parallel(threads, one)
        return threads * part / seconds, how[0]
    finally:
        region.close()


def _copy(src: bytearray, dst: bytearray, threads: int) -> float:
    """Bytes/s of copying into memory populated already (the pages exist: only the bytes move)."""
    part = len(dst) // threads
    s_addr = ctypes.addressof(ctypes.c_char.from_buffer(src))
    d_addr = ctypes.addressof(ctypes.c_char.from_buffer(dst))
    seconds = _parallel(threads, lambda i: ctypes.memmove(d_addr + i * part, s_addr + i * part, part))
    return threads * part / seconds


def thread_counts(cores: int) -> list[int]:
    """1, 2, 4, ... and the core count itself: a many-core box is swept in seconds, not one count at a time."""
    return sorted({1 << i for i in range(cores.bit_length()) if 1 << i <= cores} | {cores})


def _counts(cores: int) -> str:
    return ", ".join(map(str, thread_counts(cores)))


def memory_ceilings(cores: int | None = None, size: int = POP_BYTES, repeats: int = REPEATS) -> dict[str, Ceiling]:
    """Fresh-memory population (4 KiB pages and THP) and copy into populated memory, at the best thread count of
    1, 2, 4.. cores; each figure the median of `repeats`."""
    cores = cores or os.cpu_count() or 1
    out: dict[str, Ceiling] = {}
    for key, huge in (("populate_4k", False), ("populate_thp", True)):
        best, how, best_n = [], "", 1
        for n in thread_counts(cores):
            runs = [_populate(size, n, huge) for _ in range(repeats)]
            rates = [r for r, _ in runs]
            if not best or statistics.median(rates) > statistics.median(best):
                best, how, best_n = rates, runs[0][1], n
        out[key] = _ceiling(best, f"{how}, {'transparent huge pages' if huge else '4 KiB pages'}, "
                                  f"{best_n} thread(s) of {_counts(cores)}")
    best, best_n = [], 1
    src = bytearray(os.urandom(1 << 20)) * (size >> 20)  # made once: making them costs more than copying them
    dst = bytearray(len(src))
    dst[:] = src  # calloc maps zero pages lazily: write every page once, untimed, so only the bytes move
    for n in thread_counts(cores):
        rates = [_copy(src, dst, n) for _ in range(repeats)]
        if not best or statistics.median(rates) > statistics.median(best):
            best, best_n = rates, n
    out["copy"] = _ceiling(best, f"memmove into populated memory, {best_n} thread(s) of {_counts(cores)}")
    return out


def cpu_ceilings(size: int = HASH_BYTES, repeats: int = REPEATS) -> dict[str, Ceiling]:
    """Every hash kernel and the finite scan, per core (one native thread, the GIL released)."""
    buf = bytearray(os.urandom(1 << 20)) * (size >> 20)
    out: dict[str, Ceiling] = {}
    for alg in fastio.HASHES:
        if alg == "none":
            continue
        rates = []
        for _ in range(repeats):
            h = fastio.Hasher(alg)
            t0 = time.perf_counter()
            h.update(buf)
            rates.append(size / (time.perf_counter() - t0))
        out[f"hash_{alg}"] = _ceiling(rates, f"fastio.Hasher({alg!r}) over {size >> 20} MiB, one core")
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fastio.count_nonfinite([(buf, "f32")], concurrency=1)
        rates.append(size / (time.perf_counter() - t0))
    out["scan"] = _ceiling(rates, f"fastio.count_nonfinite over {size >> 20} MiB of float32, one core")
    return out


def storage_ceiling(paths_sizes: list[tuple[str, int]], levels: tuple[int, ...] = (1, 4, 16),
                    repeats: int = 1) -> tuple[Ceiling, str]:
    """The source's own files read back cold (evicted, residency checked), at the best of `levels`; with the read
    path a cold restore takes (readmode: O_DIRECT where the filesystem takes it). Returns the ceiling and a note
    when the cold condition did not hold (then the figure is the page cache's, and it says so)."""
    from ckptbench.system import pagecache, readmode

    chosen, total = [], 0  # the largest files up to the sample; the last one read only as far as the sample goes
    for path, size in sorted(paths_sizes, key=lambda ps: -ps[1]):
        if total >= STORAGE_SAMPLE:
            break
        take = min(size, max(1 << 20, (STORAGE_SAMPLE - total) >> 20 << 20))  # whole MiB: O_DIRECT's alignment
        chosen.append((path, take, take < size))
        total += take
    if not chosen or not total:
        raise CkptbenchError("the floor's storage figure needs the source's files: none to read")
    paths = [p for p, _, _ in chosen]
    specs = [fastio.FileSpec(p, n, 0) if part else fastio.FileSpec(p, n) for p, n, part in chosen]
    best, best_level, mode, note = [], levels[0], "pread", ""
    for level in levels:
        rates = []
        for _ in range(repeats):
            cond = pagecache.prepare(paths, "cold")
            if not cond.verified:
                note = f"not cold ({cond.residency_before:.0%} still cached): this is the page cache's rate"
            mode = readmode.choose([(p, n) for p, n, _ in chosen], cond.residency_before, 1 << 20).mode
            res = fastio.read_files(specs, concurrency=level, read=mode, hash="none")
            if res.failed:
                raise CkptbenchError(f"{res.failed[0].path}: unreadable ({res.failed[0].error.message}); the floor "
                                     "reads the source's own files")
            rates.append(res.read_gbps * 1e9)
        if not best or statistics.median(rates) > statistics.median(best):
            best, best_level = rates, level
    c = _ceiling(best, f"the source's {len(chosen)} largest file(s) ({total >> 20} MiB) read cold with {mode}, "
                       f"concurrency {best_level} of {', '.join(map(str, levels))}")
    c.sample_bytes = total
    if total < MIN_STORAGE_SAMPLE:
        note = (note + "; " if note else "") + (f"a {total >> 20} MiB sample measures latency more than bandwidth: "
                                                "the floor does not use it (point at a larger checkpoint)")
    return c, note


def link_sample(names_sizes: list[tuple[str, int]], cap: int = LINK_SAMPLE) -> list[tuple[str, int]]:
    """The largest of an object store's files that fit in `cap` together (the smallest one when none fits: the
    figure then costs one whole object per level)."""
    chosen, total = [], 0
    for name, size in sorted(names_sizes, key=lambda ns: -ns[1]):
        if size and total + size <= cap:
            chosen.append((name, size))
            total += size
    sized = [ns for ns in names_sizes if ns[1]]
    return chosen or ([min(sized, key=lambda ns: ns[1])] if sized else [])


def link_ceiling(read, sample_bytes: int, what: str, levels: tuple[int, ...] = LINK_LEVELS,
                 repeats: int = 1) -> tuple[Ceiling, str]:
    """An object store's rate through its own client: `read(concurrency)` reads the sample once and returns its
    bytes per second; the best of `levels` (the sweep ends where a level gains under 10 %: the link is full).
    Returns the ceiling and a note when the sample is too small to be a bandwidth figure."""
    if sample_bytes <= 0:
        raise CkptbenchError("the floor's network figure needs the source's objects: none to read")
    best, best_level, tried = [], levels[0], []
    for level in levels:
        rates = [float(read(level)) for _ in range(repeats)]
        tried.append(level)
        if not best or statistics.median(rates) > statistics.median(best):
            gain = statistics.median(rates) / statistics.median(best) if best else float("inf")
            best, best_level = rates, level
            if gain >= KNEE_GAIN:
                continue
        break
    c = _ceiling(best, f"{what} ({sample_bytes >> 20} MiB), concurrency {best_level} of "
                       f"{', '.join(map(str, tried))}")
    c.sample_bytes = sample_bytes
    note = "" if sample_bytes >= MIN_STORAGE_SAMPLE else (
        f"a {sample_bytes >> 20} MiB sample measures request latency more than the link: the floor does not use it "
        "(point at a larger checkpoint)")
    return c, note


# ---- the cache ---------------------------------------------------------------------------------------------------

def box_key() -> dict:
    """What the box figures belong to: another kernel, CPU or memory size is another box."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    import psutil

    return {"kernel": platform.release(), "cpu": model, "cores": os.cpu_count(),
            "memory": psutil.virtual_memory().total}


def cache_path() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ckptbench", "floor.json")


@dataclass
class Floor:
    """The box's ceilings (and the storage ceiling of one mount), as measured or as cached."""

    box: dict
    ceilings: dict[str, Ceiling] = field(default_factory=dict)
    storage: Ceiling | None = None
    mount: str | None = None
    notes: list[str] = field(default_factory=list)
    cached: bool = False

    @property
    def resource(self) -> str:
        """What the storage figure is the rate of: an object store's is the network's, not a device's."""
        return resource_of(self.mount)

    def to_json(self) -> dict:
        doc = {"schema": SCHEMA, "box": self.box, "mount": self.mount, "resource": self.resource,
               "cached": self.cached, "notes": self.notes,
               "ceilings": {k: asdict(c) | {"age_s": c.age_s} for k, c in self.ceilings.items()}}
        doc["storage"] = asdict(self.storage) | {"age_s": self.storage.age_s} if self.storage else None
        return doc


def _load_cache(path: str) -> dict:
    try:
        with open(path) as f:
            doc = json.load(f)
        return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else {}
    except (OSError, ValueError):
        return {}


def _fresh(entry, now: float) -> Ceiling | None:
    """A cached ceiling, when it is well formed and younger than a day."""
    try:
        c = Ceiling(**{k: float(entry[k]) if k != "method" else str(entry[k]) for k in
                       ("gbps", "min_gbps", "max_gbps", "method", "measured_at")})
        c.sample_bytes = int(entry.get("sample_bytes", 0))
    except (KeyError, TypeError, ValueError):
        return None
    return c if 0 <= now - c.measured_at <= MAX_AGE_S and c.gbps > 0 else None


def _busy() -> str:
    """A note when other work held the cores while the box was measured: its figures are then low."""
    try:
        load, cores = os.getloadavg()[0], os.cpu_count() or 1
    except OSError:
        return ""
    return (f"the box was busy (load {load:.1f} on {cores} cores): these figures may be low; `ckptbench floor "
            "--remeasure` when it is quiet") if load > cores else ""


def measure(paths_sizes: list[tuple[str, int]] | None = None, mount: str | None = None, *, remeasure: bool = False,
            path: str | None = None, size: int = POP_BYTES, read=None, read_bytes: int = 0,
            read_what: str = "the source's objects read through its client") -> Floor:
    """This box's floor: the cached figures when they are this box's (and this mount's) and fresh, else measured
    now and cached. The storage figure comes from `paths_sizes` (local files, read here cold) or, for a source
    that is not files on a mount, from `read(concurrency) -> bytes/s` over `read_bytes` (link_ceiling)."""
    path = path or cache_path()
    box = box_key()
    doc = {} if remeasure else _load_cache(path)
    now = time.time()
    floor = Floor(box, mount=mount)
    mine = doc.get("box") == box
    cached = {k: c for k, v in (doc.get("ceilings") or {}).items() if mine and (c := _fresh(v, now))}
    want = ("populate_4k", "populate_thp", "copy", "scan", *(f"hash_{a}" for a in fastio.HASHES if a != "none"))
    if all(k in cached for k in want):
        floor.ceilings, floor.cached = cached, True
    else:
        floor.ceilings = memory_ceilings(size=size) | cpu_ceilings()
        floor.notes += [note] if (note := _busy()) else []
    storages = doc.get("storage") if mine and isinstance(doc.get("storage"), dict) else {}
    if paths_sizes or read is not None:
        kept = _fresh(storages.get(mount or ""), now) if storages and mount else None
        wanted = read_bytes if read is not None else min(STORAGE_SAMPLE, sum(s for _, s in paths_sizes))
        if kept is not None and kept.sample_bytes >= wanted:  # a smaller sample than this source's is measured again
            floor.storage = kept
        else:
            floor.storage, note = (link_ceiling(read, read_bytes, read_what) if read is not None
                                   else storage_ceiling(paths_sizes))
            floor.notes += [note] if note else []
    _save(path, floor, storages if mine else {})
    return floor


def _save(path: str, floor: Floor, storages: dict) -> None:
    if floor.storage is not None and floor.mount:
        storages = dict(storages) | {floor.mount: asdict(floor.storage)}
    doc = {"schema": SCHEMA, "box": floor.box, "ceilings": {k: asdict(c) for k, c in floor.ceilings.items()},
           "storage": storages}
    before = _load_cache(path)
    if before.get("box") == floor.box and isinstance(before.get("write"), dict):
        doc["write"] = before["write"]  # the save side's figures (writefloor.py) stay beside the restore's
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(doc, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a cache that cannot be written is measured again next time


# ---- the model ---------------------------------------------------------------------------------------------------

FRESH, REUSED = "fresh", "reused"


def storage_usable(floor: Floor) -> bool:
    return floor.storage is not None and floor.storage.sample_bytes >= MIN_STORAGE_SAMPLE


def model(floor: Floor, *, bytes_read: int, floating_bytes: int = 0, hash_alg: str = "none",
          destination: str = FRESH, cores: int | None = None, hot: bool = False) -> dict:
    """A restore's floor on this box: per resource, its bytes over its rate (storage — the device when cold, the
    page cache's copy when `hot`; fresh memory for a fresh owned destination, none for a reused or mapped one) and
    the CPU work (hashing, scanning) over the cores; the floor is the largest, and names what binds."""
    cores = cores or floor.box.get("cores") or 1
    times: dict[str, float] = {}
    if hot and "copy" in floor.ceilings:
        times["page cache"] = bytes_read / (floor.ceilings["copy"].gbps * 1e9)
    elif not hot and storage_usable(floor):
        times[floor.resource] = bytes_read / (floor.storage.gbps * 1e9)
    if destination == FRESH:
        pop = max((floor.ceilings[k] for k in ("populate_4k", "populate_thp") if k in floor.ceilings),
                  key=lambda c: c.gbps, default=None)
        if pop is not None:
            times["fresh memory"] = bytes_read / (pop.gbps * 1e9)
    cpu = 0.0
    if hash_alg != "none" and f"hash_{hash_alg}" in floor.ceilings:
        cpu += bytes_read / (floor.ceilings[f"hash_{hash_alg}"].gbps * 1e9)
    if floating_bytes and "scan" in floor.ceilings:
        cpu += floating_bytes / (floor.ceilings["scan"].gbps * 1e9)
    if cpu:
        times["cpu"] = cpu / cores
    if not times:
        return {"floor_s": None, "binding": None, "times_s": {}}
    binding = max(times, key=times.get)
    return {"floor_s": times[binding], "binding": binding, "times_s": times, "destination": destination}


def efficiency(floor_s: float | None, measured_s: float | None) -> float | None:
    """Floor over measured: 1.0 is this box's best; None when either is unknown."""
    if not floor_s or not measured_s or measured_s <= 0:
        return None
    return floor_s / measured_s


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
    ceilings = {k: c for k, v in (doc.get("ceilings") or {}).items() if (c := _fresh(v, now))}
    if not ceilings:
        return None
    storages = doc.get("storage") if isinstance(doc.get("storage"), dict) else {}
    return Floor(doc["box"], ceilings, _fresh(storages.get(mount or ""), now) if mount else None, mount, cached=True)


NOT_MEASURED = "this box's floor is not measured yet: `ckptbench floor SOURCE` measures it in seconds"
# The floor fields every run document carries, in every kind (records/schema.py fills the ones a kind leaves out):
# floor_s, efficiency (floor / measured), the binding resource and its rate, each resource's time, what the floor
# stands on, and the rate the floor moves the bytes at (what a throughput chart draws).
FIELDS = ("floor_s", "efficiency", "binding", "binding_gbps", "floor_times_s", "floor_note", "floor_gbps")


def unmeasured(note: str = NOT_MEASURED) -> dict:
    """The floor fields when there is no floor to hold a figure against, and `note` saying why."""
    return dict.fromkeys(FIELDS) | {"floor_times_s": {}, "floor_note": note}


def restore_fields(floor: Floor | None, *, bytes_read: int, measured_s: float | None, hash_alg: str,
                   floating_bytes: int = 0, hot: bool = False, destination: str = FRESH) -> dict:
    """What every restore document carries: floor_s, efficiency (floor / measured), binding, the per-resource
    times, and a note saying what the floor stands on (or that it is not measured)."""
    if floor is None:
        return unmeasured()
    m = model(floor, bytes_read=bytes_read, floating_bytes=floating_bytes, hash_alg=hash_alg, hot=hot,
              destination=destination)
    rate = {floor.resource: floor.storage, "page cache": floor.ceilings.get("copy"), "fresh memory": max(
        (floor.ceilings[k] for k in ("populate_4k", "populate_thp") if k in floor.ceilings), key=lambda c: c.gbps,
        default=None)}.get(m["binding"])
    note = ("the read was from the page cache; " if hot else "" if storage_usable(floor) else
            f"no {floor.resource} figure for this {'endpoint' if floor.resource == 'network' else 'mount'} "
            "(`ckptbench floor SOURCE` on 64 MiB or more): the floor counts memory and CPU only; ")
    note += "into reused buffers (no fresh memory to populate); " if destination == REUSED else ""
    note += f"ceilings measured {max(c.age_s for c in floor.ceilings.values()) / 3600:.1f} h ago at most"
    return {"floor_s": m["floor_s"], "efficiency": efficiency(m["floor_s"], measured_s), "binding": m["binding"],
            "binding_gbps": rate.gbps if rate is not None else None, "floor_times_s": m["times_s"], "floor_note": note,
            "floor_gbps": bytes_read / m["floor_s"] / 1e9 if m["floor_s"] else None}
