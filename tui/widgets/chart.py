"""Throughput over the last minute, with a mark where concurrency changed (reads) or a save ended (writes)."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

BLOCKS = " ▁▂▃▄▅▆▇█"
WINDOW_S = 60.0


class ThroughputChart(Widget):
    DEFAULT_CSS = """
    ThroughputChart { height: 10; }
    """

    def __init__(self, *, unit: str = "GB/s", waiting: str = "waiting for the read stage…", **kw):
        super().__init__(**kw)
        self.unit, self.waiting = unit, waiting
        self.samples: list[tuple[float, float]] = []  # (t, GB/s)
        self.marks: list[tuple[float, str]] = []
        self.peak = 0.0  # the peak the figures beside the chart show: the y-scale never reads below it

    def add_sample(self, t: float, gbps: float, peak: float | None = None) -> None:
        """`peak`: the figures' peak, so the scale and the figures line agree (it may predate the window)."""
        if peak is not None:
            self.peak = max(self.peak, peak)
        self.samples.append((t, gbps))
        self.samples = [s for s in self.samples if s[0] >= t - WINDOW_S]
        self.marks = [m for m in self.marks if m[0] >= t - WINDOW_S]
        self.refresh()

    def add_mark(self, t: float, label: str) -> None:
        self.marks.append((t, label))
        self.refresh()

    def clear(self) -> None:
        self.samples, self.marks, self.peak = [], [], 0.0
        self.refresh()

    def render(self) -> Text:
        width = max(10, self.size.width - 8)
        rows = max(2, self.size.height - 1)
        if not self.samples:
            return Text(self.waiting, style="dim")
        t_end = self.samples[-1][0]
        t0 = t_end - WINDOW_S
        cols = [0.0] * width
        for t, v in self.samples:
            c = min(width - 1, max(0, int((t - t0) / WINDOW_S * width)))
            cols[c] = max(cols[c], v)
        mark_cols = {min(width - 1, max(0, int((t - t0) / WINDOW_S * width))): label for t, label in self.marks}
        top = max(max(cols), self.peak) or 1.0
        out = Text()
        for r in range(rows, 0, -1):
            label = f"{top * r / rows:6.2f} " if r in (rows, 1) else " " * 7
            out.append(label, style="dim")
            cells = []
            for v in cols:
                level = v / top * rows
                cells.append(BLOCKS[8] if level >= r else BLOCKS[int((level - (r - 1)) * 8)] if level > r - 1 else " ")
            # one span per run of columns, not one per cell: the chart redraws four times a second
            start = 0
            for c in sorted(mark_cols) + [width]:
                if c > start:
                    out.append("".join(cells[start:c]), style="green")
                if c < width:
                    out.append(cells[c], style="bold yellow")
                start = c + 1
            out.append("\n")
        axis = [" "] * width
        for c, label in mark_cols.items():
            for i, ch in enumerate(("▲" + label)[: width - c]):
                axis[c + i] = ch
        out.append(f"{self.unit:>6} ", style="dim")
        out.append("".join(axis), style="yellow")
        return out
