"""The RTO split into stages: a proportional bar and seconds and shares, filling in as stages finish."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ckptbench.core.stages import STAGES

COLORS = dict(zip(STAGES, ("magenta", "green", "cyan", "blue", "yellow", "red")))


class StageBar(Widget):
    DEFAULT_CSS = """
    StageBar { height: 3; }
    """

    def __init__(self, **kw):
        super().__init__(**kw)
        self.stages: dict[str, float] = {}
        self.active: str | None = None
        self.note = ""

    def update_stages(self, stages: dict[str, float], active: str | None, note: str | None = None) -> None:
        """`note` follows the RTO (e.g. the one-time warm-up that was kept out of it); None keeps the current one."""
        # a run that stopped early (failed verify) has no figure for the stages it never reached
        stages = {k: v for k, v in stages.items() if v is not None}
        note = self.note if note is None else note
        if (stages, active, note) != (self.stages, self.active, self.note):  # a redraw costs the readers CPU
            self.stages, self.active, self.note = stages, active, note
            self.refresh()

    def render(self) -> Text:
        width = max(20, self.size.width - 2)
        total = sum(self.stages.values())
        out = Text()
        if total > 0:
            used = 0
            for s in STAGES:
                v = self.stages.get(s)
                if v is None:
                    continue
                n = max(1, round(v / total * width)) if v > 0 else 0
                n = min(n, width - used)
                out.append("█" * n, style=COLORS[s])
                used += n
        out.append("\n")
        for s in STAGES:
            v = self.stages.get(s)
            mark = "▶" if s == self.active and v is None else " "
            if v is None:
                out.append(f"{mark}{s} …  ", style="bold" if mark == "▶" else "dim")
            else:
                share = v / total if total else 0
                out.append(f" {s} ", style=f"bold {COLORS[s]}")
                out.append(f"{v:.3f}s {share:.0%}  ")
        out.append(f"\n RTO {total:.3f}s" if total else "\n RTO —")
        if self.note:
            out.append(f"   ({self.note})", style="dim")
        return out
