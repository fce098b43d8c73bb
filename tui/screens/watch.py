"""Watching the user's own restore live: its read rate, CPU, phase and files, then the verdict and the restore
against this box's floor (the figures `ckptbench floor` cached, never measured here: that would evict the job's files
while it reads them), as `ckptbench watch` says them.

The sampling and the verdict are ckptbench.watch.sampler and ckptbench.watch.verdict, run in a worker thread; this screen
only draws what the worker posts."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from rich.markup import escape
from textual import on, work
from textual.app import ComposeResult
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Footer, Header, Static

from ckptbench.core.units import human_bytes, human_pct
from tui.widgets.chart import ThroughputChart


@dataclass
class WatchSample(Message):
    t: float
    gbps: float
    phase: str
    cpu_cores: float
    top_thread: float
    rss_bytes: int
    files_open: int
    gpu_bytes: int | None = None  # the job's GPU memory (nvidia-smi), None where it is not sampled


@dataclass
class WatchDone(Message):
    doc: dict


@dataclass
class WatchFailed(Message):
    error: str


class WatchScreen(Screen):
    BINDINGS = [
        ("v", "verdict", "Stop and judge"),
        ("escape", "app.pop_screen", "Back"),
    ]

    def __init__(self, pid: int, *, proc=None, marks: str | None = None, interval: float = 0.25,
                 source: str | None = None, pick: str | None = None):
        super().__init__()
        self.pid, self.proc, self.marks, self.interval = pid, proc, marks, interval
        self.source = source  # the checkpoint the job restores (--source): its files count whatever their names
        self.pick = pick  # which of the folder's checkpoints (--pick): the one the verdict reads
        self.cancel = threading.Event()
        self.phases: dict[str, float] = {}

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(f"watching process {self.pid}", id="watch-target")
        yield ThroughputChart(id="watch-chart", waiting="waiting for the job to read…")
        yield Static(id="watch-figures")
        yield Static(id="watch-phases")
        yield Static(id="watch-verdict")
        yield Static(id="watch-floor")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#watch-chart", ThroughputChart).border_title = "the job's read rate, last minute"
        self._run()

    def on_unmount(self) -> None:
        self.cancel.set()

    @work(thread=True, exclusive=True)
    def _run(self) -> None:
        from ckptbench.watch import verdict
        from ckptbench.watch import sampler as watch
        from ckptbench.core.errors import CkptbenchError, printable, redact

        def sampled(i, s) -> None:
            self.post_message(WatchSample(i.t1, i.gbps, i.phase, i.cpu_cores, i.top_thread_cores, s.rss_bytes,
                                          sum(1 for f in s.files if watch.is_checkpoint_file(f.path, f.size)),
                                          i.gpu_bytes))

        try:
            report = watch.Watch(self.pid, interval=self.interval, cancel=self.cancel, on_interval=sampled,
                                 proc=self.proc, marks_path=self.marks, source=self.source).run()
            doc = verdict.document(report, verdict.source_files(self.source, self.pick)[0])
        except CkptbenchError as exc:
            self.post_message(WatchFailed(printable(redact(str(exc)))))
            return
        self.post_message(WatchDone(doc))

    @on(WatchSample)
    def sample(self, m: WatchSample) -> None:
        self.query_one("#watch-chart", ThroughputChart).add_sample(m.t, m.gbps)
        self.phases[m.phase] = self.phases.get(m.phase, 0.0) + self.interval
        self.query_one("#watch-figures", Static).update(
            f"[b]{m.phase}[/b]   {m.gbps:.2f} GB/s   CPU {m.cpu_cores:.1f} cores "
            f"(busiest thread {human_pct(m.top_thread)})"
            f"   RSS {human_bytes(m.rss_bytes)}   checkpoint files open {m.files_open}"
            + (f"   GPU {human_bytes(m.gpu_bytes)}" if m.gpu_bytes is not None else ""))
        self.query_one("#watch-phases", Static).update(
            "phases: " + "  ".join(f"{k} {v:.1f} s" for k, v in self.phases.items()))

    @on(WatchDone)
    def done(self, m: WatchDone) -> None:
        d = m.doc
        v = d["verdict"]
        gpu = (f"; GPU memory peak {human_bytes(d['gpu_peak_bytes'])}" if d.get("gpu_peak_bytes") is not None
               else "") + (f" ({escape(d['gpu_note'])})" if d.get("gpu_note") else "")
        least = "at least " if d["count_note"] else ""  # a count known to be short is not given as the rate
        from ckptbench.cli.watch import watch_read  # as the CLI says it: an untimed read read "0.00 GB/s" here

        self.query_one("#watch-target", Static).update(
            f"watched process {d['pid']}: {d['ended']} after {d['wall_s']:.1f} s; {escape(watch_read(d))}{gpu}"
            + (f"\n[dim]a lower bound: {escape(d['count_note'])}[/dim]" if least else ""))
        self.query_one("#watch-verdict", Static).update(
            f"[b]verdict: {escape(v['kind'])}[/b]\n{escape(v['summary'])}\n[b]fix:[/b] {escape(v['fix'])}")
        said = d["floor_sentence"] + (f" ({d['floor_note']})" if d["floor_sentence"] else d["floor_note"] or "unknown")
        self.query_one("#watch-floor", Static).update(f"[b]floor:[/b] {escape(said)}")
        self.notify(f"verdict: {v['kind']}", severity="warning" if v["kind"] != "storage-bound" else "information")

    @on(WatchFailed)
    def failed(self, m: WatchFailed) -> None:
        # the error is text, not markup: a path "ckpt[/bold]" in it raised inside the toast and took the app down
        self.query_one("#watch-verdict", Static).update(Content.from_markup("[b red]watch failed[/]: $error",
                                                                            error=m.error))
        self.notify(m.error, severity="error", timeout=10, markup=False)

    def action_verdict(self) -> None:
        """Stops sampling now; the worker then reads the files seen so far and judges."""
        self.cancel.set()
