"""Auto-tune: concurrency walked up on a live read, each level held until its rate is steady, up to the knee.

The tuner is fed Samples (pass, concurrency, bytes, the reader's clock) and measures a level's rate from the
intervals between two samples taken at that level within one pass, after a short settle. A level is measured once
it has `hold_s` of such intervals (or `hold_bytes`). It stops at the knee by the sweep's own rule (sweep.knee over
the levels measured so far): as soon as the latest level is not the knee, more concurrency stopped paying.
`attach` runs it on a ReadLoop: on the loop's thread, it sets each level and, at the end, the knee.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ckptbench.core import concurrency as conc
from ckptbench.restore.loop import ReadLoop, Sample
from ckptbench.restore.sweep import KNEE_MARGIN, MeasuredKnee, knee, measured_knee

SETTLE_S = 0.25  # of reader time at a new level before it counts: workers start or wind down
HOLD_S = 1.0


def ladder(top: int = conc.MAX) -> list[int]:
    """1, 2, 4, 8, … up to `top` (and `top` itself when it is not a power of two)."""
    top = conc.clamp(top)
    levels = [1]
    while levels[-1] * 2 <= top:
        levels.append(levels[-1] * 2)
    return levels if levels[-1] == top else levels + [top]


@dataclass(frozen=True)
class Level:
    concurrency: int
    gbps: float
    bytes: int  # measured at this level, after the settle
    seconds: float

    @property
    def label(self) -> str:
        return f"c={self.concurrency} {self.gbps:.1f} GB/s"


class AutoTune:
    def __init__(self, levels: list[int] | None = None, *, settle_s: float = SETTLE_S, hold_s: float = HOLD_S,
                 hold_bytes: int | None = None, margin: float = KNEE_MARGIN):
        self.levels = sorted(set(levels)) if levels else ladder()
        for lv in self.levels:
            conc.check(lv, "auto-tune level")
        self.settle_s, self.hold_s, self.hold_bytes, self.margin = settle_s, hold_s, hold_bytes, margin
        self.measured: list[Level] = []
        self.knee: int | None = None
        self._i = 0
        self._prev: Sample | None = None
        self._reset()

    def _reset(self) -> None:
        self._settled = 0.0
        self._bytes = 0
        self._seconds = 0.0

    @property
    def level(self) -> int:
        """The level being measured (the knee once done)."""
        return self.knee if self.knee is not None else self.levels[self._i]

    @property
    def done(self) -> bool:
        return self.knee is not None

    @property
    def rates(self) -> dict[int, float]:
        return {m.concurrency: m.gbps for m in self.measured}

    def feed(self, s: Sample) -> Level | None:
        """Takes one sample; returns the level this sample finished measuring, else None."""
        prev, self._prev = self._prev, s
        if self.done or prev is None or prev.pass_no != s.pass_no:
            return None
        if prev.concurrency != self.level or s.concurrency != self.level:
            return None
        dt, db = s.seconds - prev.seconds, s.bytes - prev.bytes
        if dt <= 0 or db < 0:
            return None
        if self._settled < self.settle_s:
            self._settled += dt
            return None
        self._bytes += db
        self._seconds += dt
        if self._seconds < self.hold_s and not (self.hold_bytes and self._bytes >= self.hold_bytes):
            return None
        measured = Level(self.level, self._bytes / self._seconds / 1e9, self._bytes, self._seconds)
        self.measured.append(measured)
        k, _best = knee(self.rates, self.margin)
        if k != measured.concurrency or self._i == len(self.levels) - 1:
            self.knee = k
        else:
            self._i += 1
            self._reset()
        return measured

    def knee_level(self) -> Level | None:
        return next((m for m in self.measured if m.concurrency == self.knee), None)

    def result(self, source: str, date: str | None = None) -> MeasuredKnee | None:
        """The knee as a measurement of `source` (what `sweep.record_knee` keeps for the checklist); None until done."""
        if not self.done:
            return None
        return measured_knee(source, self.rates, "auto-tune", date, margin=self.margin)


def attach(loop: ReadLoop, tuner: AutoTune, *, on_level: Callable[[Level], None] | None = None,
           on_done: Callable[[Level], None] | None = None) -> Callable[[], None]:
    """Runs `tuner` on `loop`'s samples (on the loop's thread): sets each level on the loop as it comes, the knee
    at the end. Returns a function that detaches it (a loop cancelled mid-tune simply stops feeding it)."""

    def watcher(sample: Sample) -> None:
        measured = tuner.feed(sample)
        if measured is None:
            return
        if on_level:
            on_level(measured)
        loop.set_concurrency(tuner.level)
        if tuner.done:
            loop.unwatch(watcher)
            if on_done:
                on_done(tuner.knee_level())

    loop.set_concurrency(tuner.level)
    loop.watch(watcher)
    return lambda: loop.unwatch(watcher)
