"""The ceilings of a restore's source, measured on its own files or objects: what its bytes pass through before memory.

- storage: the source's own files read back cold (evicted and checked), at the best of a short concurrency sweep,
  with O_DIRECT where the filesystem takes it (readmode decides, as for a restore), and into fresh memory at the
  best level; for an object store, the network: the source's own objects read through its client (a callable the
  caller gives: this folder is below the sources), at the best of a short concurrency sweep;
- the page cache of the source's mount copied out (pread into populated memory, and into a reused buffer), which
  is the kernel's copy, not a memmove: per page it looks the page up and copies it, and a filesystem with large
  folios copies faster than one without (8-9 GB/s from ext4 where shmem gave 6.5 and a memmove 13, 2 threads,
  this VM).
The box's own figures (memory, hashes, a GPU link) and the Ceiling they all are: ceilings.py. floor.py caches them.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import statistics
import time

import fastio

from ckptbench.core.errors import CkptbenchError
from ckptbench.core.units import human_bytes, human_pct
from ckptbench.system.ceilings import (LIBC, POP_BYTES, REPEATS, Ceiling, anonymous, ceiling_of, counts_text,
                                       parallel, populate, sweep, thread_counts)

STORAGE_SAMPLE = 1 << 30  # the most of the source's files read per level
MIN_STORAGE_SAMPLE = 64 << 20  # below this, a read measures the device's latency, not its bandwidth
LINK_SAMPLE = 256 << 20  # the most of an object store's bytes read per level: seconds, not minutes, on a slow link
LINK_LEVELS = (4, 16, 64)  # an object store wants many connections; one would measure a request's latency
KNEE_GAIN = 1.1  # a level that gains less than this over the best so far ends a link sweep: the link is full


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
                note = (f"not cold ({human_pct(cond.residency_before)} still cached after eviction): the storage figure is "
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
    c = ceiling_of(best, f"the {len(chosen)} largest file(s) of {where} ({human_bytes(total)}) read "
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
        note = (note + "; " if note else "") + (f"a {human_bytes(total)} sample measures latency more than bandwidth: "
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
        f"; from the page cache into populated memory {gbps:.2f} GB/s ({min(hot) / 1e9:.2f}..{max(hot) / 1e9:.2f}, "
        f"pread, {n} thread(s) of {counts_text(os.cpu_count() or 1)})"
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
            resident = {p: r for p, r, _ in pagecache.residency_of_each(held, held=True)}
            yield None if any(resident.get(h, 0) < n * 0.95 for h, (_, n) in zip(held, take)) else fds
        finally:
            pagecache.evict(held, held=True)
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
        dst = anonymous(total, huge=False)  # 4 KiB pages, as a restore's buffers (fastio maps them so)
        populate(dst, cores)  # untimed: only the copy is this figure
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
                        got = LIBC.pread(fd, base + at, ask, off + done)
                        if got < 0:
                            raise CkptbenchError(f"{p}: unreadable ({os.strerror(ctypes.get_errno())}); the floor "
                                                 "reads the source's own files")
                        if got == 0:
                            raise CkptbenchError(f"{p}: shorter than it was listed; the floor reads the source's "
                                                 "own files")
                        done += got

            return total / parallel(n, one)

        return sweep(thread_counts(cores), copy, repeats)
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
    c = ceiling_of(best, f"{what} ({sample_bytes >> 20} MiB), concurrency {best_level} of "
                       f"{', '.join(map(str, tried))}")
    c.sample_bytes = sample_bytes
    note = "" if sample_bytes >= MIN_STORAGE_SAMPLE else (
        f"a {sample_bytes >> 20} MiB sample measures request latency more than the link: the floor does not use it "
        "(point at a larger checkpoint)")
    return c, note
