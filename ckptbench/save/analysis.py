"""What a series of saves says: sustained durable throughput, the interval it allows, how close the page cache's
dirty pages came to the kernel's limit, write amplification, and what staggering the ranks changed."""

from __future__ import annotations

import statistics

from ckptbench.core.stats import sustained_rate
from ckptbench.save.report import HEADROOM, SaveReport
from ckptbench.system import writefloor


def steady(saves: list) -> tuple[list, str]:
    """The saves the sustained figures are taken over, and in words: those after the first (its page cache and files
    start cold), or the only save when there is one."""
    if len(saves) > 1:
        return saves[1:], f"the {len(saves) - 1} save(s) after the first"
    return saves, "the only save"


def sustained(saves: list) -> tuple[float | None, float | None]:
    """(GB/s, median durable seconds) over the steady saves."""
    kept, _ = steady(saves)
    if not kept:
        return None, None
    durable = statistics.median(s.durable_s for s in kept)
    return sustained_rate([s.bytes for s in kept], [s.durable_s for s in kept]), durable


def dirty_peak(samples: list) -> float | None:
    """The highest (Dirty + Writeback) / dirty limit seen: 1.0 means writers were held at the limit."""
    fr = [(s.dirty_bytes + s.writeback_bytes) / s.dirty_limit_bytes for s in samples if s.dirty_limit_bytes > 0]
    return max(fr) if fr else None


def throttled(samples: list) -> bool:
    """The kernel throttles writers (balance_dirty_pages) once Dirty + Writeback passes the midpoint between the
    background and the hard limit; a sample above it means a writer was paused."""
    return any(s.dirty_bytes + s.writeback_bytes > (s.dirty_background_bytes + s.dirty_limit_bytes) / 2
               for s in samples if s.dirty_limit_bytes > 0)


def overlap(spans: list[dict]) -> dict:
    """Of one save's rank writes: the most ranks writing at once, and the share of the writing time with two or
    more at once."""
    events = sorted([(s["start_s"], 1) for s in spans] + [(s["end_s"], -1) for s in spans])
    active = peak = 0
    busy = shared = 0.0
    prev = None
    for t, d in events:
        if prev is not None:
            busy += (t - prev) if active else 0.0
            shared += (t - prev) if active >= 2 else 0.0
        active += d
        peak = max(peak, active)
        prev = t
    return {"peak_concurrent_ranks": peak, "overlap_fraction": shared / busy if busy else 0.0}


def peak_rate(spans: list[dict]) -> tuple[float, float]:
    """(peak, all-at-once) application write GB/s of one save: each rank writing at its own measured rate, summed
    over the ranks writing at the same time; all-at-once sums every rank, as when none is staggered."""
    rates = [(s["start_s"], s["end_s"], s["bytes"] / (s["end_s"] - s["start_s"]) / 1e9)
             for s in spans if s["end_s"] > s["start_s"]]
    peak = max((sum(r for a, b, r in rates if a <= t < b) for t, _, _ in rates), default=0.0)
    return peak, sum(r for _, _, r in rates)


def stagger_summary(saves: list, samples: list, opts) -> dict | None:
    if opts.ranks < 2 or not any(s.spans for s in saves):
        return None
    per = [overlap(s.spans) for s in saves if s.spans]
    rates = [peak_rate(s.spans) for s in saves if s.spans]
    device = [s.write_mbps for s in samples if s.write_mbps is not None]
    return {"ranks": opts.ranks, "stagger_s": opts.stagger_s,
            "peak_concurrent_ranks": max(p["peak_concurrent_ranks"] for p in per),
            "overlap_fraction": statistics.median(p["overlap_fraction"] for p in per),
            "peak_write_gbps": statistics.median(r[0] for r in rates),
            # the same ranks' rates had they all started together (no stagger): what the stagger takes off the peak
            "peak_write_gbps_all_at_once": statistics.median(r[1] for r in rates),
            "device_peak_write_mbps": max(device) if device else None}


def analyze(target: str, opts, saves: list, samples: list, checks: list, device_bytes: int | None,
            notes: list[str]) -> SaveReport:
    gbps, durable = sustained(saves)
    kept, which = steady(saves)  # the floor's efficiency over the same saves as the sustained throughput
    size = saves[-1].bytes if saves else 0
    needed = size / opts.interval_s / 1e9 if opts.interval_s else None
    total = sum(s.bytes for s in saves)
    # without fsync the bytes need not have reached the device when the series ends: a 0.000× was printed
    amplification = device_bytes / total if device_bytes is not None and total and opts.fsync else None
    notes = list(notes)
    if amplification is not None:
        notes.append("write amplification counts every write the device took meanwhile, other processes' too")
    elif device_bytes is not None:
        notes.append("--no-fsync: the bytes need not have reached the device when the saves end, so the write "
                     "amplification is not known")
    else:
        notes.append("no block device under the target (tmpfs, FUSE, network): write MB/s, %util, w_await and "
                     "write amplification are not known")
    if not opts.fsync:
        notes.append("--no-fsync: 'durable' times end at the rename, the bytes may still be only in memory")
    if opts.async_save:
        notes.append("--async: blocking ends when DCP's async_save returns, after staging the state")
    return SaveReport(target=target, format=opts.format, bytes=size, saves=saves, samples=samples, preflight=checks,
                      sustained_gbps=gbps, needed_gbps=needed,
                      shortest_safe_interval_s=durable * HEADROOM if durable is not None else None,
                      dirty_peak_fraction=dirty_peak(samples), throttled=throttled(samples),
                      write_amplification=amplification, options=opts, stagger=stagger_summary(saves, samples, opts),
                      notes=notes, floor=writefloor.save_fields(target, size, [t.durable_s for t in kept], which))
