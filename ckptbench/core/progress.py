"""One live progress line for a terminal, built from engine snapshots."""

from __future__ import annotations

import sys
from typing import TextIO

import fastio

from ckptbench.core.units import human_bytes


def fmt_us(us: float | None) -> str:
    if us is None:
        return "-"
    return f"{us:.0f}µs" if us < 1000 else f"{us / 1000:.1f}ms"


def progress_line(s: fastio.Snapshot) -> str:
    pct = f"{s.bytes / s.bytes_planned:4.0%}" if s.bytes_planned else "   -"
    eta = ""
    if s.bytes_planned and s.bytes and not s.finished and s.elapsed_s > 0:
        eta = f"  ETA {(s.bytes_planned - s.bytes) / (s.bytes / s.elapsed_s):.0f}s"
    return (
        f"{pct} {human_bytes(s.bytes)}/{human_bytes(s.bytes_planned)}  {s.gbps:6.2f} GB/s  "
        f"files {s.files_done + s.files_failed}/{s.files_total}"
        f"{f' ({s.files_failed} failed)' if s.files_failed else ''}  "
        f"workers {s.active_workers}/{s.concurrency}  p50 {fmt_us(s.latency_us(0.5))} "
        f"p99 {fmt_us(s.latency_us(0.99))}  retries {s.retries}{eta}"
    )


class ProgressLine:
    """Rewrites one line of a terminal in place; silent when the stream is not a terminal."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty()
        self.width = 0

    def show(self, text: str) -> None:
        """`text` over what the line showed before (padded, so a shorter line leaves nothing behind)."""
        if not self.live:
            return
        self.stream.write("\r" + text.ljust(self.width))
        self.width = len(text)
        self.stream.flush()

    def __call__(self, snap: fastio.Snapshot) -> None:
        if self.live:
            self.show(progress_line(snap))

    def close(self) -> None:
        if self.live and self.width:
            self.stream.write("\n")
            self.stream.flush()
