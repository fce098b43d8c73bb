"""Small modals that ask for one value: a whole number (concurrency) or a line of text (a save target)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from ckptbench import concurrency as conc


class NumberPrompt(ModalScreen[int | None]):
    BINDINGS = [("escape", "dismiss_none", "Cancel")]

    def __init__(self, title: str, value: int):
        super().__init__()
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt"):
            yield Label(self.title_text)
            yield Input(str(self.value), type="integer", id="number")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        try:
            n = int(event.value)
        except ValueError:
            self.notify("a whole number, please", severity="error")
            return
        if not conc.MIN <= n <= conc.MAX:
            self.notify(f"concurrency must be {conc.MIN}..{conc.MAX}", severity="error")
            return
        self.dismiss(n)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


class TextPrompt(ModalScreen[str | None]):
    BINDINGS = [("escape", "dismiss_none", "Cancel")]

    def __init__(self, title: str, value: str = ""):
        super().__init__()
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt"):
            yield Label(self.title_text)
            yield Input(self.value, id="text")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if not event.value.strip():
            self.notify("type a value, or escape to cancel", severity="error")
            return
        self.dismiss(event.value.strip())

    def action_dismiss_none(self) -> None:
        self.dismiss(None)
