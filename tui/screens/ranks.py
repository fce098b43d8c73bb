"""One distributed restore, a lane per rank: its share read, its read rate over time, its stages, its end; the
straggler (the rank that ended last) marked, failed ranks with their error. `[` and `]` step between repeats.

Every figure comes from the run document `run --distributed` recorded (ckptbench/dist/summary.py)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.content import Content
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.reactive import reactive
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Header, ProgressBar, Static

from ckptbench.distributed.history import read_rates
from ckptbench.core.units import human_bytes
from tui.widgets.chart import BLOCKS
from tui.widgets.stagebar import StageBar


def _s(v) -> str:
    return "-" if v is None else f"{v:.3f} s"


def _stats(st: dict | None, unit: str, fmt: str = ".3f") -> str:
    if not st or st.get("median") is None:
        return "-"
    if st.get("n", 1) > 1:
        return f"median {st['median']:{fmt}}{unit} (min {st['min']:{fmt}}, max {st['max']:{fmt}})"
    return f"{st['median']:{fmt}}{unit}"


def run_lines(doc: dict) -> Content:
    """The run as a whole: where, how many ranks on what, and its figures over the repeats."""
    n, nodes = doc["world_size"], doc["nodes"]
    opts = doc.get("options") or {}
    where = f"{doc['source']} ({doc['format']}) · {n} rank{'s' * (n != 1)} on {nodes} node{'s' * (nodes != 1)}"
    reshard = f" · resharded from {doc['saved_world']} ranks" if doc.get("resharded") else ""
    lines = [f"[b]$where[/] · {doc['backend']} · each rank reads {doc['each_rank']}{reshard} · cache "
             f"{opts.get('cache', '?')}, concurrency {opts.get('concurrency', '?')} per rank"]
    amp = doc.get("amplification")
    lines.append(f"RTO {_stats(doc.get('rto_stats'), ' s')} · aggregate read "
                 f"{_stats(doc.get('aggregate_gbps_stats'), ' GB/s', '.2f')} · skew {_stats(doc.get('skew_stats'), ' s')}"
                 f" · read amplification {'-' if amp is None else f'{amp:.2f}'}")
    dcp = doc.get("dcp_reader")
    if dcp:
        damp = dcp.get("amplification")
        lines.append(f"torch's DCP reader, same shares: {human_bytes(dcp['bytes'])} read, amplification "
                     f"{'-' if damp is None else f'{damp:.2f}'}, {dcp['requests']} requests, "
                     f"{dcp['backward_seeks']} backward seeks")
    if doc["status"] == "unverified":
        lines.append("[yellow]unverified[/]: restored, but no digest was matched against a reference")
    elif doc["status"] != "ok":
        lines.append(f"[red]{doc['status']}[/]: {len(doc.get('problems') or [])} problem(s) over the repeats")
    return Content.from_markup("\n".join(lines), where=where)  # the source is a path: text, not markup


def repeat_line(doc: dict, i: int, largest: int) -> str:
    rep = doc["repeats"][i]
    head = f"[b]repeat {i + 1}/{len(doc['repeats'])}[/]"
    if rep["status"] != "ok":
        return f"{head} · [red]{rep['status']}[/] · {len(rep.get('problems') or [])} rank(s) failed · bars: bytes " \
               f"read against the largest rank's ({human_bytes(largest)})"
    gbps = rep.get("aggregate_gbps")
    return (f"{head} · RTO {_s(rep.get('rto_s'))} · aggregate {'-' if gbps is None else f'{gbps:.2f} GB/s'} · "
            f"skew {_s(rep.get('skew_s'))} · straggler rank {rep.get('slowest_rank')} · bars: bytes read "
            f"against the largest rank's ({human_bytes(largest)})")


def spark_cells(rates: list[tuple[float, float, float]], t_end: float, width: int, peak: float) -> str:
    """The rate on a time axis from 0 to `t_end` in `width` cells, scaled to `peak` (shared by all lanes so their
    heights compare); a cell is the bytes read in it over its duration."""
    if width <= 0 or t_end <= 0 or peak <= 0:
        return " " * max(0, width)
    dt = t_end / width
    cells = [0.0] * width
    for a, b, gbps in rates:
        for c in range(max(0, int(a / dt)), min(width, int(b / dt) + 1)):
            overlap = min(b, (c + 1) * dt) - max(a, c * dt)
            if overlap > 0:
                cells[c] += gbps * overlap / dt
    return "".join(BLOCKS[min(8, max(1, round(v / peak * 8)))] if v > 0 else " " for v in cells)


class RateSpark(Widget):
    """One rank's read rate over the repeat's time axis, on the run's shared scale."""

    DEFAULT_CSS = """
    RateSpark { height: 1; }
    """

    def __init__(self, **kw):
        super().__init__(**kw)
        self.rates: list[tuple[float, float, float]] = []
        self.t_end = self.peak = 0.0

    def show(self, rates: list[tuple[float, float, float]], t_end: float, peak: float) -> None:
        self.rates, self.t_end, self.peak = rates, t_end, peak
        self.refresh()

    def render(self) -> Text:
        if not any(gbps > 0 for _, _, gbps in self.rates):
            return Text("no bytes read" if self.rates else "no read sampled", style="dim")
        return Text(spark_cells(self.rates, self.t_end, self.size.width, self.peak), style="green")


class RankLane(Vertical):
    """rank and host · share read, rate over time, figures · stages · end; under them a failed rank's error."""

    def __init__(self, rank: int, **kw):
        super().__init__(id=f"lane-{rank}", classes="lane", **kw)
        self.rank = rank

    def compose(self) -> ComposeResult:
        with Horizontal(classes="lane-row"):
            yield Static(classes="lane-who")
            with Vertical(classes="lane-read"):
                yield ProgressBar(total=1, show_eta=False, classes="lane-bar")
                yield RateSpark(classes="lane-spark")
                yield Static(classes="lane-figures")
            yield StageBar("this rank", classes="lane-stages")
            yield Static(classes="lane-end-s")
        yield Static(classes="lane-error")

    def show(self, r: dict, *, largest: int, t_end: float, peak: float, straggler: bool) -> None:
        failed = r["status"] != "ok"
        self.set_class(straggler, "-straggler")
        self.set_class(failed, "-failed")
        who = f"rank {r['rank']}\n{r['host']}\nlocal {r['local_rank']}"
        self.query_one(".lane-who", Static).update(Text(who))
        self.query_one(".lane-bar", ProgressBar).update(total=max(1, largest), progress=r["bytes_read"])
        self.query_one(".lane-spark", RateSpark).show(read_rates(r), t_end, peak)
        short = f" of {human_bytes(r['bytes_needed'])}" if r["bytes_read"] < r.get("bytes_needed", 0) else ""
        figures = f"{human_bytes(r['bytes_read'])}{short} · {r.get('read_gbps') or 0:.2f} GB/s · {r['requests']} req"
        self.query_one(".lane-figures", Static).update(Text(figures))
        self.query_one(".lane-stages", StageBar).update_stages(r.get("stages") or {}, None, "")
        mark = "\nstraggler" if straggler else ""
        self.query_one(".lane-end-s", Static).update(Text(f"end {_s(r.get('end_s'))}{mark}"))
        error = self.query_one(".lane-error", Static)
        error.display = failed
        error.update(Text(f"✗ {(r.get('error') or r['status']).splitlines()[0]}" if failed else ""))


class RanksScreen(Screen):
    BINDINGS = [("escape", "app.pop_screen", "Back"), ("left_square_bracket", "step(-1)", "Previous repeat"),
                ("right_square_bracket", "step(1)", "Next repeat")]

    repeat: reactive[int] = reactive(0, init=False)

    def __init__(self, doc: dict, **kw):
        super().__init__(**kw)
        self.doc = doc

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static(run_lines(self.doc), id="ranks-run")
        yield Static(id="ranks-repeat")
        ranks = self.doc["repeats"][0]["ranks"] if self.doc["repeats"] else []
        with VerticalScroll(id="ranks-lanes"):
            for r in ranks:
                yield RankLane(r["rank"])
        yield Footer()

    def on_mount(self) -> None:
        self.sub_title = f"distributed run {self.doc.get('run_id', '?')}"
        self.show_repeat()

    def validate_repeat(self, i: int) -> int:
        return max(0, min(i, len(self.doc["repeats"]) - 1))

    def watch_repeat(self) -> None:
        self.show_repeat()

    def action_step(self, delta: int) -> None:
        self.repeat += delta

    def show_repeat(self) -> None:
        if not self.doc["repeats"]:
            self.query_one("#ranks-repeat", Static).update("no repeats recorded")
            return
        rep = self.doc["repeats"][self.repeat]
        ranks = rep["ranks"]
        largest = max((r["bytes_read"] for r in ranks), default=0)
        t_end = max((r.get("end_s") or 0 for r in ranks), default=0.0)
        peak = max((g for r in ranks for _, _, g in read_rates(r)), default=0.0)
        slowest = rep.get("slowest_rank")
        self.query_one("#ranks-repeat", Static).update(repeat_line(self.doc, self.repeat, largest))
        for r in ranks:
            for lane in self.query(f"#lane-{r['rank']}").results(RankLane):
                lane.show(r, largest=largest, t_end=t_end, peak=peak, straggler=r["rank"] == slowest)
