"""The dashboard's loop mode (`l`) and auto-tune (`t`): loop mode reads the source pass after pass
(ckptbench.restore.loop) so each concurrency level has time to show; auto-tune walks concurrency up on that loop to
the knee (ckptbench.restore.autotune). The Dashboard (dashboard.py) is this screen: its widgets, its settings line
and its live figures are the dashboard's; this part drives the loop and the tuner and shows what they report."""

from __future__ import annotations

import time

from textual import on, work
from textual.content import Content
from textual.screen import Screen
from textual.widgets import ProgressBar

from ckptbench.cli import ui
from ckptbench.core.stages import LIST, READ
from ckptbench.system.live import LiveRates
from tui.messages import LoopEnded, TuneDone, TuneLevel
from tui.widgets.chart import ThroughputChart
from tui.widgets.stagebar import StageBar

LOOP_STAGES = (LIST, READ)  # a loop pass lists and reads: no verify or load


class LoopMode(Screen):
    """Loop mode and auto-tune, the half of the Dashboard that drives them (its subclass holds their keys)."""

    def action_loop(self) -> None:
        if self.loop is not None:
            self.loop.cancel()
        else:
            self.start_loop()

    def start_loop(self) -> bool:
        from ckptbench.restore.loop import ReadLoop

        if self.app.source is None:
            return False
        if self.running:
            self.notify("a restore is running: loop once it ends", severity="warning")
            return False
        self.loop = ReadLoop.for_run(self.app.open_source(), self.app.opts)
        self.begin(LIST, "loop: list and read, no verify or load", LOOP_STAGES, looping=True)
        self.read_loop(self.loop)
        return True

    def action_tune(self) -> None:
        from ckptbench.restore.autotune import AutoTune, attach

        if self.tuning:
            return
        if self.loop is None and not self.start_loop():
            return
        tuner = self.tuner = AutoTune()
        self.tuning = True
        chart = self.query_one("#chart", ThroughputChart)
        chart.border_subtitle = "auto-tune: walking up from c=1"
        # the tuner runs on the loop's thread; it speaks to the screen only through messages
        attach(self.loop, tuner, on_level=lambda lv: self.post_message(TuneLevel(lv.concurrency, lv.label)),
               on_done=lambda lv: self.tuned(tuner, lv))
        self.show_settings()

    def tuned(self, tuner, level) -> None:
        """On the loop's thread: the knee goes on record (where the checklist's advice finds it), then to the
        screen."""
        error = ui.record_knee(self.app.results_path, tuner, self.app.source, self.app.pick)
        if error:
            self.app.call_from_thread(self.notify, error, severity="warning", markup=False)
        self.post_message(TuneDone(level.concurrency, level.gbps))

    def on_unmount(self) -> None:
        if self.loop is not None:
            self.loop.cancel()

    @work(thread=True, exclusive=True, group="loop", exit_on_error=False)
    def read_loop(self, loop) -> None:
        try:
            passes = loop.run()
        except Exception as exc:  # any failure ends the loop on screen, back to idle
            self.post_message(LoopEnded(loop.passes, ui.failure(exc, "loop failed"), self.app.measure_source()))
            return
        # a cold loop left the files out of the page cache: the header's residency is measured again, off the UI
        self.post_message(LoopEnded(passes, source_info=self.app.measure_source()))

    def poll_loop(self) -> None:
        loop = self.loop
        pass_no = loop.pass_no
        self.show_pass_stages(loop)
        self.chart_missed_pass(loop.last)
        snap = loop.snapshot()
        if snap is None:
            self.show_settings()
            return
        last = self.rates.points[-1] if self.rates.points else None
        if pass_no != self._rates_pass or (last is not None and snap.bytes < last[1]):  # a new pass: a new clock
            peak = self.rates.peak
            self.rates = LiveRates()
            self.rates.peak = peak
            self._rates_pass = pass_no
        self.fixed = loop.live_concurrency() is False
        self.show_settings(snap.concurrency)
        self.show_figures(self.take_rates(snap), snap)

    def chart_missed_pass(self, last) -> None:
        """A finished pass that no poll caught reading (a small checkpoint's passes run between two polls, the more
        so on a busy box) goes on the chart as its own measured rate: the chart stood at "waiting for the read
        stage…" through a loop of such passes, and after it."""
        if last is None or last.pass_no == self._charted_pass:
            return
        self._charted_pass = last.pass_no
        if self._sampled_pass != last.pass_no and last.read_gbps > 0:
            self.rates.peak = max(self.rates.peak, last.read_gbps)
            self.query_one("#chart", ThroughputChart).add_sample(time.monotonic(), last.read_gbps, self.rates.peak)

    def show_pass_stages(self, loop) -> None:
        """The stage box in a loop: the last finished pass's stages and RTO; until one has, the pass in hand."""
        bar, last = self.query_one("#stages", StageBar), loop.last
        self.floor.pass_done(last)
        if last is None:
            bar.update_stages(dict(loop.stages), loop.stage, None, LOOP_STAGES)
            return
        bar.update_stages(last.stages, None, f"pass {last.pass_no}: {last.read_gbps:.2f} GB/s, cache {last.cache}",
                          LOOP_STAGES)

    @on(LoopEnded)
    def loop_ended(self, msg: LoopEnded) -> None:
        loop, self.loop = self.loop, None
        self.running = False
        if loop is not None:
            self.show_pass_stages(loop)  # the last finished pass; a cancelled one leaves nothing standing
            last = loop.last
            self.query_one("#progress", ProgressBar).update(total=max(1, last.bytes if last else 1),
                                                            progress=last.bytes if last else 0)
            self.chart_missed_pass(last)  # the last pass ended after the last poll
            chart = self.query_one("#chart", ThroughputChart)
            if not chart.samples:  # stopped before a pass ended or a poll caught one reading: "waiting for the
                # read stage…" stood under a loop that had stopped
                chart.waiting = "no rate sampled: the loop stopped before its first pass was read"
                chart.refresh()
            if last is not None:
                self._set("#figures", f"loop stopped after {msg.passes} passes · last pass {last.pass_no}: "
                                      f"[b]{last.read_gbps:.2f}[/b] GB/s, RTO {last.rto_s:.3f} s, "
                                      f"c={last.concurrency}")
        if self.tuning:
            self.tuning = False
            self.query_one("#chart", ThroughputChart).border_subtitle = "auto-tune stopped before the knee"
            self.notify("auto-tune stopped before it found the knee", severity="warning")
        if msg.error is not None:
            self.notify(msg.error, severity="error", timeout=10, markup=False)
            self._set("#figures", Content.from_markup("[b red]loop failed[/]: $error", error=msg.error))
        else:
            self.notify(f"loop stopped after {msg.passes} passes")
        if msg.source_info is not None:
            self.app.source_info = msg.source_info
            self.show_source()
        self.show_settings()

    @on(TuneLevel)
    def tune_level(self, msg: TuneLevel) -> None:
        chart = self.query_one("#chart", ThroughputChart)
        chart.add_mark(time.monotonic(), msg.label)
        if self.tuner is not None:
            chart.border_subtitle = "auto-tune: " + " · ".join(m.label for m in self.tuner.measured)

    @on(TuneDone)
    def tune_done(self, msg: TuneDone) -> None:
        self.tuning = False
        self._applying_knee = True  # the loop is at the knee already: no second mark
        try:
            self.concurrency = msg.concurrency
        finally:
            self._applying_knee = False
        note = f"knee at c={msg.concurrency} ({msg.gbps:.2f} GB/s)"
        if self.tuner is not None:
            self.query_one("#chart", ThroughputChart).border_subtitle = (
                "auto-tune: " + " · ".join(m.label for m in self.tuner.measured) + f" → {note}")
        self.notify(note)
        self.show_settings()
