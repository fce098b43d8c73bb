"""Dirty and Writeback pages over the last minute, on one scale with the kernel's two dirty limits."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ckptbench.core.units import human_bytes

WINDOW_S = 60.0
LABEL_W = 10


class DirtyChart(Widget):
    """Columns stack Writeback (under) and Dirty (over); the background limit (writeback starts) and the dirty
    limit (writers are throttled) are lines across, so a save that climbs toward the limit shows it."""

    DEFAULT_CSS = """
    DirtyChart { height: 10; }
    """

    def __init__(self, **kw):
        super().__init__(**kw)
        self.samples: list[tuple[float, int, int, int, int]] = []  # (t, dirty, writeback, limit, background)

    def add_sample(self, t: float, dirty: int, writeback: int, limit: int, background: int) -> None:
        self.samples.append((t, dirty, writeback, limit, background))
        self.samples = [s for s in self.samples if s[0] >= t - WINDOW_S]
        self.refresh()

    def clear(self) -> None:
        self.samples = []
        self.refresh()

    def render(self) -> Text:
        if not self.samples:
            return Text("waiting for the first sample of /proc/meminfo…", style="dim")
        width = max(10, self.size.width - LABEL_W)
        rows = max(2, self.size.height - 1)
        t0 = self.samples[-1][0] - WINDOW_S
        cols: list[tuple[int, int] | None] = [None] * width
        for t, dirty, wb, _, _ in self.samples:
            c = min(width - 1, max(0, int((t - t0) / WINDOW_S * width)))
            prev = cols[c] or (0, 0)
            cols[c] = (max(prev[0], dirty), max(prev[1], wb))
        _, _, _, limit, background = self.samples[-1]
        top = max([limit] + [d + w for d, w in (x for x in cols if x)]) or 1
        limit_row, bg_row = round(limit / top * rows), round(background / top * rows)
        out = Text()
        for r in range(rows, 0, -1):
            label = human_bytes(top * r / rows) if r in (rows, 1) else ""
            out.append(f"{label:>{LABEL_W - 1}} ", style="dim")
            line = "━" if r == limit_row else "┄" if r == bg_row else " "
            line_style = "red" if r == limit_row else "cyan"
            run, run_style = "", None
            for col in cols:
                wb_level = col[1] / top * rows if col else 0
                all_level = (col[0] + col[1]) / top * rows if col else 0
                ch, style = ("█", "magenta") if wb_level >= r - 0.5 else ("█", "yellow") if all_level >= r - 0.5 \
                    else (line, line_style) if line != " " else (" ", None)
                if style != run_style and run:
                    out.append(run, style=run_style)
                    run = ""
                run, run_style = run + ch, style
            out.append(run, style=run_style)
            out.append("\n")
        out.append(" " * LABEL_W)
        out.append("█ Dirty ", style="yellow")
        out.append("█ Writeback ", style="magenta")
        out.append(f"━ dirty limit {human_bytes(limit)} ", style="red")
        out.append(f"┄ background {human_bytes(background)}", style="cyan")
        return out
