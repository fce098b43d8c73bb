"""The live restore dashboard: throughput, progress, latency, workers, the stage bar and the system panel.

It drives a run here; loop mode (`l`) and auto-tune (`t`) are driven by the part it is built on (loopmode.py), which
shares its widgets and state. The screen only displays; the next thing it drives goes into a module of its own."""

from __future__ import annotations

import time

from rich.markup import escape
from textual import events, on, work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.reactive import reactive
from textual.widgets import Footer, Header, ProgressBar, Static
from textual.worker import get_current_worker

from ckptbench.cli import ui
from ckptbench.core import concurrency as conc
from ckptbench.core.progress import fmt_us
from ckptbench.core.stages import STAGES
from ckptbench.core.units import human_bytes, human_pct
from ckptbench.core import options
from ckptbench.restore.efficiency import hash_of
from ckptbench.system.live import LiveRates
from ckptbench.sources import PROGRESS_INTERVAL_S
from tui.messages import FloorKnown, RunCancelled, RunFailed, RunFinished, SourceListed, SourceMeasured
from tui.screens.loopmode import LoopMode
from tui.widgets.chart import WAITING, ThroughputChart
from tui.widgets.floorline import FloorView
from tui.widgets.stagebar import StageBar, digest_words, run_note, verify_line
from tui.widgets.syspanel import SystemPanel

SHORT_ROWS = 30  # a terminal this short gets the compact layout (-short in app.tcss)
POLL_S = PROGRESS_INTERVAL_S  # the live figures are polled as often as the read reports progress
SYSTEM_S = 1.0
SOURCE_S = 2.0  # how often an idle dashboard looks whether its source folder changed (one stat)
# what m, o, e and a cycle through: the run command's own declarations (its default first, the off choice last)
CHOICES = {"mode": options.MODE.values, "cache": options.CACHE.values, "read": options.READ.values,
           "hash": options.RESTORE_HASH.values}


# Keys shown as one group each in the footer (their own words are the keys' tooltips, and the settings line names
# which key changes which setting): one entry each, at 80 columns the footer cut off after "e Rea", with k, s, h, ?
# and q — help and quit — out of sight.
CONCURRENCY_KEYS = Binding.Group("Conc", compact=True)  # the settings line says "concurrency" beside it
SETTING_KEYS = Binding.Group("Settings", compact=True)


class Dashboard(LoopMode):
    BINDINGS = [
        ("r", "run", "Run"),
        ("x", "cancel", "Cancel"),
        Binding("plus,equals_sign", "more", "More", group=CONCURRENCY_KEYS),
        Binding("minus", "less", "Less", group=CONCURRENCY_KEYS),
        Binding("c", "ask_concurrency", "Set concurrency", group=CONCURRENCY_KEYS),
        Binding("m", "cycle('mode')", "Mode", group=SETTING_KEYS),
        Binding("o", "cycle('cache')", "Cache", group=SETTING_KEYS),
        Binding("e", "cycle('read')", "Read", group=SETTING_KEYS),
        Binding("a", "cycle('hash')", "Hash", group=SETTING_KEYS),
        Binding("l", "loop", "Loop", show=False),  # in the help: the footer is full
        Binding("t", "tune", "Auto-tune", show=False),
    ]

    concurrency: reactive[int] = reactive(conc.DEFAULT)
    running: reactive[bool] = reactive(False)
    fixed: reactive[bool] = reactive(False)  # the running read cannot change concurrency live
    tuning: reactive[bool] = reactive(False)  # auto-tune owns the concurrency until it reaches the knee

    def validate_concurrency(self, n: int) -> int:
        return conc.clamp(n)

    def watch_running(self, running: bool) -> None:
        self.set_class(running, "-running")
        if not running:
            self.fixed = False

    def watch_fixed(self, _fixed: bool) -> None:
        self.refresh_bindings()

    def watch_tuning(self, _tuning: bool) -> None:
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple) -> bool | None:
        """+, - and c are shown disabled while a read that cannot change concurrency live runs, or auto-tune runs."""
        if action in ("more", "less", "ask_concurrency") and (self.fixed or self.tuning):
            return None
        return True

    def on_resize(self, event: events.Resize) -> None:
        # under SHORT_ROWS rows (an 80x24 terminal) the title bar, which repeats the source line's path, gives its
        # row to the figures and the progress bar, which were cut off (app.tcss)
        self.set_class(event.size.height < SHORT_ROWS, "-short")

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="source")
        with Horizontal(id="main"):
            with Vertical(id="left"):
                yield ThroughputChart(id="chart")
                yield Static(id="figures")
                yield ProgressBar(id="progress", total=1, show_eta=True)  # no indeterminate animation when idle
            yield SystemPanel(id="system")
        yield StageBar(id="stages")
        yield Static(id="settings")
        # compact, and no palette key (ctrl+p still opens it): at 80 columns the keys cut off before s, h, ? and q
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        app = self.app
        self.concurrency = app.opts.concurrency
        self.rates, self._rates_pass = LiveRates(), 0  # the live figures, and the loop pass they follow
        self._sampled_pass = self._charted_pass = 0  # a loop's last pass a poll charted, and the last pass on the chart
        self.read_picked = ""  # what `--read auto` chose in the last run
        self.loop = None  # the ReadLoop while loop mode runs
        self.tuner = None  # the AutoTune of the last `t`
        self._applying_knee = False
        self._texts: dict[str, str] = {}
        self.listing = None  # the source's Listing once listed: what the verify stage checks digests against
        self.floor = FloorView(self.query_one("#chart", ThroughputChart), self.query_one("#stages", StageBar),
                               app.source)
        self.query_one("#chart", ThroughputChart).border_title = "read throughput, last minute"
        self.set_interval(POLL_S, self.poll)
        self.set_interval(SYSTEM_S, self.poll_system)
        if app.source is not None:
            self.set_interval(SOURCE_S, self.check_source)
        self.show_settings()
        self.show_source()
        self.look_up_floor()
        if app.source is None:
            self.query_one("#figures", Static).update("no source: start with `ckptbench tui DIR`")
            return
        self.list_source()
        if app.autostart == "loop":
            self.action_loop()
        elif app.autostart:
            self.action_run()

    def show_source(self) -> None:
        s = self.app.source_info
        if s is None:
            self.query_one("#source", Static).update("no source")
            return
        # a path is text, not markup: a folder named "[red]" would have been read as a style
        if "problem" in s:  # deleted or emptied since it was counted: not the count it had
            said = {"gone": "folder gone", "empty": "0 files"}.get(s["state"], "cannot be listed now")
            why = "the folder holds none now" if s["state"] == "empty" else \
                s["problem"].removeprefix(f"{s['source']}: ")  # the line starts with the path already
            self.query_one("#source", Static).update(Content.from_markup(
                f"[b]$source[/b]  ·  [b red]{said}[/]: $why", source=s["source"], why=why))
            return
        # the checkpoint of the folder a restore reads, as run says "restored checkpoint-10": the header named the
        # folder alone, and its count was the chosen checkpoint's
        picked = " → [b]$picked[/b]" if s.get("checkpoint") else ""
        self.query_one("#source", Static).update(Content.from_markup(
            f"[b]$source[/b]{picked}  $fs on $mount  ·  {s['files']} file{'' if s['files'] == 1 else 's'}, "
            f"{human_bytes(s['bytes'])}  ·  page-cache residency {human_pct(s['residency'])}",
            source=s["source"], picked=s.get("checkpoint") or "", fs=s["fs_type"], mount=s["mount_point"]))

    def show_settings(self, live: int | None = None) -> None:
        """The settings line; while a read runs, the concurrency is the one the read itself reports."""
        o = self.app.opts
        state = "running" if self.running else "idle"
        if self.loop is not None:
            state = f"looping, pass {self.loop.pass_no}" + (", auto-tuning" if self.tuning else "")
        shown = live if live is not None else self.concurrency
        fixed = " (fixed for this read)" if self.fixed else ""
        picked = o.read == "auto" and self.read_picked not in ("", "auto")
        read = f"auto→{self.read_picked}" if picked else o.read
        key = lambda k: f"[b $accent]{k}[/] "  # the key that changes it, as the footer shows a key: the footer
        # groups these under one word each
        self._set("#settings",
            f"{state} · {key('+-c')}concurrency [b]{shown}[/b]{fixed} · {key('m')}mode [b]{o.mode}[/b] · "
            f"{key('o')}cache [b]{o.cache}[/b] · {key('e')}read [b]{read}[/b] · "
            f"{key('a')}hash [b]{escape(digest_words(o.hash, self.listing))}[/b]")

    def watch_concurrency(self, n: int) -> None:
        if not self.is_mounted:
            return
        live = self.app.set_concurrency(n)
        if self.loop is not None:
            live = self.loop.set_concurrency(n)
        if live is not None and not self._applying_knee:  # only a change the read took is marked on the chart
            self.query_one("#chart", ThroughputChart).add_mark(time.monotonic(), f"c={live}")
        self.show_settings(live)

    def action_more(self) -> None:
        self.concurrency = conc.step_up(self.concurrency)

    def action_less(self) -> None:
        self.concurrency = conc.step_down(self.concurrency)

    def action_ask_concurrency(self) -> None:
        from tui.screens.prompt import NumberPrompt

        def done(value: int | None) -> None:
            if value:
                self.concurrency = value

        self.app.push_screen(NumberPrompt(f"Concurrency ({conc.MIN}..{conc.MAX})", self.concurrency), done)

    def action_cycle(self, what: str) -> None:
        if self.running:
            self.notify("change mode, cache, read or hash between runs", severity="warning")
            return
        choices = CHOICES[what]
        current = getattr(self.app.opts, what)
        at = choices.index(current)
        picked = choices[(at + 1) % len(choices)]
        listing = self.listing
        if what == "hash" and listing is not None and hash_of(picked, listing) == hash_of(current, listing):
            # the manifest's digest named after "the manifest's" (or "none" after "none" where there is no manifest)
            # is the same restore: the first press of a changed nothing the screen or the run shows
            picked = choices[(at + 2) % len(choices)]
        self.app.update_opts(**{what: picked})
        self.look_up_floor()  # the cache condition and the hash change the floor
        self.show_settings()

    def action_run(self) -> None:
        if self.app.source is None or self.running:
            return
        self.begin(None, "")
        self.restore(self.app.new_session())  # made here, so a cancel pressed at once reaches this run

    def action_cancel(self) -> None:
        if self.loop is not None:
            self.loop.cancel()
        elif self.running and self.app.session is not None:
            self.app.session.cancel()

    def begin(self, active: str | None, note: str, shown: tuple[str, ...] = STAGES, looping: bool = False) -> None:
        """A run or a loop starts: a clear chart, stage box and rates (the floor looked up for its settings stands)."""
        chart = self.query_one("#chart", ThroughputChart)
        chart.clear()
        chart.waiting = WAITING  # a loop that stopped unsampled said so in its place
        self.query_one("#stages", StageBar).update_stages({}, active, note, shown, failed=False, unverified="")
        self.rates, self._rates_pass, self.running = LiveRates(), 0, True
        self._sampled_pass = self._charted_pass = 0  # a loop's last pass a poll charted, and the last pass on the chart
        self.floor.new_run(looping)
        self.show_settings()

    @work(thread=True, exclusive=True, group="restore", exit_on_error=False)
    def restore(self, session) -> None:
        from ckptbench.core.errors import Cancelled

        try:
            doc = session.run(repeats=1)
        except Cancelled:
            self.post_message(RunCancelled())
            return
        except Exception as exc:  # any failure ends the run on screen: marked failed, back to idle
            self.post_message(RunFailed(ui.failure(exc, "restore failed"), self.app.measure_source()))
            return
        if not get_current_worker().is_cancelled:
            # the source's residency after the run and the run against the floor are worked out here, off the UI
            # thread, in the run's own worker (one more thread would outlive it in the executor's pool)
            run = session.current
            self.post_message(RunFinished(doc, self.app.measure_source(),
                                          ui.restore_floor(self.app.source, session.opts, self.app.source_info, doc,
                                                          self.app.pick),
                                          run.listing if run is not None else None))

    @work(thread=True, exclusive=True, group="floor", exit_on_error=False)
    def look_up_floor(self) -> None:
        """The floor for the source and settings from the box's cached figures (it lists the source: a worker)."""
        fields = ui.restore_floor(self.app.source, self.app.opts, self.app.source_info, pick=self.app.pick)
        if fields is not None and not get_current_worker().is_cancelled:
            self.post_message(FloorKnown(fields))

    def check_source(self) -> None:
        if not self.running and self.loop is None:  # a run measures the source when it ends
            self.recount_source()

    @work(thread=True, exclusive=True, group="source", exit_on_error=False)
    def recount_source(self) -> None:
        """The source counted again when its folder changed since it was counted (deleted, emptied, refilled): the
        header said the count from the start until a run finished."""
        if not self.app.source_changed():
            return
        info = self.app.measure_source()
        if not get_current_worker().is_cancelled:
            self.post_message(SourceMeasured(info))

    @on(SourceMeasured)
    def source_measured(self, msg: SourceMeasured) -> None:
        self.app.source_info = msg.source_info
        self.show_source()

    @on(FloorKnown)
    def floor_known(self, msg: FloorKnown) -> None:
        self.floor.known(msg.fields)

    @work(thread=True, exclusive=True, group="listing", exit_on_error=False)
    def list_source(self) -> None:
        """The source's listing, for what the settings line says the verify stage checks (listing: a worker)."""
        from ckptbench.core.errors import CkptbenchError

        try:
            listing = self.app.open_source().list()
        except (CkptbenchError, OSError):
            return  # the option alone is said; a run says why the source cannot be listed
        if not get_current_worker().is_cancelled:
            self.post_message(SourceListed(listing))

    @on(SourceListed)
    def source_listed(self, msg: SourceListed) -> None:
        self.listing = msg.listing
        self.show_settings()

    def poll(self) -> None:
        if self.loop is not None:
            self.poll_loop()
            return
        session = self.app.session
        if session is None or not self.running:  # an ended run's stages stand as shown (a loop's since, its passes)
            return
        stages = session.stages()
        self.query_one("#stages", StageBar).update_stages(stages, session.stage)
        snap = session.snapshot()
        if snap is None:
            return
        self.fixed = session.live_concurrency() is False
        self.show_settings(snap.concurrency)
        self.show_figures(self.take_rates(snap), snap)

    def take_rates(self, snap) -> dict:
        """The live figures of `snap`; each new rate goes on the chart with the figures' peak, so the chart's scale
        and the figures line below it read the same peak."""
        before = self.rates.points[-1] if self.rates.points else None
        live = self.rates.update(snap)
        if self.rates.points and self.rates.points[-1] != before:
            self.query_one("#chart", ThroughputChart).add_sample(time.monotonic(), live["now_gbps"], live["peak_gbps"])
            self._sampled_pass = self._rates_pass  # a loop's pass the chart has a live sample of
        return live

    def show_figures(self, live: dict, snap) -> None:
        self._set("#figures",
            f"GB/s now [b]{live['now_gbps']:.2f}[/b]  avg [b]{live['avg_gbps']:.2f}[/b]  "
            f"peak [b]{live['peak_gbps']:.2f}[/b]   ·   files {live['files']}/{live['files_total']}   ·   "
            f"latency p50 {fmt_us(live['latency_p50_us'])}  p99 {fmt_us(live['latency_p99_us'])}\n"
            f"workers {live['active_workers']} active / {live['concurrency']} target, "
            f"busy {human_pct(live['busy_pct'] / 100)}"
            f"   ·   errors {live['errors']}  retries {live['retries']}")
        self.query_one("#progress", ProgressBar).update(total=max(1, snap.bytes_planned), progress=snap.bytes)
        self.floor.show(live["avg_gbps"], live.get("fresh_gbps_per_core"))

    def _set(self, selector: str, text: str | Content) -> None:
        """Updates a Static only when its text changes: every redraw takes CPU from the readers."""
        if self._texts.get(selector) != text:
            self._texts[selector] = text
            self.query_one(selector, Static).update(text)

    def poll_system(self) -> None:
        sample = self.app.system_sample()
        if sample is not None:
            self.query_one("#system", SystemPanel).show(sample)

    @on(RunFinished)
    def finished(self, msg: RunFinished) -> None:
        self.poll()  # the final figures, before `running` goes off and poll stops drawing them
        self.running = False
        doc = msg.doc
        self.read_picked = ", ".join(doc["read"]["modes"])
        if msg.listing is not None:  # what this run's digests were checked against
            self.listing = msg.listing
        unverified = verify_line(doc)  # stays under the RTO: the toast below vanishes
        self.query_one("#stages", StageBar).update_stages(doc["stages"], None, run_note(doc), unverified=unverified,
                                                          rto=doc.get("rto_s"))
        if msg.floor is not None:  # the run's efficiency, against the floor of the cache condition it met
            self.floor.known(msg.floor)
        self.notify(f"restored: RTO {doc['rto_s']:.2f} s, read {doc['read_gbps']:.2f} GB/s, "
                    f"success {human_pct(doc['success_rate'])} ({doc['status']})",
                    severity="warning" if unverified else "information")
        self.show_settings()
        if msg.source_info is not None:
            self.app.source_info = msg.source_info
        self.show_source()

    @on(RunFailed)
    def failed(self, msg: RunFailed) -> None:
        self.running = False
        self.notify(msg.error, severity="error", timeout=10, markup=False)
        self.query_one("#stages", StageBar).update_stages(self.app.session.stages() if self.app.session else {}, None,
                                                          failed=True)
        self.floor.show()
        self._set("#figures", Content.from_markup("[b red]restore failed[/]: $error", error=msg.error))
        self.show_settings()
        if msg.source_info is not None:
            self.app.source_info = msg.source_info
            self.show_source()

    @on(RunCancelled)
    def cancelled(self, _msg: RunCancelled) -> None:
        self.running = False
        if self.app.session is not None:  # the stages it finished before the cancel
            self.query_one("#stages", StageBar).update_stages(self.app.session.stages(), None)
        self.notify("restore cancelled (recorded as cancelled)", severity="warning")
        self.floor.show()
        self.show_settings()
