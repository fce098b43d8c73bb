"""Sweep: read throughput against concurrency, and the knee where more concurrency stops paying — measured here or
by an auto-tune, kept in the results file, and the one figure concurrency advice goes by (`advice`)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

from ckptbench.core import concurrency as conc
from ckptbench.core.errors import Cancelled, CkptbenchError, redact, shown
from ckptbench.core.interrupt import stops_as_interrupted
from ckptbench.core.options import whole
from ckptbench.core.paths import source_identity
from ckptbench.restore import efficiency
from ckptbench.restore.reading import read_source
from ckptbench.sources import ReadOptions, Source, open_source
from ckptbench.core.stats import spread

KNEE_MARGIN = 0.10  # the knee: the smallest level within 10 % of the best median


@dataclass(frozen=True)
class SweepResult:
    source: str
    levels: list[int]  # the levels read (all asked, unless interrupted)
    gbps: dict[int, dict]  # level -> spread of GB/s
    knee: int | None  # None: interrupted short of its reads
    best: int
    margin: float
    cache: str
    cache_verified: bool
    failed: tuple[tuple[str, str], ...] = ()  # (path, why) of what could not be read; the rest was measured
    layout: dict | None = None  # which checkpoint of the folder was read, and why (resume.choose)
    floor: dict | None = None  # the box's floor for these reads and each level's efficiency (restore/efficiency.py)
    # what each read did, as `read` says it: a level of the sweep and `read -c` at that level differ by the hash
    # (the sweep's default is none) and a user could not tell
    hash: str = "none"
    read: str = ""
    read_why: str = ""
    # a sweep stopped by Ctrl-C: reads finished and asked, the one under way, the levels never read (Sweep.result)
    interrupted: dict | None = None

    def to_json(self) -> dict:
        return {"source": self.source, "levels": self.levels, "gbps": {str(k): v for k, v in self.gbps.items()},
                "knee": self.knee, "best": self.best, "margin": self.margin, "cache": self.cache,
                "cache_verified": self.cache_verified, "hash": self.hash, "read": self.read,
                "read_why": self.read_why,
                "failed": [{"path": p, "error": why} for p, why in self.failed],
                "recommendation": None if self.knee is None else f"--concurrency {self.knee}", "layout": self.layout,
                } | ({"status": "cancelled", "interrupted": self.interrupted} if self.interrupted else {}) | (
                    self.floor or {})


def knee(medians: dict[int, float], margin: float = KNEE_MARGIN) -> tuple[int, int]:
    """(knee, best): the smallest level whose median is within `margin` of the best one."""
    best = max(medians, key=lambda k: medians[k])
    for level in sorted(medians):
        if medians[level] >= (1 - margin) * medians[best]:
            return level, best
    return best, best


GBPS_MAX = 10_000.0  # a level's GB/s past any storage a box reads from: a record saying more is no measurement
TEXT_MAX = 64  # a knee record's `how` and `date` as shown ("quick sweep", "2025-01-31 12:00"), past that cut


@dataclass(frozen=True)
class MeasuredKnee:
    """A knee someone measured on a source — a sweep, a quick sweep, an auto-tune — and when: the one figure every
    piece of concurrency advice goes by while there is one (`advice`)."""

    source: str
    knee: int
    best: int
    gbps: dict[int, float]  # median GB/s by level measured
    how: str  # "sweep", "quick sweep", "auto-tune"
    date: str  # UTC, "2025-01-31 12:00"

    @property
    def basis(self) -> str:
        return f"measured knee {self.knee} ({self.how} of {self.date})"

    def to_json(self) -> dict:
        return {"record": "knee", "source": source_identity(self.source), "knee": self.knee, "best": self.best,
                "gbps": {str(k): v for k, v in self.gbps.items()}, "how": self.how, "date": self.date}

    @staticmethod
    def malformed(doc: dict) -> str | None:
        """Why a finished knee document is no whole knee record (hand-edited, torn, written by something else), in
        a few words; None when it is one. Its figures go into advice and a JSON document: each is checked here."""
        gbps = doc.get("gbps")
        if not isinstance(gbps, dict) or not gbps:
            return "it has no GB/s by level"
        for k, v in gbps.items():
            if not (isinstance(k, str) and 0 < len(k) <= 6 and k.isascii() and k.isdigit() and k == str(int(k))
                    and conc.MIN <= int(k) <= conc.MAX):
                return f"level {shown(redact(str(k)), 20)!r} is not a concurrency {conc.MIN}..{conc.MAX}"
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= GBPS_MAX:  # NaN fails too
                return f"its GB/s at level {int(k)} is {shown(redact(str(v)), 20)!r}, not a rate 0..{GBPS_MAX:g}"
        for name in ("knee", "best"):
            v = doc.get(name)
            if isinstance(v, bool) or not isinstance(v, int) or str(v) not in gbps:
                return f"its {name} {shown(redact(str(v)), 20)!r} is not a level it measured"
        for name in ("source", "how", "date"):
            if not isinstance(doc.get(name), str):
                return f"it has no {name}"
        return None

    @classmethod
    def from_json(cls, doc: dict) -> "MeasuredKnee | None":
        """None for a document that is not a whole knee record (a sweep interrupted, or `malformed`). Its `how` and
        `date` are shown as they came: redacted, printable and cut (a 100 kB one was printed whole, twice)."""
        if doc.get("status", "ok") != "ok" or cls.malformed(doc) is not None:
            return None
        gbps = {int(k): float(v) for k, v in doc["gbps"].items()}
        return cls(doc["source"], doc["knee"], doc["best"], gbps, shown(redact(doc["how"]), TEXT_MAX),
                   shown(redact(doc["date"]), TEXT_MAX))


def measured_knee(source: str, medians: dict[int, float], how: str, date: str | None = None, *,
                  margin: float = KNEE_MARGIN) -> MeasuredKnee:
    """The knee of these medians by `knee`'s rule, as a measurement of `source` made `how`, now unless `date`."""
    k, best = knee(medians, margin)
    return MeasuredKnee(source, k, best, dict(sorted(medians.items())), how,
                        date or time.strftime("%Y-%m-%d %H:%M", time.gmtime()))


def _same_source(a: str, b: str) -> bool:
    return source_identity(a) == source_identity(b)


def record_knee(results_path: str, measured: MeasuredKnee) -> None:
    """Appends the knee to the results file's documents, where `recorded_knee` (the checklist) finds it."""
    from ckptbench.records.results import append_document

    append_document(results_path, measured.to_json())


def record_interrupted(results_path: str, res: SweepResult) -> None:
    """An interrupted sweep's levels on record where a knee goes, status `cancelled` and no knee: `recorded_knee`
    passes over it, and so does a ckptbench older than it (a knee that is no number is no knee record)."""
    from ckptbench.records.results import append_document

    append_document(results_path, {
        "record": "knee", "status": "cancelled", "source": source_identity(res.source), "knee": None, "best": None,
        "gbps": {str(lv): s["median"] for lv, s in res.gbps.items()},
        "reads": {str(lv): s["n"] for lv, s in res.gbps.items()}, "how": "sweep",
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "interrupted": res.interrupted})


def recorded_knee(results_path: str, source: str) -> MeasuredKnee | None:
    """The newest knee recorded for `source` in a results file; None when none was (or there is no file)."""
    from ckptbench.records.results import read_documents

    if not results_path:
        return None
    found = [MeasuredKnee.from_json(d) for d in read_documents(results_path, "knee")]
    return next((m for m in reversed(found) if m is not None and _same_source(m.source, source)), None)


@dataclass(frozen=True)
class Advice:
    concurrency: int | None  # None: nothing measured and no preset
    basis: str  # "measured knee 2 (auto-tune of …)" or "no measurement: the local-nvme preset says 4"
    measured: MeasuredKnee | None


def advice(measured: MeasuredKnee | None, preset=None) -> Advice:
    """The concurrency to advise: the measured knee when there is one, the storage preset's minimum only when nothing
    was measured."""
    if measured is not None:
        return Advice(measured.knee, measured.basis, measured)
    if preset is not None and preset.min_concurrency:
        return Advice(preset.min_concurrency,
                      f"no measurement: the {preset.name} preset says {preset.min_concurrency}", None)
    return Advice(None, "no measurement and no preset for this storage", None)


_LEVEL = whole(-(1 << 63))  # any whole number as options spell one; the range is told below, with its own line


def parse_levels(text: str) -> list[int]:
    try:
        levels = sorted({_LEVEL(x.strip()) for x in text.split(",") if x.strip()})
    except ValueError:
        raise CkptbenchError(f"--levels {text!r}: give whole numbers separated by commas, e.g. 1,8,16,32,64") from None
    if not levels or levels[0] < conc.MIN or levels[-1] > conc.MAX:
        raise CkptbenchError(f"--levels {text!r}: each level must be {conc.MIN}..{conc.MAX}")
    return levels


class Sweep:
    """One sweep, its reads kept as they finish: stopped by Ctrl-C, `result` is the levels read so far, as a run
    keeps its finished repeats."""

    def __init__(self, source: str | Source, levels: list[int], *, repeats: int = 3, cache: str = "cold",
                 opts: ReadOptions | None = None):
        if repeats < 1:
            raise CkptbenchError(f"--repeat must be at least 1, got {repeats}")
        for level in levels:
            conc.check(level, "--levels")
        self.levels, self.repeats, self.cache = levels, repeats, cache
        self.src = open_source(source) if isinstance(source, str) else source
        self.base = opts or ReadOptions(hash="none")
        self.listing = self.src.list()
        self.reads: dict[int, list[float]] = {lv: [] for lv in levels}
        self.failed = {d: f"directory not readable ({why})" for d, why in self.listing.skipped}
        self.verified, self.hot, self.rep = True, False, None
        self.under: tuple[int, int] | None = None  # (repeat, level) of the read under way

    @property
    def done(self) -> int:
        return sum(len(v) for v in self.reads.values())

    @property
    def total(self) -> int:
        return self.repeats * len(self.levels)

    def run(self, progress=None, cancel: threading.Event | None = None) -> SweepResult:
        """Reads the whole source once per level and repeat, every level once before any twice."""
        for repeat in range(1, self.repeats + 1):
            for level in self.levels:
                if cancel is not None and cancel.is_set():
                    raise Cancelled("sweep cancelled")
                self.under = (repeat, level)
                with stops_as_interrupted():
                    rep = read_source(self.src, self.listing, replace(self.base, concurrency=level), cache=self.cache,
                                      cancel=cancel)
                self._keep(level, rep)
                if progress:
                    progress(level, rep.read_gbps)
        return self.result()

    def _keep(self, level: int, rep) -> None:
        self.rep, self.under = rep, None
        self.verified &= rep.cache.verified
        self.hot = rep.cache.residency_before >= efficiency.HOT  # the last read: what the floor holds levels against
        self.failed.update({f.path: f.error.message for f in rep.result.failed})
        self.reads[level].append(rep.read_gbps)

    def result(self) -> SweepResult | None:
        """The levels read so far (None before any read finished). Short of its reads, it has no knee (a level not
        read, or not every repeat, could move it) and `interrupted` says where it stopped."""
        read = {lv: v for lv, v in self.reads.items() if v}
        if not read:
            return None
        stats = {lv: spread(v) for lv, v in read.items()}
        medians = {lv: s["median"] for lv, s in stats.items()}
        k, best = knee(medians)
        stopped = None
        if self.done < self.total:
            k, stopped = None, {"reads": self.done, "of": self.total, "repeats": self.repeats,
                                "under": dict(zip(("repeat", "level"), self.under)) if self.under else None,
                                "not_read": [lv for lv in self.levels if lv not in read]}
        label = self.cache if self.src.has_page_cache else f"n/a ({self.src.scheme})"
        floor = efficiency.of_sweep(self.src, self.listing.bytes, medians, self.base.hash, self.hot,
                                    [f.size for f in self.listing.files])
        rep = self.rep
        return SweepResult(self.listing.source, sorted(read), stats, k, best, KNEE_MARGIN, label, self.verified,
                           tuple(sorted(self.failed.items())),
                           self.listing.layout.describe() if self.listing.layout else None, floor, self.base.hash,
                           rep.result.read, rep.read_why, stopped)


def sweep(source: str | Source, levels: list[int], *, repeats: int = 3, cache: str = "cold",
          opts: ReadOptions | None = None, progress=None, cancel: threading.Event | None = None) -> SweepResult:
    """Reads the whole source once per level and repeat; `opts` gives everything but the concurrency."""
    return Sweep(source, levels, repeats=repeats, cache=cache, opts=opts).run(progress, cancel)
