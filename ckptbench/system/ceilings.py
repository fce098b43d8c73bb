"""This box's ceilings, measured: each rate a restore's bytes can pass at, with its method and its spread.

- fresh memory: anonymous pages populated, 4 KiB and transparent huge pages, with MADV_POPULATE_WRITE where the
  kernel has it (a write per page where it has not), over 1, 2, 4.. cores threads; every sample in memory nobody
  freed just before (the samples are held until a kind is done): under a hypervisor that takes freed memory back
  (free page reporting), pages freed a moment ago come back at 9-10 GB/s and the rest at 1.4 (THP, this VM), so a
  sample that reused its predecessor's pages measured a rate no restore in a new process sees;
- copy: into memory populated already, 1, 2, 4.. cores threads;
- every hash kernel and the finite scan, per core; a GPU's host-to-device link where there is one.
The source's own figures (storage or network, its page cache's copy): sourcefigures.py. floor.py caches them all
and models a restore from them.
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

POP_BYTES = 256 << 20  # enough pages that faults, not setup, are what is timed
HASH_BYTES = 64 << 20
REPEATS = 3
LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.pread.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int64)
LIBC.pread.restype = ctypes.c_ssize_t


@dataclass
class Ceiling:
    """One measured rate: bytes per second (the median of the repeats; a CPU kernel's, their best: best_of), their
    min and max, how it was measured."""

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
    of_files: str = ""  # storage: files_key of the checkpoint whose files it read ("" not known)

    @property
    def age_s(self) -> float:
        return max(0.0, time.time() - self.measured_at)


def files_key(paths_sizes) -> str:
    """A short key of a checkpoint's files (their paths): a mount's kept storage figure says whether it read these."""
    import hashlib

    return hashlib.sha256("\0".join(sorted(p for p, _ in paths_sizes)).encode("utf-8", "surrogateescape")
                          ).hexdigest()[:16]


def ceiling_of(rates: list[float], method: str) -> Ceiling:
    return Ceiling(statistics.median(rates) / 1e9, min(rates) / 1e9, max(rates) / 1e9, method, time.time())


def parallel(n: int, work) -> float:
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


def populate(region: mmap.mmap, threads: int, start: int = 0, length: int | None = None) -> tuple[float, str]:
    """Bytes/s of populating the `region` (fresh: mapped and never touched), or its `length` bytes from `start` (a
    multiple of the page size), on `threads` threads, and how it was done. In fastio's native threads, started
    before the clock and let go at once: Python threads after a barrier each waited for the GIL to reach their
    madvise, and 2 threads on 256 MiB read 15 % below a plain C loop (one thread agreed to 0.2 %)."""
    length = len(region) - start if length is None else length
    part = length // threads // mmap.PAGESIZE * mmap.PAGESIZE
    with memoryview(region) as whole, whole[start:start + threads * part] as view, _threads(threads):
        seconds, how = fastio.populate(view, threads)
    return threads * part / max(seconds, 1e-9), how


@contextlib.contextmanager
def _threads(n: int):
    """fastio's native threads that could not start (a pids limit) said as `parallel` says it: one line."""
    try:
        yield
    except fastio.FastIOError as exc:
        if exc.errno != errno.EAGAIN:
            raise
        raise CkptbenchError(f"the floor could not start {n} threads ({os.strerror(exc.errno)}): run it where this "
                             "process may start one thread per core") from None


def anonymous(size: int, huge: bool) -> mmap.mmap:
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
    """The repeats' rates at the best thread count of 1, 2, 4.. cores (sweep), how, and that count. Every sample is
    made fresh by `make()` and held until all are measured (see the module's note on freed memory), within a
    budget: past it the oldest sample goes first (a many-core box, a small one), so the floor never takes the box's
    memory."""
    held, how = [], [""]
    budget = _hold_budget()

    def sample(n: int) -> float:
        while held and sum(map(len, held)) + len(held[-1]) > budget:  # every sample is one size
            close(held.pop(0))
        held.append(make())
        rate, how[0] = populate(held[-1], n)
        return rate

    try:
        best, best_n = sweep(thread_counts(cores), sample, repeats)
    finally:
        for region in held:
            close(region)
    return best, how[0], best_n


def sweep(counts: list[int], sample, repeats: int) -> tuple[list[float], int]:
    """`repeats` rates of `sample(n)` at the best of the thread `counts`, and that count: one sample at each count,
    the rest at the best, and a count whose one sample beat that median gets its repeats too (the median decides).
    Every count repeated cost `floor` a third of its seconds for the same figure (a 1-thread sample takes twice a
    2-thread one, and a 16-core box sweeps five counts)."""
    first = {n: sample(n) for n in counts}
    runs = {}
    for n in sorted(first, key=first.get, reverse=True):
        if runs and first[n] <= max(map(statistics.median, runs.values())):
            break  # every count left sampled below a median found: not the best
        runs[n] = [first[n]] + [sample(n) for _ in range(repeats - 1)]
    best_n = max(runs, key=lambda n: statistics.median(runs[n]))
    return runs[best_n], best_n


def _copy(src, dst, threads: int) -> float:
    """Bytes/s of copying into memory populated already (the pages exist: only the bytes move), in fastio's native
    threads started before the clock (populate says why)."""
    with _threads(threads):
        seconds, n = fastio.copy(dst, src, threads)
    return n / max(seconds, 1e-9)


def thread_counts(cores: int) -> list[int]:
    """1, 2, 4, ... and the core count itself: a many-core box is swept in seconds, not one count at a time."""
    return sorted({1 << i for i in range(cores.bit_length()) if 1 << i <= cores} | {cores})


def counts_text(cores: int) -> str:
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
    gives an allocation that asks for none), populated once on every core (for LARGE_BUDGET_S at most). On a VM the host backs the first of a
    guest's fresh memory and faults the rest in, so a restore's gigabytes populate slower than the base samples'
    hundreds of megabytes (4 GiB at 2.2 GB/s where 256 MiB samples ran at 5.3, here). Returns the ceiling (None when
    the box has not half its available memory to spare) and the region, which the caller closes."""
    cores = cores or os.cpu_count() or 1
    size = large_reach(nbytes)
    if not size:
        return None, None
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        rate, how, done = _populate_for(region, cores, LARGE_BUDGET_S)
    except BaseException:
        region.close()
        raise
    part = "" if done == size else f" ({done >> 20} MiB of it in the {LARGE_BUDGET_S:g} s the sample may take)"
    c = ceiling_of([rate], f"{how}, {_plain_pages()} (a plain allocation's), one sample of {size >> 20} MiB{part}, "
                         f"{cores} thread(s), fresh")
    c.sample_bytes = size  # the class it stands for (its key), populated in part or whole
    return c, region


LARGE_BUDGET_S = 2.5  # the size-class sample's seconds at most (see _populate_for)
LARGE_STEP = 256 << 20


def _populate_for(region: mmap.mmap, threads: int, budget_s: float) -> tuple[float, str, int]:
    """Bytes/s of populating `region` from its start in LARGE_STEP steps until it is whole or `budget_s` has passed,
    how, and the bytes populated. Why a budget: `ckptbench floor` is to take seconds, and at the 0.7 GB/s a VM's host
    gives fresh memory on a bad minute, a 4 GiB class alone took 5 s of a 15 s floor. The first steps are the
    allocation's first pages, which a host backs fastest, so a sample cut short reads, if anything, fast: the floor
    it gives is shorter, never kinder to the restore held to it."""
    step = max(LARGE_STEP // threads // mmap.PAGESIZE, 1) * mmap.PAGESIZE * threads
    done = counted = 0
    seconds, how = 0.0, ""
    while done < len(region) and (not done or seconds < budget_s):
        n = min(step, len(region) - done)
        taken = n // threads // mmap.PAGESIZE * mmap.PAGESIZE * threads  # what populate counts (whole pages each)
        if not taken:
            break  # a tail under a page a thread: nothing to time
        rate, how = populate(region, threads, done, n)
        seconds += taken / rate
        counted += taken
        done += n
    return (counted / seconds if seconds else 0.0), how, done


def memory_ceilings(cores: int | None = None, size: int = POP_BYTES, repeats: int = REPEATS,
                    restore_bytes: int = 0) -> dict[str, Ceiling]:
    """Fresh-memory population (4 KiB pages and THP) and copy into populated memory, at the best thread count of
    1, 2, 4.. cores; each figure the median of `repeats`. With `restore_bytes` of LARGE_MIN or more, fresh memory
    at that restore's size too (populate_large), measured after them. Why after: the size-class sample takes the
    memory the host still backs, and the base samples measured while it was held landed in memory it faults in
    (here: 4 KiB 0.57 GB/s and THP 0.9 beside 4.5 and 8.9 with nothing held, and a floor of 6.7 s beside 3.2);
    a small restore in a new process meets the memory nothing holds. Measured after them, the size-class sample
    met what it met alone (3.2-5.0 GB/s against 3.6-4.6 here): the base samples' pages, just freed, are the ones
    the host still backed before them."""
    cores = cores or os.cpu_count() or 1
    out = _memory_ceilings(cores, size, repeats)
    large, region = populate_large(restore_bytes, cores) if restore_bytes else (None, None)
    if region is not None:
        region.close()
    return out | ({large_key(large.sample_bytes): large} if large is not None else {})


def _memory_ceilings(cores: int, size: int, repeats: int) -> dict[str, Ceiling]:
    out: dict[str, Ceiling] = {}
    # huge pages first: they need whole 2 MiB blocks, which the 4 KiB samples' freed pages would hand back warm
    for key, huge in (("populate_thp", True), ("populate_4k", False)):
        best, how, best_n = _best(lambda: anonymous(size, huge), mmap.mmap.close, cores, repeats)
        out[key] = ceiling_of(best, f"{how}, {'transparent huge pages' if huge else '4 KiB pages'}, "
                                  f"{best_n} thread(s) of {counts_text(cores)}, each sample fresh")
    # made once (making them costs more than copying them), on 4 KiB pages as a restore's buffers: a bytearray's
    # pages were huge or not as the allocator and THP fell out, and the figure with them (4.2-10.5 GB/s in ten runs
    # here where 4 KiB pages gave 9.7-10.5; 11-18 over five floor runs in peers bench run 27)
    src, dst = anonymous(size, huge=False), anonymous(size, huge=False)
    try:
        block = os.urandom(1 << 20)
        for at in range(0, size - len(block) + 1, len(block)):
            src[at:at + len(block)] = block
        dst[:] = src  # every page of both written once, untimed, so only the bytes move
        best, best_n = sweep(thread_counts(cores), lambda n: _copy(src, dst, n), repeats)
    finally:
        src.close()
        dst.close()
    out["copy"] = ceiling_of(best, f"memmove into populated memory (4 KiB pages), {best_n} thread(s) of "
                                   f"{counts_text(cores)}")
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
        out[key] = ceiling_of(rates, f"torch copy of {size >> 20} MiB from {'pinned' if pinned else 'pageable'} host "
                                   f"memory to cuda:0 ({name}), {repeats} repeats after one untimed")
        del src
    return out


HASH_MIN = 4 << 20  # the fewest bytes a hash figure is taken over
HASH_BLOCK = 1 << 20  # fastio's read block, which it hashes as it lands
HASH_TIME_S = 0.02  # about how long one of its repeats takes
HASH_MAX = 8 << 30  # the most bytes a repeat is taken over (a kernel at 250 GB/s)
CPU_REPEATS = 5


def _rate(alg: str, data) -> float:
    """Bytes/s of one untimed-in-the-figure pass: how many bytes a repeat of the figure needs."""
    h = fastio.Hasher(alg)
    t0 = time.perf_counter()
    h.update(data)
    return len(data) / max(time.perf_counter() - t0, 1e-9)


def best_of(rates: list[float], method: str) -> Ceiling:
    """A kernel in the CPU's caches: the best of its repeats is the figure. Nothing physical makes one repeat of the
    same bytes in cache slower than another; only what else ran did (a preemption, a neighbour on the host), and the
    best is the stricter floor. Runs a minute apart still differ, by the host: the scan ran 61-67 GB/s in some
    processes and 84-90 in others on the project's VM, each process's repeats within 3 %, on either vCPU pinned."""
    return Ceiling(max(rates) / 1e9, min(rates) / 1e9, max(rates) / 1e9, method, time.time())


def cpu_ceilings(size: int = HASH_BYTES, repeats: int = CPU_REPEATS) -> dict[str, Ceiling]:
    """Every hash kernel and the finite scan, per core (one native thread, the GIL released)."""
    buf = bytearray(os.urandom(1 << 20)) * (size >> 20)
    out: dict[str, Ceiling] = {}
    view = memoryview(buf)
    for alg in fastio.HASHES:
        if alg == "none":
            continue
        # every kernel over about HASH_TIME_S a repeat: a slow one (md5, sha256: 0.4-0.8 GB/s) over fewer bytes
        # (64 MiB of it three times was a tenth of `floor`'s ten seconds), a fast one over more: crc32c over 64 MiB
        # in the CPU's caches took 2 ms, where one preemption moved the figure, and xxh64 spread 18 % over five runs
        n = max(HASH_MIN, min(int(_rate(alg, view[:HASH_MIN]) * HASH_TIME_S), HASH_MAX) >> 20 << 20)
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
        out[f"hash_{alg}"] = best_of(rates, f"fastio.Hasher({alg!r}) over a {HASH_BLOCK >> 20} MiB block hashed "
                                            f"{n // HASH_BLOCK} times (a read's block, in the CPU's caches), one "
                                            f"core, the best of {repeats}")
        block.release()
    # the scan too, on one block: a restore of local files counts each block as it lands (bf16 50 GB/s a core so,
    # 10 over a landed file read back from memory), natively, block after block: one call over the block listed
    # `blocks` times, not a Python call a block (at 85 GB/s a 1 MiB block takes 12 us, near a call's own cost)
    block = view[:HASH_BLOCK]
    t0 = time.perf_counter()
    fastio.count_nonfinite([(view[:HASH_MIN], "f32")], concurrency=1)  # how many blocks a repeat needs (as _rate)
    blocks = max(HASH_MIN, min(int(HASH_MIN / max(time.perf_counter() - t0, 1e-9) * HASH_TIME_S), HASH_MAX)) \
        // HASH_BLOCK
    items = [(block, "f32")] * blocks
    rates = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fastio.count_nonfinite(items, concurrency=1)
        rates.append(blocks * HASH_BLOCK / (time.perf_counter() - t0))
    del items
    block.release()
    view.release()
    out["scan"] = best_of(rates, f"fastio.count_nonfinite over a {HASH_BLOCK >> 20} MiB block of float32 scanned "
                                 f"{blocks} times in one call (a read's block, in the CPU's caches), one core, the "
                                 f"best of {repeats}")
    return out
