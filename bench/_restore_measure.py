"""How the restore benchmark measures: its settings, a series of restores or reads (RestoreSeries) with each
repeat's disk reads, stages and check; one pipeline restore; fio replaying the read stage's reads; how fast this
machine faults in fresh memory."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import _peers
from _harness import COLD_MAX, CheckedSeries, MiB, disk_read_bytes

CHUNK = 64 * MiB  # the pipeline's chunk size (fastio units): max(64 MiB, block)
BLOCK = 1 * MiB
STAGES = ("list", "read", "verify", "load", "device", "check")
HOT_ATTEMPTS = 3  # a hot repeat that read from the disk (the cache dropped under it) is run again, this often


@dataclass(kw_only=True)
class RestoreSeries(CheckedSeries):
    """RTO seconds or GB/s over hot or cold repeats, with each repeat's disk reads (while timed), stage times and
    check."""

    path: str
    stages: list[dict[str, float]] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        # a hot repeat that read from the disk was not hot, whatever residency said before it began
        return super().verified and (self.condition != "hot" or all(d <= COLD_MAX for d in self.disk))

    def unverified_because(self) -> str:
        if self.disk and all(self._held(r) for r in self.residency):
            return f"read {max(self.disk):.0%} of the set from the disk"
        return super().unverified_because()

    def stage_median(self, stage: str) -> float | None:
        vals = [s[stage] for s in self.stages if s.get(stage) is not None]
        return statistics.median(vals) if vals else None

    def as_dict(self) -> dict:
        return {"key": self.key, "condition": self.condition, "path": self.path, "unit": self.unit,
                "samples": self.samples, "median": self.median, "min": self.min,
                "max": self.max, "residency": self.residency, "disk_read_share": self.disk,
                "verified": self.verified,
                "status": self.status, "problems": self.problems[:10],
                "stages": self.stages, "stage_medians": {s: self.stage_median(s) for s in STAGES},
                **({"extra": self.extra} if self.extra else {})}


def add_pipeline_repeat(s: RestoreSeries, r, value: float, disk: float) -> None:
    s.samples.append(value)
    s.residency.append(r.cache.residency_before)
    s.disk.append(disk)
    s.stages.append(dict(r.stages))
    s.status.append(r.status)
    s.problems += r.problems


def pipeline_once(listing, **opts):
    """One restore; also the bytes read from the disk from its first timed stage to its end (the cache
    preparation before the clock starts is left out)."""
    from ckptbench.restore import runner as pipeline

    start: list[int] = []

    def progress(stage, _snap) -> None:
        if not start:
            start.append(disk_read_bytes())

    r = pipeline.run(listing.source, pipeline.RunOptions.make(**opts), repeats=1, listing=listing, progress=progress)[0]
    return r, disk_read_bytes() - (start[0] if start else 0)


def run_fio(fio: str, files: list[tuple[str, int]], *, jobs: int, block: int) -> dict:
    """fio psync replaying the read stage's own reads (64 MiB units of 1 MiB reads, `jobs` at once)."""
    t, extra = _peers.run_fio_replay(fio, files, jobs=jobs, block=block, chunk=CHUNK)
    return {"bytes": t.bytes, "seconds": t.seconds, **extra}


def fault_in_gbps(nbytes: int) -> float:
    """How fast this machine hands out fresh memory: one MADV_POPULATE_WRITE over `nbytes` of new anonymous
    memory (what each read-stage worker does before reading a chunk into it), one thread, GB/s."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    view = ctypes.c_char.from_buffer(m)
    try:
        t0 = time.perf_counter()
        rc = libc.madvise(ctypes.addressof(view), nbytes, 23)  # MADV_POPULATE_WRITE, Linux 5.14+
        dt = time.perf_counter() - t0
    finally:
        del view
        m.close()
    if rc != 0:
        raise OSError(ctypes.get_errno(), "madvise(MADV_POPULATE_WRITE)")
    return nbytes / dt / 1e9
