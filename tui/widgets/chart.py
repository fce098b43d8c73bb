"""Throughput over the last minute, with a mark where concurrency changed (reads) or a save ended (writes), and a
level line (the floor's rate: what this box can do for this restore)."""

from __future__ import annotations

import math

from rich.text import Text
from textual.widget import Widget

BLOCKS = " ▁▂▃▄▅▆▇█"
WINDOW_S = 60.0
WAITING = "waiting for the read stage…"


class ThroughputChart(Widget):
    DEFAULT_CSS = """
    ThroughputChart { height: 10; }
    """

    def __init__(self, *, unit: str = "GB/s", waiting: str = WAITING, **kw):
        super().__init__(**kw)
        self.unit, self.waiting = unit, waiting
        self.samples: list[tuple[float, float]] = []  # (t, GB/s)
        self.marks: list[tuple[float, str]] = []
        self.peak = 0.0  # the peak the figures beside the chart show: the y-scale never reads below it
        self.level: float | None = None  # a rate drawn across the chart (the floor's), kept when the chart clears
        self.level_label = ""

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

    def set_floor(self, gbps: float | None, label: str) -> None:
        """A horizontal line at `gbps`, labelled at its left end (the window's oldest part); None removes it."""
        if (gbps, label) != (self.level, self.level_label):
            self.level, self.level_label = gbps, label
            self.refresh()

    def clear(self) -> None:
        self.samples, self.marks, self.peak = [], [], 0.0
        self.refresh()

    def render(self) -> Text:
        width = max(10, self.size.width - 8)
        rows = max(2, self.size.height - 1)
        if not self.samples:
            out = Text(self.waiting, style="dim")
            return out.append(f"\n{self.level_label}", style="yellow") if self.level else out
        t_end = self.samples[-1][0]
        t0 = t_end - WINDOW_S
        cols = [0.0] * width
        for t, v in self.samples:
            c = min(width - 1, max(0, int((t - t0) / WINDOW_S * width)))
            cols[c] = max(cols[c], v)
        mark_cols = {min(width - 1, max(0, int((t - t0) / WINDOW_S * width))): label for t, label in self.marks}
        top = max(max(cols), self.peak, self.level or 0.0) or 1.0  # the line stays on the chart
        level_row = max(1, math.ceil(self.level / top * rows - 1e-9)) if self.level else None  # the row it falls in
        out = Text()
        for r in range(rows, 0, -1):
            # the axis runs from 0: the top row is labelled with its top edge, the bottom row with its bottom edge
            # (labelled with its top edge, 2.1 / 9 rows, a flat 2.0-2.1 GB/s run read as a range from 0.23)
            label = (f"{self.level:6.2f} " if r == level_row else f"{top:6.2f} " if r == rows
                     else f"{0:6.2f} " if r == 1 else " " * 7)
            out.append(label, style="yellow" if r == level_row else "dim")
            cells = []
            for v in cols:
                level = v / top * rows
                cells.append(BLOCKS[8] if level >= r else BLOCKS[int((level - (r - 1)) * 8)] if level > r - 1 else " ")
            if r == level_row:
                out.append_text(self._level_row(cells, mark_cols))
                out.append("\n")
                continue
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

    def _level_row(self, cells: list[str], mark_cols: dict) -> Text:
        """The row the level falls in: its label at the left end, a dashed line through the empty cells, bars kept
        (one span per run of a style, as the other rows)."""
        text = f"╌ {self.level_label} " if len(self.level_label) + 3 < len(cells) else ""
        styled = [(text[c], "bold yellow") if c < len(text) else ("╌", "yellow") if cell == " " else
                  (cell, "bold yellow" if c in mark_cols else "green") for c, cell in enumerate(cells)]
        line = Text()
        start = 0
        for c in range(1, len(styled) + 1):
            if c == len(styled) or styled[c][1] != styled[start][1]:
                line.append("".join(ch for ch, _ in styled[start:c]), style=styled[start][1])
                start = c
        return line
