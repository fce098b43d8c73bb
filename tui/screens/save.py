"""The save screen: checkpoints saved into a target while the write side is watched — write throughput, Dirty and
Writeback against the dirty limits, and each save's blocking, written and durable times.

`ckptbench save` measures; this screen runs it in a worker and renders what it reports (the same numbers as
`ckptbench save --json`)."""

from __future__ import annotations

import collections
import threading

from textual import on, work
from textual.app import ComposeResult
from textual.content import Content
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static
from textual.worker import Worker, WorkerState

from ckptbench.save.report import SaveOptions, SaveTiming
from ckptbench.core.units import human_bytes, human_figure, human_pct
from ckptbench.system.writeback import WritebackSample
from tui.messages import SaveCancelled, SaveFailed, SaveFinished, SaveTimed
from tui.widgets.chart import ThroughputChart
from tui.widgets.dirtychart import DirtyChart

POLL_S = 0.25  # the sampler's own period: drawing faster shows nothing new
NO_DEVICE = "no block device under the target (tmpfs, FUSE, network): its write throughput is not measured"
WAITING = "waiting for the first write sample…"
COLUMNS = ("#", "save", "size", "blocking s", "written s", "durable s", "")


class SaveScreen(Screen):
    BINDINGS = [("escape", "app.pop_screen", "Back"), ("x", "cancel", "Cancel"), ("R", "start", "Save again")]

    saving: reactive[bool] = reactive(False)

    def __init__(self, what: str, target: str, opts: SaveOptions | None = None, *, scale: float = 1.0,
                 autostart: bool = True):
        super().__init__()
        self.what, self.target, self.opts, self.scale = what, target, opts or SaveOptions(), scale
        self.autostart = autostart
        self._pending: collections.deque[WritebackSample] = collections.deque()  # filled by the sampler's thread
        self._cancel = threading.Event()
        self.timings: list[SaveTiming] = []
        self.report: dict | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="save-what")
        yield ThroughputChart(id="save-write", unit="GB/s", waiting=WAITING)
        yield DirtyChart(id="save-dirty")
        yield DataTable(id="save-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="save-summary")
        yield Footer()

    def on_mount(self) -> None:
        o = self.opts
        every = f"every {o.interval_s:g} s" if o.interval_s else "back to back"
        self.query_one("#save-what", Static).update(Content.from_markup(  # paths are text: "ckpt[/x]" raised
            f"saving [b]$what[/b] → [b]$target[/b]  ·  {o.count} saves {every}, keep {o.keep}, "
            f"{o.format}, {o.ranks} rank(s){', async' if o.async_save else ''}{'' if o.fsync else ', no fsync'}",
            what=self.what, target=self.target))
        self.query_one("#save-write", ThroughputChart).border_title = "write throughput (target's block device)"
        self.query_one("#save-dirty", DirtyChart).border_title = "Dirty and Writeback against the dirty limits"
        self.query_one("#save-table", DataTable).add_columns(*COLUMNS)
        self.set_interval(POLL_S, self.drain_samples)
        if self.autostart:
            self.action_start()

    def on_unmount(self) -> None:
        self._cancel.set()  # leaving the screen stops the saves between writes; the partial one is removed

    def watch_saving(self, saving: bool) -> None:
        self.set_class(saving, "-saving")

    def action_start(self) -> None:
        if self.saving:
            self.notify("saves are running: x cancels them", severity="warning")
            return
        self._cancel = threading.Event()
        self._pending.clear()
        self.timings, self.report = [], None
        write = self.query_one("#save-write", ThroughputChart)
        write.waiting = WAITING
        write.clear()
        self.query_one("#save-dirty", DirtyChart).clear()
        self.query_one("#save-table", DataTable).clear()
        self.query_one("#save-summary", Static).update("saving…")
        self.saving = True
        self.run_saves(self._cancel)

    def action_cancel(self) -> None:
        if self.saving:
            self._cancel.set()
            self.query_one("#save-summary", Static).update("cancelling after the write in progress…")

    @work(thread=True, exclusive=True, group="save", exit_on_error=False)
    def run_saves(self, cancel: threading.Event) -> None:
        from ckptbench.core.errors import Cancelled, CkptbenchError, printable, redact
        from ckptbench.save.series import run_save

        try:
            report = run_save(self.what, self.target, self.opts, on_save=lambda t: self.post_message(SaveTimed(t)),
                              on_sample=self._pending.append, cancel=cancel, scale=self.scale)
        except Cancelled as exc:
            self.post_message(SaveCancelled(printable(redact(str(exc)))))
            return
        except (CkptbenchError, OSError) as exc:
            self.post_message(SaveFailed(printable(redact(str(exc)))))
            return
        self.post_message(SaveFinished(report.to_json()))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker.group == "save" and event.state == WorkerState.ERROR:  # a bug: said, not a dead screen
            self.post_message(SaveFailed(f"the save stopped on an internal error: {event.worker.error!r}"))

    def add_sample(self, s: WritebackSample) -> None:
        chart = self.query_one("#save-write", ThroughputChart)
        if s.write_mbps is not None:
            chart.add_sample(s.t, s.write_mbps / 1000)
        elif not chart.samples and chart.waiting != NO_DEVICE:
            chart.waiting = NO_DEVICE
            chart.refresh()
        self.query_one("#save-dirty", DirtyChart).add_sample(s.t, s.dirty_bytes, s.writeback_bytes,
                                                              s.dirty_limit_bytes, s.dirty_background_bytes)

    def drain_samples(self) -> None:
        while self._pending:
            self.add_sample(self._pending.popleft())

    @on(SaveTimed)
    def timed(self, msg: SaveTimed) -> None:
        t = msg.timing
        self.timings.append(t)
        self.query_one("#save-table", DataTable).add_row(
            str(t.index), t.name, human_bytes(t.bytes), f"{t.blocking_s:.3f}", f"{t.written_s:.3f}",
            f"{t.durable_s:.3f}", "overran the interval" if t.overran else "")
        chart = self.query_one("#save-write", ThroughputChart)
        if chart.samples:
            chart.add_mark(chart.samples[-1][0], f"#{t.index}")

    @on(SaveFinished)
    def finished(self, msg: SaveFinished) -> None:
        self.drain_samples()
        self.saving, self.report = False, msg.report
        self.query_one("#save-summary", Static).update(summary(msg.report))

    @on(SaveCancelled)
    def cancelled(self, msg: SaveCancelled) -> None:
        self.drain_samples()
        self.saving = False
        self.query_one("#save-summary", Static).update(Content.from_markup("[b]cancelled[/b]: $why", why=msg.reason))

    @on(SaveFailed)
    def failed(self, msg: SaveFailed) -> None:
        self.saving = False
        self.query_one("#save-summary", Static).update(Content.from_markup("[b red]failed[/]: $error", error=msg.error))
        self.notify(msg.error, severity="error", timeout=10, markup=False)


def summary(report: dict) -> Content:
    """The report's verdict figures in one or two lines."""
    parts = []
    if report.get("sustained_gbps") is not None:
        parts.append(f"sustained durable [b]{report['sustained_gbps']:.2f} GB/s[/b]")
    if report.get("needed_gbps") is not None:
        parts.append(f"needed {report['needed_gbps']:.2f} GB/s for the interval")
    if report.get("shortest_safe_interval_s") is not None:
        parts.append(f"shortest safe interval {human_figure('shortest_safe_interval_s', report['shortest_safe_interval_s'])}")
    if report.get("dirty_peak_fraction") is not None:
        parts.append(f"Dirty peaked at {human_pct(report['dirty_peak_fraction'])} of the limit")
    if report.get("throttled"):
        parts.append("[b yellow]writers were throttled at the dirty limit[/]")
    head = f"{len(report.get('saves', []))} saves of {human_bytes(report.get('bytes', 0))}"
    # the notes name keys and paths from the checkpoint: text, not markup
    return Content.assemble(Content.from_markup(head + (": " + " · ".join(parts) if parts else "")),
                            "".join(f"\n{n}" for n in report.get("notes", [])))
