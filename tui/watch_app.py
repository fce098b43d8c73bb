"""`ckptbench watch --tui`: the watch screen on its own, for a job ckptbench did not start (or started to watch)."""

from __future__ import annotations

from textual.app import App

from tui.screens.watch import WatchScreen


class WatchApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "ckptbench watch"
    BINDINGS = [("q", "quit", "Quit")]

    def __init__(self, pid: int, *, proc=None, marks: str | None = None, interval: float = 0.25,
                 source: str | None = None, pick: str | None = None):
        super().__init__()
        self.screen_args = (pid, proc, marks, interval, source, pick)

    def on_mount(self) -> None:
        pid, proc, marks, interval, source, pick = self.screen_args
        self.push_screen(WatchScreen(pid, proc=proc, marks=marks, interval=interval, source=source, pick=pick))
