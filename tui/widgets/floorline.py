"""The restore held against this box's floor, on the dashboard: the chart's floor line and the stage box's floor line,
rendered from the figures ckptbench.cli.ui.restore_floor gives (the UI never measures the floor: that evicts the
checkpoint it is about to restore)."""

from __future__ import annotations

from rich.text import Text

from ckptbench.cli import ui
from ckptbench.core.errors import name_source
from ckptbench.core.units import human_pct
from ckptbench.system import binding
from ckptbench.system import floor as fl

NOT_MEASURED = "floor: not measured · `ckptbench floor SOURCE` measures this box's ceilings (cached for a day)"


def chart_label(fields: dict | None) -> tuple[float | None, str]:
    """The floor's rate for the chart's line and its label; (None, "") when the floor is not measured."""
    rate = (fields or {}).get("floor_gbps")
    return (rate, f"floor {rate:.2f} GB/s · bound by {fields['binding']}") if rate else (None, "")


def floor_text(fields: dict | None, *, done: float | None = None, pass_no: int | None = None,
               live: float | None = None, looping: bool = False, source: str | None = None,
               fresh: tuple[float, float] | None = None) -> Text:
    """The stage box's floor line: the floor's time and what binds it, then the efficiency of a finished run (or of
    the last loop pass, `pass_no`, against the read floor), the live share of the read in hand, and `fresh`: the
    fresh-memory rate a core the read meets so far and the floor's, said when the two are apart (fl.met_off)."""
    if fields is None:
        return Text()  # not looked up yet (or the source could not be listed: the run says why)
    if fields.get("floor_s") is None:
        return Text(name_source(NOT_MEASURED, source), style="yellow")  # the command for the checkpoint on screen
    out = Text("read floor " if looping else "floor ", style="bold")
    # the floor's own rate (the chart's line) and the binding resource's, as `run` prints it: one number for both
    # read as two rates of one thing (a new user saw 2.78 here and 3.29 in `run` for one floor)
    out.append(f"{fields['floor_s']:.3f} s" + (f" ({fields['floor_gbps']:.2f} GB/s)" if fields.get("floor_gbps")
                                               else ""))
    out.append(f", bound by {binding.text(fields)}")
    if done is not None:
        out.append(f" · {'pass ' + str(pass_no) + ': ' if pass_no else ''}efficiency ")
        out.append(human_pct(done), style="bold")
        held = None if pass_no else fields.get("held_s")
        over = ("pass" if pass_no else "RTO" if held is None
                else f"the RTO less the model's first step, {held:.3f} s")
        out.append(f" (floor / {over})", style="dim")
        met = fields.get("floor_as_met")
        if not pass_no and fl.met_off(met) and met["efficiency"] is not None:
            # the box gave fresh memory at another rate than the floor's figure while this run ran: as run says it
            out.append(f" · {human_pct(met['efficiency'])} of the box as this run met it (fresh memory "
                       f"{met['fresh_gbps_per_core']:.2f} GB/s a core, the floor's "
                       f"{met['floor_fresh_gbps_per_core']:.2f})", style="dim")
        if fl.says_little(fields["floor_s"]):  # as run's note says it: opening files and threads outweigh the bytes
            out.append(f" · {fl.SHORT_FLOOR}", style="dim")
        if done > fl.OVER_FLOOR:  # as run and read say it: a ceiling measured low, not a restore past the box
            out.append(name_source(" · over the floor: a ceiling measured low; `ckptbench floor SOURCE --remeasure`",
                                   source), style="yellow")
    if live is not None:
        out.append(" · read now at ")
        out.append(human_pct(live), style="bold")
        out.append(" of the floor's rate", style="dim")
    if fresh is not None and fl.met_off({"scale": fresh[0] / fresh[1]}):
        # the box gives fresh memory at another rate than when the floor was measured, now: a read that lags the
        # floor's line while this says slower is waiting on the host, not on the restore
        out.append(f" · fresh memory so far {fresh[0]:.2f} GB/s a core, the floor's {fresh[1]:.2f}", style="dim")
    return out


class FloorView:
    """The floor of the source and settings in hand, shown on the chart and the stage box: idle, the floor alone;
    after a run, its efficiency; in a loop, the last pass's; while a read runs, its live share.

    The live figure is the read's average rate over the floor's rate, not floor_s over the time so far: it is the
    ratio the chart shows (the bars against the floor line), the average keeps it steady, and it needs no guess at
    the stages still to come; floor_s over elapsed only falls as the clock runs and means something only at the end."""

    def __init__(self, chart, bar, source: str | None = None):
        self.chart, self.bar, self.source = chart, bar, source
        self.fields: dict | None = None  # a restore's floor
        self.loop: dict | None = None  # a loop pass's: a read into reused buffers
        self.looping = False  # which of the two the chart and the stage box show
        self.passed: tuple[int, float | None] | None = None  # the last loop pass: its number and efficiency
        self.fresh_ref: float | None = None  # the floor's fresh-memory rate a core (ui.restore_floor, before a run)

    @property
    def shown(self) -> dict | None:
        return self.loop if self.looping else self.fields

    def known(self, fields: dict) -> None:
        """A restore's floor fields (ui.restore_floor); a finished run's carry no loop floor: the last one stands."""
        self.fields, self.loop = fields, fields.get("loop", self.loop)
        self.fresh_ref = fields.get("fresh_per_core", self.fresh_ref)
        self.chart.set_floor(*chart_label(self.shown))
        self.show()

    def new_run(self, looping: bool = False) -> None:
        """A run or loop starts: the last one's efficiency no longer stands, and the floor is the one it is held to."""
        self.passed, self.looping = None, looping
        if self.fields is not None:
            self.fields = dict(self.fields, efficiency=None)
        self.chart.set_floor(*chart_label(self.shown))
        self.show()

    def pass_done(self, last) -> None:
        """`last`: the loop's last finished pass (a PassResult), or None."""
        if last is not None:
            self.passed = (last.pass_no, ui.efficiency(self.loop, last.rto_s))
        self.show()

    def show(self, read_gbps: float | None = None, fresh_gbps_per_core: float | None = None) -> None:
        """`read_gbps`: the running read's average rate; None when no read runs. `fresh_gbps_per_core`: the rate it
        met fresh memory at so far (a loop pass reuses its buffers: none)."""
        pass_no, done = self.passed if self.passed else (None, (self.fields or {}).get("efficiency"))
        fresh = (fresh_gbps_per_core, self.fresh_ref) if fresh_gbps_per_core and self.fresh_ref \
            and not self.looping else None
        self.bar.show_floor(floor_text(self.shown, done=done, pass_no=pass_no, looping=self.looping,
                                       live=ui.floor_share(self.shown, read_gbps), source=self.source, fresh=fresh))
