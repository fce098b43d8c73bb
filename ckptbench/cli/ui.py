"""The one door from the command line to the UI (tui/): imported lazily, so headless commands never load Textual."""

from __future__ import annotations


def run_app(name: str, *args, **kwargs) -> int:
    """The one door from the domain to the UI: handlers ask for the dashboard ("dashboard") or the watch app
    ("watch") here, so that only this composition root imports `tui`, lazily (headless commands never load
    Textual)."""
    if name == "watch":
        from tui.watch_app import WatchApp as App
    else:
        from tui.app import CkptbenchApp as App
    App(*args, **kwargs).run()
    return 0
