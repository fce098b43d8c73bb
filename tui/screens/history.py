"""History: the runs in results.csv; mark two with space and compare them; enter on a distributed run opens its
lanes, one per rank."""

from __future__ import annotations

from rich.markup import escape
from textual.app import ComposeResult
from textual.content import Content
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Header, Static


def time_cell(run: dict) -> str:
    """A run's median time as `ckptbench history` gives it: the RTO, or a save's time until durable, named (the
    column read "RTO s" and a save run's was "-" beside its "-" rate: its time was nowhere on the screen)."""
    from ckptbench.cli.history import FIGURE_WORDS

    if run.get("figure_s") is None:
        return "-"
    if run["figure"] == "rto_s":
        return f"{run['figure_s']:.3f}"
    words = FIGURE_WORDS.get(run["figure"], run["figure"]) + (" after the first save" if run.get("steady") else "")
    return f"{run['figure_s']:.3f} ({words})"


def efficiency_cell(run: dict) -> str:
    """A run's efficiency (records.history's: its floor over its median time) as `ckptbench history` says it, past
    the floor marked as it marks it; over a time other than the RTO column's (the RTO less the model's first step,
    a save's until durable), that time is named, or the two would not divide."""
    from ckptbench.cli.history import FIGURE_WORDS
    from ckptbench.core.units import human_figure, human_pct
    from ckptbench.system.floor import OVER_FLOOR, SHORT_FLOOR, says_little

    eff = run["efficiency"]
    if eff is None:
        return "-"
    out = human_pct(eff) + (" (over the floor: a ceiling measured low)" if eff > OVER_FLOOR else "") + (
        f" ({SHORT_FLOOR})" if says_little(run.get("floor_s")) else "")
    if run.get("held_s") is not None:
        out += f" of {human_figure(run['figure'], run['held_s'])} (the RTO less the model's first step)"
    elif run["figure"] != "rto_s" and run["figure_s"] is not None:
        words = FIGURE_WORDS.get(run["figure"], run["figure"]) + (" after the first save" if run.get("steady") else "")
        out += f" of {words} {human_figure(run['figure'], run['figure_s'])}"
    return out


class HistoryScreen(Screen):
    BINDINGS = [("escape", "app.pop_screen", "Back"), ("space", "mark", "Mark"), ("c", "compare", "Compare")]

    def compose(self) -> ComposeResult:
        yield Header()
        yield DataTable(id="runs", cursor_type="row")
        yield Static(id="comparison")
        yield Footer()

    def on_mount(self) -> None:
        self.marked: list[str] = []
        self.load()

    def load(self) -> None:
        from ckptbench.cli.history import status_words
        from ckptbench.distributed.history import dist_runs
        from ckptbench.core.errors import CkptbenchError, printable, redact
        from ckptbench.records.history import runs, where

        table = self.query_one("#runs", DataTable)
        table.clear(columns=True)
        table.add_columns("", "run", "date", "source", "mode", "cache", "repeats", "median s", "read GB/s",
                          "efficiency", "status")
        path = self.app.results_path
        try:
            self.runs = runs(path)
            self.dist = {d["run_id"]: d for d in dist_runs(path)}
        except CkptbenchError as exc:
            self.runs, self.dist = [], {}
            self.query_one("#comparison", Static).update(Content(printable(redact(str(exc)))))
            return

        def text(value: str) -> str:
            # recorded text is anyone's: an escape in it would retitle or wipe the terminal, and a table cell is
            # markup (a source "bad[/x]" raised inside the screen)
            return escape(printable(value))

        for r in self.runs:
            table.add_row(" ", *map(text, (r["run_id"], r["date"][:19], redact(where(r)), self.mode_of(r),
                                           r["cache"])),
                          str(r["repeats"]), time_cell(r),
                          "-" if r["read_gbps"] is None else f"{r['read_gbps']:.2f}", efficiency_cell(r),
                          text(status_words(r)), key=r["run_id"])
        if not self.runs:
            self.query_one("#comparison", Static).update(
                Content.from_markup("no runs recorded in $path yet: press r on the dashboard", path=path))
        elif self.dist:
            self.query_one("#comparison", Static).update("enter on a dist run: a lane per rank")

    def mode_of(self, run: dict) -> str:
        doc = self.dist.get(run["run_id"])
        if doc is not None:
            return f"dist ×{doc['world_size']} {doc['each_rank']}"
        return run["mode"] + (", no fsync" if run.get("fsync") is False else "")  # as history's line says it

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        from tui.screens.ranks import RanksScreen

        doc = self.dist.get(event.row_key.value)
        if doc is None:
            self.notify("not a distributed run: only runs of run --distributed have a lane per rank")
            return
        self.app.push_screen(RanksScreen(doc))

    def action_mark(self) -> None:
        table = self.query_one("#runs", DataTable)
        if not self.runs:
            return
        run_id = self.runs[table.cursor_row]["run_id"]
        if run_id in self.marked:
            self.marked.remove(run_id)
        else:
            self.marked = (self.marked + [run_id])[-2:]
        for i, r in enumerate(self.runs):
            table.update_cell_at((i, 0), "●" if r["run_id"] in self.marked else " ")

    def action_compare(self) -> None:
        from ckptbench.records.compare import compare
        from ckptbench.records.deltas import change_text, figure_text
        from ckptbench.core.errors import CkptbenchError, printable, redact

        if len(self.marked) != 2:
            self.notify("mark two runs with space first", severity="warning")
            return
        order = [r["run_id"] for r in self.runs]
        base, new = sorted(self.marked, key=order.index)
        try:
            c = compare(self.app.results_path, base, newest=new)
        except CkptbenchError as exc:
            self.notify(printable(redact(str(exc))), severity="error", markup=False)
            return
        # compare hands them back printable; recorded text is still not markup (a watched command's "[/x]" raised)
        lines = [escape(f"{c.newest_id} against {c.baseline_id}")]
        if c.env_diff:
            lines.append("[yellow]differs: " + escape(", ".join(f"{k} {a}→{b}" for k, (a, b) in c.env_diff.items()))
                         + "[/]")
        for f in c.figures:
            flag = (" [red]REGRESSION[/]" if f.regression else " [green]improved[/]" if f.improved
                    else f" ({f.verdict})" if f.verdict else "")
            if f.noise_note:  # a side of one repeat: the threshold alone decided, as `compare` says beside it
                flag += f" ({f.noise_note})"
            change = change_text(f.change_pct, f.figure, f.baseline["median"], f.newest["median"])
            lines.append(f"  {f.figure:16s} {figure_text(f.figure, f.baseline['median']):>10s} → "
                         f"{figure_text(f.figure, f.newest['median']):>10s} {change}{flag}")
        self.query_one("#comparison", Static).update("\n".join(lines))
