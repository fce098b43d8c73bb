"""The RTO split into stages: a proportional bar and seconds and shares, filling in as stages finish; under them, the
floor's line (tui.widgets.floorline)."""

from __future__ import annotations

from rich.text import Text
from textual.widget import Widget

from ckptbench.core.stages import STAGES
from ckptbench.core.units import human_pct
from ckptbench.system import readmode

COLORS = dict(zip(STAGES, ("magenta", "green", "cyan", "blue", "yellow", "red")))


class StageBar(Widget):
    DEFAULT_CSS = """
    StageBar { height: 4; }
    """

    def __init__(self, **kw):
        super().__init__(**kw)
        self.stages: dict[str, float] = {}
        self.active: str | None = None
        self.note = ""
        self.shown: tuple[str, ...] = STAGES
        self.floor = Text()
        self.failed = False

    def update_stages(self, stages: dict[str, float], active: str | None, note: str | None = None,
                      shown: tuple[str, ...] = STAGES, failed: bool | None = None) -> None:
        """`note` follows the RTO (e.g. the one-time warm-up that was kept out of it); None keeps the current one.
        `shown`: the stages this kind of run has (a loop pass: list and read), in STAGES order. `failed`: the run
        stopped with an error: its stages so far are shown, and no RTO (there was no restore to time); None keeps
        the current state (the screen's poll redraws the stages after the run ended)."""
        failed = self.failed if failed is None else failed
        # a run that stopped early (failed verify) has no figure for the stages it never reached
        stages = {k: v for k, v in stages.items() if v is not None}
        note = self.note if note is None else note
        shown = tuple(s for s in STAGES if s in shown)
        if (stages, active, note, shown, failed) != (self.stages, self.active, self.note, self.shown, self.failed):
            self.stages, self.active, self.note, self.shown, self.failed = stages, active, note, shown, failed
            self.refresh()  # only on a change: a redraw costs CPU

    def show_floor(self, line: Text) -> None:
        if line != self.floor:  # a redraw costs CPU
            self.floor = line
            self.refresh()

    def render(self) -> Text:
        width = max(20, self.size.width - 2)
        total = sum(self.stages.values())
        out = Text()
        if total > 0:
            used = 0
            for s in self.shown:
                v = self.stages.get(s)
                if v is None:
                    continue
                n = max(1, round(v / total * width)) if v > 0 else 0
                n = min(n, width - used)
                out.append("█" * n, style=COLORS[s])
                used += n
        out.append("\n")
        for s in self.shown:
            v = self.stages.get(s)
            mark = "▶" if s == self.active and v is None else " "
            if v is None:
                out.append(f"{mark}{s} …  ", style="bold" if mark == "▶" else "dim")
            else:
                share = v / total if total else 0
                out.append(f" {s} ", style=f"bold {COLORS[s]}")
                out.append(f"{v:.3f}s {human_pct(share)}  ")
        if self.failed:
            out.append("\n RTO — ", style="bold")
            out.append(f"(failed after {total:.3f}s: no restore to time)", style="red")
        else:
            out.append(f"\n RTO {total:.3f}s" if total else "\n RTO —")
        if self.note:
            out.append(f"   ({self.note})", style="dim")
        return out.append("\n").append_text(self.floor)


def run_note(doc: dict) -> str:
    """What follows a finished run's RTO: the read path and why, a warm-up kept out of the clock, a structural check."""
    notes = [f"read {', '.join(doc['read']['modes'])}: {readmode.short(doc['read']['why'])}"]
    if doc.get("warmup_s"):
        notes.append(f"one-time warm-up {doc['warmup_s']:.2f} s before the clock, not counted")
    if doc.get("check") == "structural":
        notes.append("check: structural, no model step")
    return "; ".join(notes)
