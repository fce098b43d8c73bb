"""The checklist screen: items appear as they are judged; pick one to see evidence and fix, rerun it, export."""

from __future__ import annotations

import os

from rich.markup import escape
from textual import on, work
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static

from tui.messages import ChecklistDone, ChecklistItem, WorkFailed

MARK = {"ok": "[green]ok[/]", "warn": "[yellow]WARN[/]", "fail": "[red]FAIL[/]", "unknown": "[dim]?[/]"}


class ChecklistScreen(Screen):
    BINDINGS = [("escape", "app.pop_screen", "Back"), ("enter", "rerun", "Run item"),
                ("w", "export", "Export MD"), ("R", "run_all", "Run all")]

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="items", cursor_type="row")
        yield Static(id="detail")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#items", DataTable)
        table.add_columns("verdict", "item")
        self.items: list[dict] = []
        self.doc: dict | None = None
        self.action_run_all()

    def action_run_all(self) -> None:
        if self.app.source is None:
            self.query_one("#detail", Static).update("no source")
            return
        self.items = []
        self.query_one("#items", DataTable).clear()
        self.query_one("#detail", Static).update("gathering facts…")
        self.judge(None, self.files_in_use())

    def action_rerun(self) -> None:
        table = self.query_one("#items", DataTable)
        if self.items and table.cursor_row is not None:
            self.judge(table.cursor_row, self.files_in_use())

    def files_in_use(self) -> bool:
        """A restore or loop runs on the dashboard: the check must not evict the files it reads."""
        return any(getattr(s, "running", False) for s in self.app.screen_stack)

    @work(thread=True, exclusive=True, group="checklist", exit_on_error=False)
    def judge(self, only: int | None, in_use: bool) -> None:
        """`ckptbench check`'s evaluation and report (the same items, fixes naming the source), with the floor from
        this box's cache only: the dashboard never measures it. Posts every item, or only the one rerun."""
        from ckptbench.checklist.facts import gather
        from ckptbench.checklist.rules import evaluate, report
        from ckptbench.core.errors import CkptbenchError, printable, redact

        try:
            facts = gather(self.app.source, concurrency=self.app.opts.concurrency,
                           results=self.app.results_path or None,  # a knee or save on record is advice's truth
                           probe_cache=not in_use, floor=True, measure_floor=False, pick=self.app.pick)
        except CkptbenchError as exc:
            self.post_message(WorkFailed(printable(redact(str(exc)))))
            return
        doc = report(self.app.source, evaluate(facts), facts.layout, facts.checkpoint if self.app.pick else None)
        for i, item in enumerate(doc["items"]):
            if only is None or i == only:
                self.post_message(ChecklistItem(i, item))
        if only is None:
            self.post_message(ChecklistDone(doc))

    @on(ChecklistItem)
    def add_item(self, msg: ChecklistItem) -> None:
        table = self.query_one("#items", DataTable)
        row = (MARK[msg.item["verdict"]], msg.item["title"])
        if msg.index < len(self.items):
            self.items[msg.index] = msg.item
            if self.doc is not None:  # the export and its summary say what the screen shows
                from ckptbench.checklist.rules import report
                from ckptbench.core.verdicts import Verdict

                self.doc = report(self.app.source, [Verdict(**x) for x in self.items], self.doc.get("layout"))
            table.update_cell_at((msg.index, 0), row[0])
            self.show(msg.index)
        else:
            self.items.append(msg.item)
            table.add_row(*row)
            if len(self.items) == 1:
                self.show(0)

    @on(ChecklistDone)
    def done(self, msg: ChecklistDone) -> None:
        self.doc = msg.doc
        s = msg.doc["summary"]
        self.notify(f"checklist: {s['ok']} ok, {s['warn']} warn, {s['fail']} fail, {s['unknown']} unknown")

    @on(WorkFailed)
    def failed(self, msg: WorkFailed) -> None:
        self.notify(msg.error, severity="error", timeout=10, markup=False)

    @on(DataTable.RowSelected)
    def selected(self, event: DataTable.RowSelected) -> None:
        """enter on a row: the table consumes the key as a selection, so rerun from here."""
        if self.items:
            self.judge(event.cursor_row, self.files_in_use())

    @on(DataTable.RowHighlighted)
    def highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.show(event.cursor_row)

    def show(self, i: int) -> None:
        if not 0 <= i < len(self.items):
            return
        from ckptbench.checklist.rules import evidence_text

        it = self.items[i]
        # evidence and fixes quote the checkpoint's own names: a folder 'bad[/x]' is text, not markup
        ev = "\n".join(f"  {escape(str(k))}: {escape(evidence_text(k, v))}" for k, v in it["evidence"].items())
        self.query_one("#detail", Static).update(
            f"[b]{escape(it['title'])}[/b] — {MARK[it['verdict']]}\n[dim]{escape(it['why'])}[/dim]\n\n"
            f"evidence:\n{ev}\n\nfix: {escape(it['fix'])}")

    def action_export(self) -> None:
        from ckptbench.checklist.rules import markdown

        if self.doc is None:
            self.notify("the checklist is still running", severity="warning")
            return
        from ckptbench.core.paths import replace_whole

        path = os.path.abspath("ckptbench-check.md")
        why = replace_whole(path, markdown(self.doc))  # an unwritable folder was a traceback out of the dashboard
        if why:
            self.notify(f"{path}: cannot write it ({why}); start the dashboard in a folder you can write to",
                        severity="error", markup=False)
        else:
            self.notify(f"wrote {path}", markup=False)
