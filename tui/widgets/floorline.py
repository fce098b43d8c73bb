"""The restore held against this box's floor, on the dashboard: the chart's floor line and the stage box's floor line,
rendered from the figures ckptbench.cli.ui.restore_floor gives (the UI never measures the floor: that evicts the
checkpoint it is about to restore)."""

from __future__ import annotations

from rich.text import Text

from ckptbench.cli import ui
from ckptbench.core.units import human_pct
from ckptbench.system import binding

NOT_MEASURED = "floor: not measured · `ckptbench floor SOURCE` measures this box's ceilings (cached for a day)"


def chart_label(fields: dict | None) -> tuple[float | None, str]:
    """The floor's rate for the chart's line and its label; (None, "") when the floor is not measured."""
    rate = (fields or {}).get("floor_gbps")
    return (rate, f"floor {rate:.2f} GB/s · bound by {fields['binding']}") if rate else (None, "")


def floor_text(fields: dict | None, *, done: float | None = None, pass_no: int | None = None,
               live: float | None = None) -> Text:
    """The stage box's floor line: the floor's time and what binds it, then the efficiency of a finished run (or of
    the last loop pass, `pass_no`) and the live share of the read in hand."""
    if fields is None:
        return Text()  # not looked up yet (or the source could not be listed: the run says why)
    if fields.get("floor_s") is None:
        return Text(NOT_MEASURED, style="yellow")
    out = Text("floor ", style="bold")
    # the floor's own rate (the chart's line) and the binding resource's, as `run` prints it: one number for both
    # read as two rates of one thing (a new user saw 2.78 here and 3.29 in `run` for one floor)
    out.append(f"{fields['floor_s']:.3f} s" + (f" ({fields['floor_gbps']:.2f} GB/s)" if fields.get("floor_gbps")
                                               else ""))
    out.append(f", bound by {binding.text(fields)}")
    if done is not None:
        out.append(f" · {'pass ' + str(pass_no) + ': ' if pass_no else ''}efficiency ")
        out.append(human_pct(done), style="bold")
        out.append(" (floor / RTO)", style="dim")
    if live is not None:
        out.append(" · read now at ")
        out.append(human_pct(live), style="bold")
        out.append(" of the floor's rate", style="dim")
    return out


class FloorView:
    """The floor of the source and settings in hand, shown on the chart and the stage box: idle, the floor alone;
    after a run, its efficiency; in a loop, the last pass's; while a read runs, its live share.

    The live figure is the read's average rate over the floor's rate, not floor_s over the time so far: it is the
    ratio the chart shows (the bars against the floor line), the average keeps it steady, and it needs no guess at
    the stages still to come; floor_s over elapsed only falls as the clock runs and means something only at the end."""

    def __init__(self, chart, bar):
        self.chart, self.bar = chart, bar
        self.fields: dict | None = None
        self.passed: tuple[int, float | None] | None = None  # the last loop pass: its number and efficiency

    def known(self, fields: dict) -> None:
        self.fields = fields
        self.chart.set_floor(*chart_label(fields))
        self.show()

    def new_run(self) -> None:
        """A run or loop starts: the last one's efficiency no longer stands."""
        self.passed = None
        if self.fields is not None:
            self.fields = dict(self.fields, efficiency=None)
        self.show()

    def pass_done(self, last) -> None:
        """`last`: the loop's last finished pass (a PassResult), or None."""
        if last is not None:
            self.passed = (last.pass_no, ui.efficiency(self.fields, last.rto_s))
        self.show()

    def show(self, read_gbps: float | None = None) -> None:
        """`read_gbps`: the running read's average rate; None when no read runs."""
        pass_no, done = self.passed if self.passed else (None, (self.fields or {}).get("efficiency"))
        self.bar.show_floor(floor_text(self.fields, done=done, pass_no=pass_no,
                                       live=ui.floor_share(self.fields, read_gbps)))
