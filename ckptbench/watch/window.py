"""When a watched restore read: between the job's marks, else from the samples, its first and last intervals cut to
the time their bytes took (a 0.4 s load sampled every 0.25 s spans three intervals, and counting them whole timed it
at 0.88 s), and why a restore cannot be timed when it cannot."""

from __future__ import annotations

from dataclasses import dataclass

IO_MIN_BPS = 20e6  # below this an interval is not "reading": a job's logging and imports read a little
FAULT_MIN_PER_S = 2000  # major faults per second that make an interval "faulting" (an mmap load from disk)
PROGRESS_MIN = 1 << 20  # bytes in an interval that are the restore's progress: less is a log line or a header
SEEN_MIN = 0.9  # of what the files' pages say the job read: a window whose counters hold less missed some of it
FINE_INTERVAL_S = 0.02  # the sampling interval advised for a load too short to time (the sampler's finest useful one)


def got(read_calls: int, mapped: int, disk: int) -> int:
    """The bytes a job brought in: read calls and mappings are two ways in (added); the disk's count overlaps both
    (a fault from disk, read-ahead), so it is the larger of the two, never added."""
    return max(read_calls + mapped, disk)


def _bytes(i) -> int:
    return got(i.bytes, i.mapped_bytes, i.disk_bytes)


def _dt(i) -> float:
    return max(1e-9, i.t1 - i.t0)


def fetching(i) -> bool:
    """Bringing bytes in from storage or into checkpoint mappings at a rate a restore reads at, whatever its CPU did
    meanwhile. Read calls alone are not enough away from a checkpoint file: a job's imports read their modules at
    20 MB/s and more, from the page cache."""
    return (max(i.disk_bytes, i.mapped_bytes) / _dt(i) >= IO_MIN_BPS) or i.majflt_per_s >= FAULT_MIN_PER_S


@dataclass(frozen=True)
class Window:
    t0: float  # seconds since the watch started
    t1: float
    how: str  # "marks", "samples" (its ends cut to their bytes), or "" (nothing read)
    note: str = ""  # why it cannot time the restore; "" when it can


def _read_calls(i) -> bool:
    """Read calls alone at a reading rate: a checkpoint file's, next to an interval that held one."""
    return i.bytes >= PROGRESS_MIN and i.bytes / _dt(i) >= IO_MIN_BPS


def reading_window(intervals: list, marks: list[dict], interval_s: float | None = None,
                   files_bytes: int = 0, held_bytes: int = 0) -> Window:
    """The restore's reading window. With two marks or more, between the first and the last. Else from the first to
    the last interval with progress among those where a checkpoint file was held (open or mapped at their end) and
    the runs of intervals either side of them that fetched at a reading rate (a shard mapped, read and let go between
    two samples); without such a file, the intervals that fetched, else those that read. Time after the last read
    (the job sleeping, tearing down) and before the first is not reading. `files_bytes`, what the checkpoint files'
    pages say the job read, widens it to the nearest reads until its counters hold that much (`_reach`). `held_bytes`,
    the size of the checkpoint files seen, lets read calls beside the held intervals in until the window holds that
    much: a hot torch.load opens, reads and closes its file between two samples but one, and its 288 MiB were
    counted as the 16 MiB of the one that saw the file open (`_beside`)."""
    if len(marks) >= 2:
        return Window(marks[0]["t"], marks[-1]["t"], "marks")
    n = len(intervals)
    held = [k for k, i in enumerate(intervals) if i.ckpt_files > 0 or i.mapped_bytes > 0]
    if held:
        lo, hi = held[0], held[-1]
        while lo > 0 and fetching(intervals[lo - 1]):
            lo -= 1
        while hi + 1 < n and fetching(intervals[hi + 1]):
            hi += 1
        lo, hi = _beside(intervals, lo, hi, held_bytes)
    else:
        reads = [k for k, i in enumerate(intervals) if fetching(i)] or \
                [k for k, i in enumerate(intervals) if i.phase in ("reading", "faulting")]
        if not reads:
            return Window(0.0, 0.0, "")
        lo, hi = reads[0], reads[-1]
    lo, hi = _reach(intervals, lo, hi, files_bytes)
    moving = [k for k in range(lo, hi + 1) if _bytes(intervals[k]) >= PROGRESS_MIN]
    if moving:
        lo, hi = moving[0], moving[-1]
    return _cut(intervals, lo, hi, interval_s)


def _beside(intervals: list, lo: int, hi: int, cap: int) -> tuple[int, int]:
    """lo..hi widened over the runs of intervals either side whose read calls alone ran at a reading rate (a page-cache
    hit fetches nothing, from disk or into a mapping), while the window holds under `cap` bytes: a job's imports
    before its load, or its next file after it, are not the load's once its files' bytes are all in."""
    def inside() -> int:
        return sum(_bytes(i) for i in intervals[lo:hi + 1])

    while hi + 1 < len(intervals) and inside() < cap and _read_calls(intervals[hi + 1]):
        hi += 1
    while lo > 0 and inside() < cap and _read_calls(intervals[lo - 1]):
        lo -= 1
    return lo, hi


def _reach(intervals: list, lo: int, hi: int, want: int) -> tuple[int, int]:
    """lo..hi widened to the nearest intervals that fetched at a reading rate while its counters hold under SEEN_MIN of
    `want`: a loader that reads a shard, works on it for a second and reads the next is seen holding a file at few
    samples, and a window around those alone left reads out while its bytes counted them all. Where the job's own
    counters missed bytes (the disk's count of an mmap load's read-ahead) no read is left to add, and it stops."""
    def inside() -> int:
        return sum(_bytes(i) for i in intervals[lo:hi + 1])

    if not want or inside() >= SEEN_MIN * want:
        return lo, hi
    outside = sorted((k for k in range(len(intervals)) if not lo <= k <= hi and fetching(intervals[k])),
                     key=lambda k: min(abs(k - lo), abs(k - hi)))
    for k in outside:
        lo, hi = min(lo, k), max(hi, k)
        if inside() >= SEEN_MIN * want:
            break
    return lo, hi


def finer(interval_s: float | None, words: str) -> str:
    """`words` naming `--interval 0.02` where the watch sampled more coarsely; "" where it sampled at that already
    (a user who had was told to watch again with it)."""
    return words.format(f"`--interval {FINE_INTERVAL_S:g}`") if interval_s is None or \
        interval_s > FINE_INTERVAL_S else ""


def _cut(intervals: list, lo: int, hi: int, interval_s: float | None) -> Window:
    """Intervals lo..hi with the first begun and the last ended where their bytes, at the rate of the intervals
    between them (of the faster of the two when none is between), say the reads began and ended: a sample interval
    is not a restore's time. One interval alone cannot be cut: the reads took less than it, by how much is unknown."""
    a, z = intervals[lo], intervals[hi]
    if lo == hi:  # intervals made by hand (interval_s None) are not samples: they are timed as they are
        if interval_s is not None and (timed := _by_steps([a], 0.0, parts_min=2)) is not None:
            return timed  # its byte counters' readings inside it say where the reads were
        note = "" if interval_s is None else (
            f"the reads fit in one sampling interval ({interval_s:g} s): too short to time; "
            f"{finer(interval_s, 'watch with {}, or ')}mark the load (`from ckptbench.mark import stage`)")
        return Window(a.t0, a.t1, "samples", note)
    between = intervals[lo + 1:hi]
    if between:
        rate = sum(_bytes(i) for i in between) / sum(_dt(i) for i in between)
    else:
        rate = max(_bytes(a) / _dt(a), _bytes(z) / _dt(z))
        if (timed := _by_steps([a, z], rate)) is not None:
            return timed
    if rate <= 0:
        return Window(a.t0, z.t1, "samples")
    return Window(max(a.t0, a.t1 - _bytes(a) / rate), min(z.t1, z.t0 + _bytes(z) / rate), "samples")


FAST_SHARE = 0.25  # of the fastest part's rate: a part of an end interval slower than this is not the load's (imports)


def _by_steps(ends: list, rate: float, parts_min: int = 1) -> Window | None:
    """The end intervals (two, none between; or one alone) timed by their parts (the sampler reads the byte counters
    STEPS times an interval): from the first to the last part that read at a quarter of the fastest part's rate or
    more, each cut to its bytes at that rate. The faster interval's rate, what a cut has without them, is the load's
    only where it read through the whole of it: a hot torch.load of 300 MiB in 0.17 s across a sample read 150 MiB in
    each and was timed at 0.50 s; and a load inside one interval had no time at all. None where the parts do not hold
    the bytes (a mapping's are not in them), say no more than the intervals, or are fewer than `parts_min` (reads
    inside one part of one interval: the clock has no finer grain to time them by)."""
    if not all(i.steps for i in ends):
        return None
    parts = []
    for i in ends:
        t = i.t0
        for t1, n in i.steps:
            parts.append((t, t1, n))
            t = t1
    peak = max(n / max(1e-9, t1 - t0) for t0, t1, n in parts)
    fast = [(t0, t1, n) for t0, t1, n in parts if n / max(1e-9, t1 - t0) >= FAST_SHARE * peak]
    if peak <= rate or len(fast) < parts_min or sum(n for _, _, n in fast) < SEEN_MIN * sum(_bytes(i) for i in ends):
        return None
    (f0, f1, fn), (l0, l1, ln) = fast[0], fast[-1]
    return Window(max(f0, f1 - fn / peak), min(l1, l0 + ln / peak), "samples")
