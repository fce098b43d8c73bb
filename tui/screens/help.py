"""Keys and what the screens show."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.screen import ModalScreen
from textual.widgets import Static

HELP = """[b]ckptbench[/b] — live checkpoint restore

Dashboard
  r  run a restore          x  cancel it (recorded as cancelled)
  + / -  concurrency up / down while it runs (the chart marks each change)
  c  type a concurrency     m  mode (fused/staged)
  o  cache (as-is/cold/hot) e  read mode
  a  hash (manifest's, crc32c, xxh64, md5, sha256, none)
  l  loop mode: pass after pass, so each level shows; l or x stops it
  t  auto-tune on the loop: c=1, 2, 4, … each held steady, up to the knee
Screens
  k  checklist: enter reruns the highlighted item, w exports Markdown
  s  sweep: throughput per concurrency, the knee marked, a applies it
  h  history: runs from results.csv; space marks two, c compares
  w  save: checkpoints to a directory, Dirty/Writeback against the limits
  ?  this help              q  quit

Every figure here is also available headless: ckptbench run/check/sweep
--json, ckptbench sysinfo --json. escape closes this help."""


class HelpScreen(ModalScreen):
    BINDINGS = [("escape", "app.pop_screen", "Close"), ("question_mark", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")
