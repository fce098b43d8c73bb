"""The sweep screen: read throughput against concurrency as bars, the knee marked, apply the recommendation."""

from __future__ import annotations

import threading

from rich.markup import escape
from textual import on, work
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ckptbench.cli.show import sweep_floor_lines
from ckptbench.core.units import human_pct
from ckptbench.system import readmode
from ckptbench.system.floor import SMALL_SWEEP_FIX, SMALL_SWEEP_WHY, says_little
from tui.messages import SweepDone, SweepPoint, WorkFailed

LEVELS = [1, 2, 4, 8, 16, 32]


class SweepScreen(Screen):
    BINDINGS = [("escape", "app.pop_screen", "Back"), ("a", "apply", "Apply knee"), ("R", "start", "Run again")]

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(id="sweep-chart")
        yield Static(id="sweep-summary")
        yield Footer()

    def on_mount(self) -> None:
        self.points: dict[int, float] = {}
        self.result: dict | None = None
        self._cancel = threading.Event()
        self.action_start()

    def on_unmount(self) -> None:
        self._cancel.set()  # leaving the screen stops the sweep: its cold reads would evict what a restore reads

    def action_start(self) -> None:
        if self.app.source is None:
            return
        if any(getattr(s, "running", False) for s in self.app.screen_stack):
            self.query_one("#sweep-summary", Static).update(
                "a restore or loop is running on the dashboard: a sweep's cold reads would evict its files; "
                "R sweeps once it ends")
            return
        self._cancel.set()  # R again: the sweep under way stops before this one reads
        self._cancel = threading.Event()
        self.points, self.result = {}, None
        self.render_chart()
        self.query_one("#sweep-summary", Static).update("sweeping (cold reads, one pass per level)…")
        self.run_sweep(self._cancel)

    @work(thread=True, exclusive=True, group="sweep", exit_on_error=False)
    def run_sweep(self, cancel: threading.Event) -> None:
        from ckptbench.core.errors import Cancelled, CkptbenchError, printable, redact
        from ckptbench.restore.sweep import measured_knee, record_knee, sweep

        try:
            # the dashboard's read settings (auto unless `e` changed it), hash none: what `ckptbench sweep` reads with
            opts = self.app.opts.read_options("none")
            res = sweep(self.app.open_source(), LEVELS, repeats=1, cache="cold", opts=opts, cancel=cancel,
                        progress=lambda lv, g: cancel.is_set() or self.post_message(SweepPoint(lv, g)))
            if self.app.results_path:  # the checklist advises from this knee, as from the CLI's sweep
                record_knee(self.app.results_path, measured_knee(
                    res.source, {lv: s["median"] for lv, s in res.gbps.items()}, "sweep"))
        except Cancelled:
            return  # left, or started again: nothing measured to the end, nothing recorded
        except CkptbenchError as exc:
            self.post_message(WorkFailed(printable(redact(str(exc)))))
            return
        self.post_message(SweepDone(res.to_json()))

    @on(SweepPoint)
    def point(self, msg: SweepPoint) -> None:
        self.points[msg.level] = msg.gbps
        self.render_chart()

    @on(SweepDone)
    def done(self, msg: SweepDone) -> None:
        self.result = msg.result
        self.points = {int(k): v["median"] for k, v in msg.result["gbps"].items()}
        self.render_chart()
        r = msg.result
        cache = f"{r['cache']} cache" + ("" if r["cache_verified"] else ", NOT verified")
        # the sweep's own result, as `ckptbench sweep` says it: how each level read, and against what floor
        lines = [f"knee: concurrency [b]{r['knee']}[/b] (smallest level within {human_pct(r['margin'])} of the best, "
                 f"{r['best']}) — press a to apply",
                 escape(f"read path {r['read']} ({readmode.short(r['read_why'])}) · hash {r['hash']} · {cache}"),
                 *(escape(line) for line in sweep_floor_lines(r))]
        if says_little(r.get("floor_s")):  # as `ckptbench sweep` says it: a knee of fixed costs is no storage's knee
            lines.insert(1, escape(f"{SMALL_SWEEP_WHY}: {SMALL_SWEEP_FIX}"))
        self.query_one("#sweep-summary", Static).update("\n".join(lines))

    @on(WorkFailed)
    def failed(self, msg: WorkFailed) -> None:
        self.notify(msg.error, severity="error", timeout=10, markup=False)

    def render_chart(self) -> None:
        effs = (self.result or {}).get("efficiency_by_level") or {}  # the sweep's, each level's floor / its time
        width = max(10, self.size.width - (46 if effs else 24))  # room for the figures after the bar, on one line
        top = max(self.points.values(), default=0) or 1
        knee = self.result["knee"] if self.result else None
        lines = []
        for lv in LEVELS:
            g = self.points.get(lv)
            if g is None:
                lines.append(f"{lv:5d} │ …")
                continue
            bar = "█" * max(1, int(g / top * width))
            style = "bold yellow" if lv == knee else "green"
            eff = effs.get(lv)
            share = "" if eff is None else f" · {human_pct(eff)} of the floor"
            lines.append(f"{lv:5d} │ [{style}]{bar}[/] {g:.2f} GB/s{share}{'  ← knee' if lv == knee else ''}")
        self.query_one("#sweep-chart", Static).update("concurrency\n" + "\n".join(lines))

    def action_apply(self) -> None:
        if self.result is None:
            self.notify("the sweep is still running", severity="warning")
            return
        self.app.set_concurrency(self.result["knee"])
        self.notify(f"concurrency set to {self.result['knee']}")
