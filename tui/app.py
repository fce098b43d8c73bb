"""The ckptbench Textual app: owns the source, the run options and the live session; screens render them."""

from __future__ import annotations

from textual.app import App
from textual.binding import Binding

from ckptbench.restore.runner import RunOptions
from tui.screens.checklist import ChecklistScreen
from tui.screens.dashboard import Dashboard
from tui.screens.help import HelpScreen
from tui.screens.history import HistoryScreen
from tui.screens.prompt import TextPrompt
from tui.screens.save import SaveScreen
from tui.screens.sweep import SweepScreen

SAVE_PROFILE = "small"  # what the save screen writes when the source is not a local checkpoint directory


class CkptbenchApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "ckptbench"
    BINDINGS = [
        ("k", "open('checklist')", "Check"),  # as the command's name: the dashboard's footer fits 80 columns
        ("s", "open('sweep')", "Sweep"),
        ("h", "open('history')", "History"),
        Binding("w", "save", "Save", show=False),  # in the help; the dashboard's footer is full
        ("question_mark", "open('help')", "Help"),
        ("q", "quit", "Quit"),
    ]

    def __init__(self, source: str | None, opts: RunOptions | None = None, *, results_path: str = "results.csv",
                 autostart: bool | str = False,  # True: a restore at once; "loop": loop mode at once
                 ranks: dict | None = None):  # a distributed run document: its lanes open at once
        super().__init__()
        self.ranks = ranks
        self.source = source
        self.opts = opts or RunOptions()
        self.results_path = results_path
        self.autostart = autostart
        self.session = None
        self.source_info = None
        self._sampler = None
        if source is not None:
            from ckptbench.system.live import SystemSampler

            self._sampler = SystemSampler(source)
            self.refresh_source()

    def refresh_source(self) -> None:
        self.source_info = self.measure_source()

    def measure_source(self) -> dict | None:
        """Files, bytes, mount and residency of the source (reads /proc and mincore: call it from a worker)."""
        from ckptbench.sources import source_summary

        return source_summary(self.source) if self.source is not None else None

    def on_mount(self) -> None:
        self.sub_title = self.source or "no source"
        self.push_screen(Dashboard())
        if self.ranks is not None:
            from tui.screens.ranks import RanksScreen

            self.push_screen(RanksScreen(self.ranks))

    def new_session(self):
        from ckptbench.restore.session import RestoreSession

        self.session = RestoreSession(self.source, self.opts, results_path=self.results_path)
        return self.session

    def set_concurrency(self, n: int) -> int | None:
        """The concurrency the next run starts with; returns what the running read now reports, or None
        (no read runs, or it cannot change concurrency live)."""
        self.opts = self.opts.but(concurrency=n)
        live = self.session.set_concurrency(n) if self.session is not None else None
        for screen in self.screen_stack:
            if isinstance(screen, Dashboard) and screen.concurrency != n:
                screen.concurrency = n
        return live

    def update_opts(self, **changes) -> None:
        self.opts = self.opts.but(**changes)

    def system_sample(self) -> dict | None:
        return self._sampler.sample() if self._sampler is not None else None

    def action_open(self, name: str) -> None:
        screens = {"checklist": ChecklistScreen, "sweep": SweepScreen, "history": HistoryScreen, "help": HelpScreen}
        if type(self.screen) is screens[name]:
            return
        self.push_screen(screens[name]())

    def save_what(self) -> str:
        """The source when it is a local checkpoint directory (saved as it is), else the small profile."""
        import os

        return self.source if self.source is not None and os.path.isdir(self.source) else SAVE_PROFILE

    def action_save(self) -> None:
        if isinstance(self.screen, (SaveScreen, TextPrompt)):
            return
        what = self.save_what()

        def start(target: str | None) -> None:
            if target:
                self.push_screen(SaveScreen(what, target))

        self.push_screen(TextPrompt(f"Save {what} into (a directory; step-NNNNNN saves go inside):",
                                    "ckptbench-saves"), start)

    async def action_quit(self) -> None:
        if self.session is not None:
            self.session.cancel()
        self.exit()
