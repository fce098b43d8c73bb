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


def _holds_files(source: str) -> bool:
    """Whether a local folder holds any file: the walk stops at the first one."""
    import os

    return "://" in source or any(names for _, _, names in os.walk(source))


def source_signature(source: str):
    """What tells, for the cost of one stat, that a local source folder changed since it was counted: its inode and
    mtime (a file added or removed at its top changes the mtime; deeper changes wait for the next run); False when
    the path is gone; None for a remote source, which is not watched."""
    import os

    if "://" in source:
        return None
    try:
        st = os.stat(source)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    return st.st_ino, st.st_mtime_ns


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
                 ranks: dict | None = None,  # a distributed run document: its lanes open at once
                 pick: str | None = None):  # which checkpoint of a folder holding several (--pick)
        super().__init__()
        self.ranks = ranks
        self.pick = pick
        self.source = source
        self.opts = opts or RunOptions()
        self.results_path = results_path
        self.autostart = autostart
        self.session = None
        self.source_info = None
        self.source_seen = None  # source_signature when source_info was measured: a change asks for a new one
        self._sampler = None
        if source is not None:
            from ckptbench.system.live import SystemSampler

            self._sampler = SystemSampler(source)
            self.refresh_source()

    def refresh_source(self) -> None:
        self.source_info = self.measure_source()

    def measure_source(self) -> dict | None:
        """Files, bytes, mount and residency of the source (reads /proc and mincore: call it from a worker). A source
        that cannot be listed now is {"source", "state": gone (the path is there no more), empty (no file under it) or
        unlisted, "problem": the listing's one line}: the header says so instead of the count it had."""
        from ckptbench.core.errors import CkptbenchError, printable, redact
        from ckptbench.sources import source_summary

        if self.source is None:
            return None
        self.source_seen = source_signature(self.source)
        try:
            return source_summary(self.source, self.pick)
        except (CkptbenchError, OSError) as exc:
            state = "gone" if self.source_seen is False else "unlisted" if _holds_files(self.source) else "empty"
            return {"source": self.source, "state": state, "problem": printable(redact(str(exc)))}

    def source_changed(self) -> bool:
        """Whether the local source folder changed since measure_source last counted it (one stat)."""
        seen = source_signature(self.source) if self.source is not None else None
        return seen is not None and seen != self.source_seen

    def on_mount(self) -> None:
        self.sub_title = self.source or "no source"
        self.push_screen(Dashboard())
        if self.ranks is not None:
            from tui.screens.ranks import RanksScreen

            self.push_screen(RanksScreen(self.ranks))

    def new_session(self):
        from ckptbench.restore.session import RestoreSession

        self.session = RestoreSession(self.source, self.opts, results_path=self.results_path, pick=self.pick)
        return self.session

    def open_source(self):
        """The source as every screen reads it: the folder, and which of its checkpoints (--pick)."""
        from ckptbench.sources import open_source

        return open_source(self.source, self.pick)

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
