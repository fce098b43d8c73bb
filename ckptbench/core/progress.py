"""The one live line for a terminal — bytes done of total, rate now and on average, ETA — used by run, dist, watch
and save; each adds its own head (repeat, stage, ranks, phase) and tail (files, workers, CPU)."""

from __future__ import annotations

import sys
import threading
from typing import TextIO

import fastio

from ckptbench.core.units import human_bytes, human_pct


def fmt_us(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us:.0f} µs" if us < 1000 else f"{us / 1000:.1f} ms"  # a space before the unit, as every figure


def eta_s(done: int, total: int | None, seconds: float) -> float | None:
    """The one ETA: what is left at the average rate so far (`done` over `seconds`, the clock the caller's work
    started on); None when nothing is known or nothing is left."""
    if not total or done <= 0 or seconds <= 0 or done >= total:
        return None
    return (total - done) / (done / seconds)


class Rates:
    """Rate now (since the previous point) and on average (since the start), in GB/s, from successive
    (seconds, bytes done) points on one clock; a clock that goes back is a new piece of work."""

    def __init__(self) -> None:
        self.last: tuple[float, int] | None = None
        self.now = 0.0

    def update(self, seconds: float, done: int) -> tuple[float, float]:
        if self.last is not None and (seconds < self.last[0] or done < self.last[1]):
            self.last, self.now = None, 0.0
        t0, b0 = self.last or (0.0, 0)
        if seconds > t0:
            self.now = (done - b0) / (seconds - t0) / 1e9
            self.last = (seconds, done)
        return self.now, done / seconds / 1e9 if seconds > 0 else 0.0


def live_line(done: int, total: int | None, now_gbps: float, avg_gbps: float, eta: float | None, *,
              head: str = "", tail: str = "") -> str:
    """`head`, progress through the bytes, the two rates and the ETA, then `tail`."""
    share = f"{human_pct(done / total):>5s} {human_bytes(done)}/{human_bytes(total)}" if total else human_bytes(done)
    left = f"  ETA {eta:.0f}s" if eta is not None else ""
    return f"{head}{share}  {now_gbps:6.2f} GB/s now, {avg_gbps:6.2f} avg{left}{tail}"


def progress_line(s: fastio.Snapshot, rates: Rates | None = None) -> str:
    """A read's line from the engine's snapshot, on the engine's clock (first byte to now)."""
    now, avg = (rates or Rates()).update(s.elapsed_s, s.bytes)
    eta = None if s.finished else eta_s(s.bytes, s.bytes_planned, s.elapsed_s)
    return live_line(s.bytes, s.bytes_planned, now, avg, eta, tail=(
        f"  files {s.files_done + s.files_failed}/{s.files_total}"
        f"{f' ({s.files_failed} failed)' if s.files_failed else ''}  "
        f"workers {s.active_workers}/{s.concurrency}  p50 {fmt_us(s.latency_us(0.5))} "
        f"p99 {fmt_us(s.latency_us(0.99))}  retries {s.retries}"))


class ProgressLine:
    """Rewrites one line of a terminal in place; silent when the stream is not a terminal. Safe from several
    threads (a sampler's and the caller's)."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.width = 0
        self.rates = Rates()
        self.lock = threading.Lock()

    def show(self, text: str) -> None:
        """`text` over what the line showed before (padded, so a shorter line leaves nothing behind)."""
        if not self.live:
            return
        with self.lock:
            self.stream.write("\r" + text.ljust(self.width))
            self.width = len(text)
            self.stream.flush()

    def progress(self, done: int, total: int | None, seconds: float, *, head: str = "", tail: str = "") -> None:
        """The shared line for `done` bytes of `total` after `seconds` on the caller's clock."""
        now, avg = self.rates.update(seconds, done)
        self.show(live_line(done, total, now, avg, eta_s(done, total, seconds), head=head, tail=tail))

    def clear(self) -> None:
        """Blanks the line, so that a line printed next starts clean; the next show() draws it again."""
        if self.live and self.width:
            with self.lock:
                self.stream.write("\r" + " " * self.width + "\r")
                self.width = 0
                self.stream.flush()

    def __call__(self, snap: fastio.Snapshot) -> None:
        if self.live:
            self.show(progress_line(snap, self.rates))

    def close(self) -> None:
        if self.live and self.width:
            with self.lock:
                self.stream.write("\n")
                self.width = 0
                self.stream.flush()
