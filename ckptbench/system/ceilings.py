"""This box's ceilings, measured: each rate a restore's bytes can pass at, with its method and its spread.

- storage: the source's own files read back cold (evicted and checked), at the best of a short concurrency sweep,
  with O_DIRECT where the filesystem takes it (readmode decides, as for a restore); for an object store, the
  network: the source's own objects read through its client (a callable the caller gives: this folder is below the
  sources), at the best of a short concurrency sweep;
- fresh memory: anonymous pages populated, 4 KiB and transparent huge pages, with MADV_POPULATE_WRITE where the
  kernel has it (a write per page where it has not), over 1, 2, 4.. cores threads; every sample in memory nobody
  freed just before (the samples are held until a kind is done): under a hypervisor that takes freed memory back
  (free page reporting), pages freed a moment ago come back at 9-10 GB/s and the rest at 1.4 (THP, this VM), so a
  sample that reused its predecessor's pages measured a rate no restore in a new process sees;
- copy: into memory populated already, 1, 2, 4.. cores threads; and out of the page cache of the source's own
  mount (pread into populated memory), which is the kernel's copy, not a memmove: per page it looks the page up
  and copies it, and a filesystem with large folios copies faster than one without (8-9 GB/s from ext4 where
  shmem gave 6.5 and a memmove 13, 2 threads, this VM);
- every hash kernel and the finite scan, per core.
floor.py caches them and models a restore from them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import statistics
import threading
import time
from dataclasses import dataclass

import fastio

from ckptbench.core.errors import CkptbenchError

MADV_POPULATE_WRITE = 23  # Linux 5.14: populate (prefault) writable pages, in the kernel, without touching them
POP_BYTES = 256 << 20  # enough pages that faults, not setup, are what is timed
HASH_BYTES = 64 << 20
STORAGE_SAMPLE = 1 << 30  # the most of the source's files read per level
MIN_STORAGE_SAMPLE = 64 << 20  # below this, a read measures the device's latency, not its bandwidth
LINK_SAMPLE = 256 << 20  # the most of an object store's bytes read per level: seconds, not minutes, on a slow link
LINK_LEVELS = (4, 16, 64)  # an object store wants many connections; one would measure a request's latency
KNEE_GAIN = 1.1  # a level that gains less than this over the best so far ends a link sweep: the link is full
REPEATS = 3
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_LIBC.pread.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64)
_LIBC.pread.restype = ctypes.c_ssize_t


@dataclass
class Ceiling:
    """One measured rate: bytes per second (median of the repeats), their min and max, how it was measured."""

    gbps: float
    min_gbps: float
    max_gbps: float
    method: str
    measured_at: float  # time.time()
    sample_bytes: int = 0  # storage: the bytes the figure read (a small sample measures latency, not bandwidth)
    cold: bool = True  # storage: False when eviction did not hold (the page cache's rate: never kept, never used)
    fresh_gbps: float = 0.0  # storage: the rate read into fresh memory (a restore's destination); 0 not measured
    hot_gbps: float = 0.0  # storage: this mount's page cache copied out (pread) into populated memory; 0 not measured
    hot_reused_gbps: float = 0.0  # storage: the same into a reused block buffer per thread (a `read`'s); 0 not measured

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.measured_at)


def _ceiling(rates: list[float], method: str) -> Ceiling:
    return Ceiling(statistics.median(rates) / 1e9, min(rates) / 1e9, max(rates) / 1e9, method, time.time())


def _parallel(n: int, work) -> float:
    """Seconds for `work(i)` run on n threads at once (each releases the GIL in native code). The threads are all
    started before the clock: a thread's start maps its stack, which waits for the memory-map lock a populating
    thread holds, so threads started on the clock ran one after another (2.8 against a C loop's 5.5 GB/s)."""
    gate = threading.Barrier(n + 1)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            gate.wait()
            work(i)
        except threading.BrokenBarrierError:
            pass  # a sibling did not start: said below
        except BaseException as exc:  # raised on the caller's thread below: a thread's own exception is printed as
            # a traceback and its rate taken as measured (a source file cut short mid-copy gave 12 GB/s)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    started = []
    try:
        for t in threads:
            t.start()
            started.append(t)
    except RuntimeError as exc:  # a pids limit: the started threads would wait at the gate forever (a hang)
        gate.abort()
        for t in started:
            t.join()
        raise CkptbenchError(f"the floor could not start {n} threads ({exc}): run it where this process may start "
                             "one thread per core") from None
    gate.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return seconds


def _populate(region: mmap.mmap, threads: int) -> tuple[float, str]:
    """Bytes/s of populating the `region` (fresh: mapped and never touched) on `threads` threads, and how it was
    done."""
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))  # the export is gone at once: the caller closes it
    part = len(region) // threads // mmap.PAGESIZE * mmap.PAGESIZE
    how = ["MADV_POPULATE_WRITE"]

    def one(i: int) -> None:
        if _LIBC.madvise(base + i * part, part, MADV_POPULATE_WRITE) != 0:  # an older kernel: one write per page
            how[0] = "a write per page"
            ctypes.memset(base + i * part, 1, part)  # ctypes calls drop the GIL: the threads run in parallel

    return threads * part / _parallel(threads, one), how[0]


def _anonymous(size: int, huge: bool) -> mmap.mmap:
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE if huge else mmap.MADV_NOHUGEPAGE)
    return region


HOLD_MAX = 2 << 30  # the most population samples held at once (a quarter of the available memory at most)


CGROUP = "/sys/fs/cgroup"  # where a container's memory limit is read (cgroup v2)


def _hold_budget() -> int:
    """HOLD_MAX, or a quarter of the memory this process may still take (_room)."""
    return min(HOLD_MAX, _room() // 4)


def _room() -> int:
    """The memory this process may still take: the box's available memory, and in a container its cgroup's limit
    less its use (psutil sees the box, not the limit)."""
    import psutil

    room = psutil.virtual_memory().available
    try:
        with open(os.path.join(CGROUP, "memory.max")) as f:
            limit = f.read().strip()
        with open(os.path.join(CGROUP, "memory.current")) as f:
            used = int(f.read().strip())
        if limit.isdigit():
            room = min(room, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass  # no cgroup v2 here: the box's figure stands
    return room


def _best(make, close, cores: int, repeats: int) -> tuple[list[float], str, int]:
    """The repeats' rates at the best thread count of 1, 2, 4.. cores, how, and that count. Every sample is made
    fresh by `make()` and held until all are measured (see the module's note on freed memory), within a budget:
    past it the oldest sample goes first (a many-core box, a small one), so the floor never takes the box's
    memory."""
    held, best, how, best_n = [], [], "", 1
    budget = _hold_budget()
    try:
        for n in thread_counts(cores):
            runs = []
            for _ in range(repeats):
                while held and sum(map(len, held)) + len(held[-1]) > budget:  # every sample is one size
                    close(held.pop(0))
                held.append(make())
                runs.append(_populate(held[-1], n))
            rates = [r for r, _ in runs]
            if not best or statistics.median(rates) > statistics.median(best):
                best, how, best_n = rates, runs[0][1], n
    finally:
        for region in held:
            close(region)
    return best, how, best_n


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


LARGE_MIN = 1 << 30  # a restore this large has its fresh memory measured at its own size (size_class)
LARGE_MAX = 16 << 30  # the largest such sample (and half the available memory at most)
LARGE_KEY = "populate_at_"  # + the size class in MiB: "populate_at_4096m"


def size_class(nbytes: int) -> int:
    """The power of two nearest `nbytes` (in log terms): the sizes fresh memory is measured and cached at."""
    if nbytes < LARGE_MIN:
        return 0
    low = 1 << (nbytes.bit_length() - 1)
    return low if nbytes * nbytes < 2 * low * low else 2 * low  # nbytes < low * sqrt(2): nearer the lower one


def large_key(size: int) -> str:
    return f"{LARGE_KEY}{size >> 20}m"


def large_size(key: str) -> int:
    """The bytes a populate_at_ key was measured at (0: not such a key, or a malformed one)."""
    digits = key[len(LARGE_KEY):-1] if key.startswith(LARGE_KEY) and key.endswith("m") else ""
    # ASCII digits, spelled as large_key spells them: '²'.isdigit() holds and int('²') raises (a traceback in every
    # command); '٣' or '01024' parse, and a second spelling of a size class would stand in for the one written
    size = int(digits) << 20 if digits.isascii() and digits.isdigit() and len(digits) < 9 else 0
    return size if size and key == large_key(size) else 0


def _plain_pages() -> str:
    """The pages a plain allocation gets here (a restore's destination asks for none: fastio's and torch's alike)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "transparent huge pages" if "[always]" in f.read() else "4 KiB pages"
    except OSError:
        return "4 KiB pages"


def large_reach(nbytes: int) -> int:
    """The size the floor populates for a restore of `nbytes`: its size class, or less where the box has not half
    its available memory (a container's limit included) to spare, LARGE_MAX at most; 0 when that is under LARGE_MIN
    or under half the class (no restore of this class is held to a figure under half its size)."""
    want = size_class(nbytes)
    # whole LARGE_MINs (every class is some): the free memory moves a little between runs, and each run measuring
    # its own slightly smaller size would never find the last one's figure in the cache
    size = min(want, LARGE_MAX, _room() // 2 // LARGE_MIN * LARGE_MIN)  # a container's limit too (_room)
    return size if size >= LARGE_MIN and 2 * size >= want else 0


def populate_large(nbytes: int, cores: int | None = None) -> tuple[Ceiling | None, mmap.mmap | None]:
    """Fresh memory as a restore of `nbytes` meets it: one plain allocation of its size class (the pages the box
    gives an allocation that asks for none), populated once on every core. On a VM the host backs the first of a
    guest's fresh memory and faults the rest in, so a restore's gigabytes populate slower than the base samples'
    hundreds of megabytes (4 GiB at 2.2 GB/s where 256 MiB samples ran at 5.3, here). Returns the ceiling (None when
    the box has not half its available memory to spare) and the region: the caller holds it while the base samples
    are measured (they would reuse its freed pages, which come back faster) and closes it."""
    cores = cores or os.cpu_count() or 1
    size = large_reach(nbytes)
    if not size:
        return None, None
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        rate, how = _populate(region, cores)
    except BaseException:
        region.close()
        raise
    c = _ceiling([rate], f"{how}, {_plain_pages()} (a plain allocation's), one sample of {size >> 20} MiB, "
                         f"{cores} thread(s), fresh")
    c.sample_bytes = size
    return c, region


def memory_ceilings(cores: int | None = None, size: int = POP_BYTES, repeats: int = REPEATS,
                    restore_bytes: int = 0) -> dict[str, Ceiling]:
    """Fresh-memory population (4 KiB pages and THP) and copy into populated memory, at the best thread count of
    1, 2, 4.. cores; each figure the median of `repeats`. With `restore_bytes` of LARGE_MIN or more, fresh memory
    at that restore's size too (populate_large), measured first."""
    cores = cores or os.cpu_count() or 1
    large, held = populate_large(restore_bytes, cores) if restore_bytes else (None, None)
    try:
        out = _memory_ceilings(cores, size, repeats)
    finally:
        if held is not None:
            held.close()
    return out | ({large_key(large.sample_bytes): large} if large is not None else {})


def _memory_ceilings(cores: int, size: int, repeats: int) -> dict[str, Ceiling]:
    out: dict[str, Ceiling] = {}
    # huge pages first: they need whole 2 MiB blocks, which the 4 KiB samples' freed pages would hand back warm
    for key, huge in (("populate_thp", True), ("populate_4k", False)):
        best, how, best_n = _best(lambda: _anonymous(size, huge), mmap.mmap.close, cores, repeats)
        out[key] = _ceiling(best, f"{how}, {'transparent huge pages' if huge else '4 KiB pages'}, "
                                  f"{best_n} thread(s) of {_counts(cores)}, each sample fresh")
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


H2D_BYTES = 256 << 20  # a copy this large is the link's rate, not a launch's latency
DEVICE_FIGURES = ("h2d_pinned", "h2d_pageable")


def gpu_models(root: str = "/") -> list[str]:
    """The GPUs' model names as the NVIDIA driver lists them in /proc (no CUDA context, no torch import: this is
    part of the box key, read by every command that looks at the cache); [] on a box without one."""
    import glob

    from ckptbench.core.errors import printable

    out = []
    for info in sorted(glob.glob(os.path.join(root, "proc/driver/nvidia/gpus/*/information")))[:64]:
        try:
            with open(info, errors="replace") as f:
                text = f.read(8192)
        except OSError:
            continue
        model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("Model:")), "")
        out.append(printable(model)[:100] or "unknown")
    return out


def device_ceilings(size: int = H2D_BYTES, repeats: int = REPEATS) -> dict[str, Ceiling]:
    """Host-to-device copies into the first CUDA device, from pinned and from pageable host memory (the device
    stage pins, then copies; a copy from pageable memory is staged through the driver's own pinned buffers), each
    the median of `repeats` after an untimed one (the context and the first copy's setup); {} without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return {}
    dst = torch.empty(size, dtype=torch.uint8, device="cuda")
    name = torch.cuda.get_device_name(0)
    out: dict[str, Ceiling] = {}
    for key, pinned in (("h2d_pinned", True), ("h2d_pageable", False)):
        src = torch.ones(size, dtype=torch.uint8, pin_memory=pinned)
        dst.copy_(src, non_blocking=pinned)
        torch.cuda.synchronize()
        rates = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=pinned)
            torch.cuda.synchronize()
            rates.append(size / (time.perf_counter() - t0))
        out[key] = _ceiling(rates, f"torch copy of {size >> 20} MiB from {'pinned' if pinned else 'pageable'} host "
                                   f"memory to cuda:0 ({name}), {repeats} repeats after one untimed")
        del src
    return out


HASH_MIN = 4 << 20  # the fewest bytes a hash figure is taken over
HASH_BLOCK = 1 << 20  # fastio's read block, which it hashes as it lands
HASH_TIME_S = 0.04  # about how long one of its repeats takes


def _rate(alg: str, data) -> float:
    """Bytes/s of one untimed-in-the-figure pass: how many bytes a repeat of the figure needs."""
    h = fastio.Hasher(alg)
    t0 = time.perf_counter()
    h.update(data)
    return len(data) / max(time.perf_counter() - t0, 1e-9)


def cpu_ceilings(size: int = HASH_BYTES, repeats: int = REPEATS) -> dict[str, Ceiling]:
    """Every hash kernel and the finite scan, per core (one native thread, the GIL released)."""
    buf = bytearray(os.urandom(1 << 20)) * (size >> 20)
    out: dict[str, Ceiling] = {}
    view = memoryview(buf)
    for alg in fastio.HASHES:
        if alg == "none":
            continue
        # a slow kernel (md5, sha256: 0.4-0.8 GB/s) over fewer bytes: its rate holds still over tens of
        # milliseconds, and 64 MiB of it three times was a tenth of `floor`'s ten seconds
        n = min(size, max(HASH_MIN, int(_rate(alg, view[:HASH_MIN]) * HASH_TIME_S) >> 20 << 20))
        # one block, hashed again and again: fastio hashes each block as it lands, while it is in the CPU's caches
        # (crc32c 19-20 GB/s a core so, 9 over 64 MiB from memory; a hot `read` beat a floor on the latter by 69 %)
        block = view[:HASH_BLOCK]
        rates = []
        for _ in range(repeats):
            h = fastio.Hasher(alg)
            t0 = time.perf_counter()
            for _ in range(n // HASH_BLOCK):
                h.update(block)
            rates.append(n // HASH_BLOCK * HASH_BLOCK / (time.perf_counter() - t0))
        out[f"hash_{alg}"] = _ceiling(rates, f"fastio.Hasher({alg!r}) over a {HASH_BLOCK >> 20} MiB block hashed "
                                             f"{n // HASH_BLOCK} times (a read's block, in the CPU's caches), one core")
        block.release()
    view.release()
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fastio.count_nonfinite([(buf, "f32")], concurrency=1)
        rates.append(size / (time.perf_counter() - t0))
    out["scan"] = _ceiling(rates, f"fastio.count_nonfinite over {size >> 20} MiB of float32, one core")
    return out


def storage_ceiling(paths_sizes: list[tuple[str, int]], levels: tuple[int, ...] = (1, 4, 8, 16),
                    repeats: int | None = None) -> tuple[Ceiling, str]:
    """The source's own files read back cold (evicted, residency checked), at the best of `levels`; with the read
    path a cold restore takes (readmode: O_DIRECT where the filesystem takes it). Returns the ceiling and a note
    when the cold condition did not hold (then the figure is the page cache's, and it says so)."""
    from ckptbench.system import pagecache, readmode

    chosen, total = [], 0  # the largest files up to the sample; the last one read only as far as the sample goes
    sparse = 0
    for path, size in sorted(paths_sizes, key=lambda ps: -ps[1]):
        if total >= STORAGE_SAMPLE:
            break
        take = min(size, max(1 << 20, (STORAGE_SAMPLE - total) >> 20 << 20))  # whole MiB: O_DIRECT's alignment
        if _hole_in(path, take):  # holes read at memory's rate, not the device's: a file listed at 100 GiB with 3
            sparse += 1  # MiB written read "cold" at 64 GB/s, and the mount's figure held every restore on it to
            continue  # that for a day
        chosen.append((path, take, take < size))
        total += take
    if not chosen or not total:
        raise CkptbenchError("the floor's storage figure needs the source's files: none to read"
                             + (f" ({sparse} sparse file(s) left out: their holes are never read from the device); "
                                "point it at a checkpoint whose files hold their bytes" if sparse else ""))
    # a small sample reads in tens of milliseconds: one read per level is noise, and a noisy-low figure would hold
    # restores to a floor they beat
    repeats = repeats or (3 if total < STORAGE_SAMPLE // 4 else 1)
    paths = [p for p, _, _ in chosen]
    specs = [fastio.FileSpec(p, n, 0) if part else fastio.FileSpec(p, n) for p, n, part in chosen]
    best, best_level, mode, note, cold = [], levels[0], "pread", "", True
    # the lowest level last, and only when the next one up beat every level above it: one reader of a 1 GiB sample
    # took a second of `floor`'s ten and never won here; a device that wants one reader still gets it tried
    order, tried = [*levels[1:], levels[0]] if len(levels) > 1 else list(levels), []
    for level in order:
        if level == levels[0] and len(levels) > 1 and best_level != levels[1]:
            break
        tried.append(level)
        rates = []
        for _ in range(repeats):
            cond = pagecache.prepare(paths, "cold")
            if not cond.verified:
                cold = False
                note = (f"not cold ({cond.residency_before:.0%} still cached after eviction): the storage figure is "
                        "the page cache's rate, so it is shown but neither kept nor used (run as a user who may "
                        "evict the files)")
            mode = readmode.choose([(p, n) for p, n, _ in chosen], cond.residency_before, 1 << 20).mode
            res = fastio.read_files(specs, concurrency=level, read=mode, hash="none")
            if res.failed:
                raise CkptbenchError(f"{res.failed[0].path}: unreadable ({res.failed[0].error.message}); the floor "
                                     "reads the source's own files")
            rates.append(res.read_gbps * 1e9)
        if not best or statistics.median(rates) > statistics.median(best):
            best, best_level = rates, level
    # into fresh memory the faults add work, and more reads in flight hide them: the level the reused buffers liked
    # (4 at least) and the next one up are tried, and the better one read once more (one cold read of a large
    # sample swings by 20 % on a VM; following a level-1 best alone gave floors 30 % apart)
    fresh, fresh_level, low = [], best_level, max(best_level, min(4, levels[-1]))
    for level in sorted({low, min(levels[-1], 2 * low)}) if cold else ():
        rates = _into_fresh(paths, specs, level, repeats)
        if rates and (not fresh or statistics.median(rates) > statistics.median(fresh)):
            fresh, fresh_level = rates, level
    if fresh and repeats == 1:
        fresh += _into_fresh(paths, specs, fresh_level, 1)
    # named by their directory: the cache keeps one figure per mount, and a checkpoint floored later on the same
    # mount is shown this one (a new user read "the source's 3 largest files" of a checkpoint that has no such files)
    from ckptbench.core.errors import printable

    where = printable(os.path.commonpath([os.path.dirname(p) for p in paths]))[-120:]
    c = _ceiling(best, f"the {len(chosen)} largest file(s) of {where} ({total >> 20} MiB) read "
                       f"{'cold' if cold else 'NOT cold'} with {mode}, concurrency {best_level} of "
                       f"{', '.join(map(str, sorted(tried)))}, {repeats} read(s) each"
                       + (f"; into fresh memory {max(fresh) / 1e9:.2f} GB/s at concurrency {fresh_level} (the "
                          f"best of {len(fresh)} at that level)" if fresh else ""))
    c.sample_bytes, c.cold = total, cold
    # the best read, as the storage figure is its best level's: a ceiling is what the box did at its best, and a
    # median of two cold reads that swing by 20 % held restores to a floor they beat
    c.fresh_gbps = max(fresh) / 1e9 if fresh else 0.0
    # a page cache sample under MIN_STORAGE_SAMPLE copies from the CPU's caches (4 MiB at 6.9 GB/s where 256 MiB ran
    # at 4.5, this VM) or times a thread's wake-up, and the figure is the mount's: kept, and held to every hot restore
    # on it (the cold figure of such a sample is not used either)
    c.hot_gbps, c.hot_reused_gbps, words = page_cache_figure([(p, n) for p, n, _ in chosen])
    c.method += words
    if sparse:
        note = (note + "; " if note else "") + (f"{sparse} sparse file(s) left out of the sample: their holes read at "
                                                "memory's rate, not the device's")
    if total < MIN_STORAGE_SAMPLE:
        note = (note + "; " if note else "") + (f"a {total >> 20} MiB sample measures latency more than bandwidth: "
                                                "the floor does not use it (point at a larger checkpoint)")
    return c, note


def _hole_in(path: str, nbytes: int) -> bool:
    """Whether the file has a hole in its first `nbytes` (1 MiB or more: a small file's data may sit in its inode);
    False where the filesystem does not say (it then reports none) or the file cannot be looked at (the read's error
    to report)."""
    if nbytes < 1 << 20:
        return False
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        return os.lseek(fd, 0, os.SEEK_HOLE) < nbytes
    except OSError:
        return False
    finally:
        os.close(fd)


HOT_BYTES = POP_BYTES  # the page cache's sample: tens of milliseconds a copy
PIECE = 8 << 20  # bytes per pread: the call's cost is nothing beside the copy


def _hot_sample(paths_sizes: list[tuple[str, int]]) -> tuple[list[tuple[str, int]], int]:
    """The page cache's sample: the first HOT_BYTES of the files, in whole MiB, and its bytes."""
    take, total = [], 0
    for path, size in paths_sizes:
        n = min(size, HOT_BYTES - total) >> 20 << 20
        if n <= 0:
            break
        take.append((path, n))
        total += n
    return take, total


def page_cache_figure(paths_sizes: list[tuple[str, int]]) -> tuple[float, float, str]:
    """The page cache's copy figures of the files (the largest first, sparse ones left out) in GB/s: into populated
    memory (a restore's destination) and into a reused block buffer per thread (a `read`'s: it stays in the CPU's
    caches, so it copies faster: 11.8 GB/s against 9.8 here); and the words the storage figure's method line gets
    for them; (0.0, 0.0, "") when not measured (a sample under MIN_STORAGE_SAMPLE, a mount that keeps no pages)."""
    sizes = sorted(((p, n) for p, n in paths_sizes if not _hole_in(p, min(n, HOT_BYTES))), key=lambda ps: -ps[1])
    take, total = _hot_sample(sizes)
    if total < MIN_STORAGE_SAMPLE:
        return 0.0, 0.0, ""
    with _in_page_cache(take) as fds:  # read in once for both copies
        if fds is None:
            return 0.0, 0.0, ""
        cores = os.cpu_count() or 1
        hot, n = _page_cache_copy(take, total, cores, REPEATS, fds)
        reused, r_n = _page_cache_copy(take, total, cores, REPEATS, fds, reused=True)
    # a copy that stays in the CPU's caches is not slower than one into memory: a reading under it is noise, and the
    # populated figure is its floor (on a small sample the two are close, and the reused one read lower at times)
    gbps = statistics.median(hot) / 1e9
    reused_gbps = max(gbps, statistics.median(reused) / 1e9) if reused else 0.0
    return gbps, reused_gbps, (
        f"; from the page cache into populated memory {gbps:.2f} GB/s ({min(hot) / 1e9:.2f}-{max(hot) / 1e9:.2f}, "
        f"pread, {n} thread(s) of {_counts(os.cpu_count() or 1)})"
        + (f", into a reused {REUSED_BLOCK >> 20} MiB buffer per thread {reused_gbps:.2f} GB/s ({r_n} thread(s))"
           if reused else ""))


def page_cache_rates(paths_sizes: list[tuple[str, int]], cores: int | None = None, repeats: int = REPEATS,
                     reused: bool = False) -> tuple[list[float], int]:
    """Bytes/s of the files' first HOT_BYTES copied out of the page cache with pread into memory populated already
    (a hot restore's copy, without the population, which is its own figure), at the best of 1, 2, 4.. cores
    threads, and that count; ([], 0) when the filesystem does not keep the pages cached (a FUSE mount with
    direct_io, memory short). The pages are read in first and evicted after: the source is left uncached, as the
    cold reads before left it."""
    cores = cores or os.cpu_count() or 1
    take, total = _hot_sample(paths_sizes)
    with _in_page_cache(take) as fds:
        return _page_cache_copy(take, total, cores, repeats, fds, reused=reused) if fds is not None else ([], 0)


@contextlib.contextmanager
def _in_page_cache(take: list[tuple[str, int]]):
    """The sample's files opened (_open_sample) and read into the page cache: yields their descriptors, or None
    when the filesystem did not keep the pages (nothing to take, a FUSE mount with direct_io, memory short); closed
    and evicted after. Every step works on the files opened here, by their /proc/self/fd names: a name swapped for a
    symlink since the listing is not followed out of the checkpoint by the read-in, the residency check or the
    eviction."""
    from ckptbench.system import pagecache

    if not take:
        yield None
        return
    fds = _open_sample(take)
    try:
        held = [f"/proc/self/fd/{fd}" for fd in fds]
        fastio.read_files([fastio.FileSpec(h, n, 0) for h, (_, n) in zip(held, take)], concurrency=2,
                          read="pread", hash="none")
        try:
            resident = {p: r for p, r, _ in pagecache.residency_of_each(held)}
            yield None if any(resident.get(h, 0) < n * 0.95 for h, (_, n) in zip(held, take)) else fds
        finally:
            pagecache.evict(held)
    finally:
        for fd in fds:
            os.close(fd)


def _open_sample(take: list[tuple[str, int]]) -> list[int]:
    """A descriptor on each file of the sample, checked: never blocks on a FIFO swapped in since the storage reads,
    never follows a final symlink (out of the checkpoint), never reads past the file."""
    import stat

    fds: list[int] = []
    try:
        for p, n in take:
            try:
                fds.append(os.open(p, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOFOLLOW))
                st = os.fstat(fds[-1])
            except OSError as exc:
                if exc.errno != errno.ELOOP:  # ELOOP: a symlink now stands at the name (O_NOFOLLOW), said below
                    raise CkptbenchError(f"{p}: unreadable ({exc.strerror}); the floor reads the source's own "
                                         "files") from None
                st = None
            if st is None or not stat.S_ISREG(st.st_mode) or st.st_size < n:
                raise CkptbenchError(f"{p}: no longer the regular file of {n} bytes or more it was listed as; the "
                                     "floor reads the source's own files")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


REUSED_BLOCK = 1 << 20  # a read's block: fastio's default


def _page_cache_copy(take: list[tuple[str, int]], total: int, cores: int, repeats: int,
                     fds: list[int] | None = None, reused: bool = False) -> tuple[list[float], int]:
    """The copy's rates and best thread count, on `fds` (take's files, opened by _open_sample) or on take's files
    opened here; into the whole populated destination, or (`reused`) in REUSED_BLOCK reads into one block of it
    per thread, as a read's workers do."""
    own = fds is None
    fds = _open_sample(take) if fds is None else fds
    dst = None
    try:
        dst = _anonymous(total, huge=False)  # 4 KiB pages, as a restore's buffers (fastio maps them so)
        _populate(dst, cores)  # untimed: only the copy is this figure
        base = ctypes.addressof(ctypes.c_char.from_buffer(dst))  # the export is gone at once: dst outlives the copy
        pieces, at = [], 0  # (path, fd, file offset, destination offset, bytes)
        for fd, (p, n) in zip(fds, take):
            pieces += [(p, fd, o, at + o, min(PIECE, n - o)) for o in range(0, n, PIECE)]
            at += n

        def copy(n: int) -> float:
            share = -(-len(pieces) // n)

            def one(i: int) -> None:  # ctypes drops the GIL: the threads copy in parallel
                for p, fd, off, d, length in pieces[i * share:(i + 1) * share]:
                    done = 0
                    while done < length:  # pread, not os.preadv: an iovec copies 5-8 % slower than pread's buffer
                        at, ask = (i * REUSED_BLOCK, min(REUSED_BLOCK, length - done)) if reused else \
                            (d + done, length - done)
                        got = _LIBC.pread(fd, base + at, ask, off + done)
                        if got < 0:
                            raise CkptbenchError(f"{p}: unreadable ({os.strerror(ctypes.get_errno())}); the floor "
                                                 "reads the source's own files")
                        if got == 0:
                            raise CkptbenchError(f"{p}: shorter than it was listed; the floor reads the source's "
                                                 "own files")
                        done += got

            return total / _parallel(n, one)

        best, best_n = [], 1
        for n in thread_counts(cores):
            rates = [copy(n) for _ in range(repeats)]
            if not best or statistics.median(rates) > statistics.median(best):
                best, best_n = rates, n
        return best, best_n
    finally:
        if dst is not None:
            dst.close()
        for fd in fds if own else ():
            os.close(fd)


def _into_fresh(paths: list[str], specs: list, level: int, repeats: int) -> list[float]:
    """Bytes/s of the sample read cold into fresh memory of its own, as a restore lands it (at the best level of
    the sweep, with the read path a cold restore takes); [] when a read was not cold. On a box whose device reads
    and page faults share the cores this is below both the device's rate and the population's."""
    from ckptbench.system import pagecache, readmode

    rates, sizes = [], [(s.path, s.size) for s in specs]
    for _ in range(repeats):
        cond = pagecache.prepare(paths, "cold")
        if not cond.verified:
            return []
        mode = readmode.choose(sizes, cond.residency_before, 1 << 20).mode
        t0 = time.perf_counter()
        res = fastio.read_files(specs, concurrency=level, read=mode, hash="none", into_memory=True)
        seconds = time.perf_counter() - t0  # the mapping of the buffers counts: a restore pays it too
        if res.failed:
            raise CkptbenchError(f"{res.failed[0].path}: unreadable ({res.failed[0].error.message}); the floor "
                                 "reads the source's own files")
        rates.append(res.bytes / seconds)
        del res  # the buffers go before the next read: it must land in memory as fresh as the first
    return rates


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
