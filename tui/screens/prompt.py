"""Small modals that ask for one value: a whole number (concurrency) or a line of text (a save target)."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from ckptbench.core import options


class _Prompt(ModalScreen):
    """One labelled input; `parse` turns what was typed into the value dismissed with, or None to ask again."""

    BINDINGS = [("escape", "dismiss_none", "Cancel")]
    INPUT: dict = {}

    def __init__(self, title: str, value):
        super().__init__()
        self.title_text = title
        self.value = value

    def compose(self) -> ComposeResult:
        with Vertical(id="prompt"):
            yield Label(self.title_text, markup=False)  # it names the source, a path: text, not markup
            yield Input(str(self.value), **self.INPUT)

    def parse(self, text: str):
        raise NotImplementedError

    def on_input_submitted(self, event: Input.Submitted) -> None:
        value = self.parse(event.value)
        if value is not None:
            self.dismiss(value)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)


class NumberPrompt(_Prompt):
    INPUT = {"type": "integer", "id": "number"}

    def __init__(self, title: str, value: int):
        super().__init__(title, value)

    def parse(self, text: str) -> int | None:
        try:
            return options.CONCURRENCY.parse(text)  # the flag's own rule: the same numbers, the same words
        except ValueError as exc:
            self.notify(f"concurrency: {exc}", severity="error", markup=False)  # it quotes what was typed
            return None


class TextPrompt(_Prompt):
    INPUT = {"id": "text"}

    def __init__(self, title: str, value: str = ""):
        super().__init__(title, value)

    def parse(self, text: str) -> str | None:
        if not text.strip():
            self.notify("type a value, or escape to cancel", severity="error")
            return None
        return text.strip()
