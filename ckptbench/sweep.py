"""Sweep: read throughput against concurrency, and the knee where more concurrency stops paying."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import fastio

from ckptbench import conditions
from ckptbench.errors import Cancelled, CkptbenchError
from ckptbench.pipeline import list_checkpoint
from ckptbench.stats import spread

KNEE_MARGIN = 0.10  # the knee: the smallest level within 10 % of the best median


@dataclass(frozen=True)
class SweepResult:
    source: str
    levels: list[int]
    gbps: dict[int, dict]  # level -> spread of GB/s
    knee: int
    best: int
    margin: float
    cache: str
    cache_verified: bool

    def to_json(self) -> dict:
        return {"source": self.source, "levels": self.levels, "gbps": {str(k): v for k, v in self.gbps.items()},
                "knee": self.knee, "best": self.best, "margin": self.margin, "cache": self.cache,
                "cache_verified": self.cache_verified,
                "recommendation": f"--concurrency {self.knee}"}


def knee(medians: dict[int, float], margin: float = KNEE_MARGIN) -> tuple[int, int]:
    """(knee, best): the smallest level whose median is within `margin` of the best one."""
    best = max(medians, key=lambda k: medians[k])
    for level in sorted(medians):
        if medians[level] >= (1 - margin) * medians[best]:
            return level, best
    return best, best


def parse_levels(text: str) -> list[int]:
    try:
        levels = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise CkptbenchError(f"--levels {text!r}: give whole numbers separated by commas, e.g. 1,8,16,32,64") from None
    if not levels or levels[0] < 1 or levels[-1] > fastio.MAX_CONCURRENCY:
        raise CkptbenchError(f"--levels {text!r}: each level must be 1..{fastio.MAX_CONCURRENCY}")
    return levels


def _read_s3(listing, level: int, hash: str, backend: str):
    from ckptbench.sources import s3read

    a = listing.s3
    opts = s3read.S3ReadOptions(concurrency=level, hash=hash, into="hash", backend=backend)
    return s3read.start(a.client, a.url, a.objects, opts, a.retry_log).wait()


def sweep(source: str, levels: list[int], *, repeats: int = 3, cache: str = "cold", read: str = "pread",
          hash: str = "none", block_size: int = 1 << 20, progress=None, s3_client: str = "threads",
          cancel: threading.Event | None = None) -> SweepResult:
    if repeats < 1:
        raise CkptbenchError(f"--repeat must be at least 1, got {repeats}")
    listing = list_checkpoint(source, max(levels))
    paths = [f.path for f in listing.files]
    results: dict[int, list[float]] = {lv: [] for lv in levels}
    verified = True
    for _ in range(repeats):
        for level in levels:
            if cancel is not None and cancel.is_set():
                raise Cancelled("sweep cancelled")
            if listing.s3 is not None:
                res = _read_s3(listing, level, hash, s3_client)
            else:
                cond = conditions.prepare(paths, cache)
                verified &= cond.verified
                res = fastio.read_files(listing.files, concurrency=level, read=read, hash=hash,
                                        block_size=block_size, chunk_size=max(64 << 20, block_size))
            if res.failed:
                bad = res.failed[0]
                raise CkptbenchError(f"{bad.path}: {bad.error.message} during the sweep; fix the source first")
            results[level].append(res.read_gbps)
            if progress:
                progress(level, res.read_gbps)
    stats = {lv: spread(v) for lv, v in results.items()}
    k, best = knee({lv: s["median"] for lv, s in stats.items()})
    return SweepResult(source, levels, stats, k, best, KNEE_MARGIN, "n/a (s3)" if listing.s3 else cache, verified)
