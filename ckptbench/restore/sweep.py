"""Sweep: read throughput against concurrency, and the knee where more concurrency stops paying."""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace


from ckptbench.core import concurrency as conc
from ckptbench.core.errors import Cancelled, CkptbenchError
from ckptbench.restore.reading import read_source
from ckptbench.sources import ReadOptions, Source, open_source
from ckptbench.core.stats import spread

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
    failed: tuple[tuple[str, str], ...] = ()  # (path, why) of what could not be read; the rest was measured
    layout: dict | None = None  # which checkpoint of the folder was read, and why (resume.choose)

    def to_json(self) -> dict:
        return {"source": self.source, "levels": self.levels, "gbps": {str(k): v for k, v in self.gbps.items()},
                "knee": self.knee, "best": self.best, "margin": self.margin, "cache": self.cache,
                "cache_verified": self.cache_verified,
                "failed": [{"path": p, "error": why} for p, why in self.failed],
                "recommendation": f"--concurrency {self.knee}", "layout": self.layout}


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
    if not levels or levels[0] < conc.MIN or levels[-1] > conc.MAX:
        raise CkptbenchError(f"--levels {text!r}: each level must be {conc.MIN}..{conc.MAX}")
    return levels


def sweep(source: str | Source, levels: list[int], *, repeats: int = 3, cache: str = "cold",
          opts: ReadOptions | None = None, progress=None, cancel: threading.Event | None = None) -> SweepResult:
    """Reads the whole source once per level and repeat; `opts` gives everything but the concurrency."""
    if repeats < 1:
        raise CkptbenchError(f"--repeat must be at least 1, got {repeats}")
    for level in levels:
        conc.check(level, "--levels")
    src = open_source(source) if isinstance(source, str) else source
    base = opts or ReadOptions(hash="none")
    listing = src.list()
    results: dict[int, list[float]] = {lv: [] for lv in levels}
    failed = {d: f"directory not readable ({why})" for d, why in listing.skipped}
    verified = True
    for _ in range(repeats):
        for level in levels:
            if cancel is not None and cancel.is_set():
                raise Cancelled("sweep cancelled")
            rep = read_source(src, listing, replace(base, concurrency=level), cache=cache, cancel=cancel)
            verified &= rep.cache.verified
            failed.update({f.path: f.error.message for f in rep.result.failed})
            results[level].append(rep.read_gbps)
            if progress:
                progress(level, rep.read_gbps)
    stats = {lv: spread(v) for lv, v in results.items()}
    k, best = knee({lv: s["median"] for lv, s in stats.items()})
    label = cache if src.has_page_cache else f"n/a ({src.scheme})"
    return SweepResult(listing.source, levels, stats, k, best, KNEE_MARGIN, label, verified,
                       tuple(sorted(failed.items())), listing.layout.describe() if listing.layout else None)
