"""`ckptbench history`: the runs a results file holds, one line each, oldest first (the dashboard's history screen,
headless)."""

from __future__ import annotations

import os

from ckptbench.cli.show import emit
from ckptbench.core.errors import CkptbenchError, printable, redact, redact_all, shown
from ckptbench.core.units import human_figure, human_pct
from ckptbench.records.history import where
from ckptbench.system.floor import OVER_FLOOR, SHORT_FLOOR, says_little

UNSEEN = "no checkpoint read seen: compare passes over it"
# what a kind's time is called on its line
FIGURE_WORDS = {"rto_s": "RTO", "durable_s": "durable"}


def status_words(r: dict) -> str:
    """How a run ended, as its line says it: a run never ended on record says whether its process still runs."""
    cut = r.get("cut_short")
    if cut:
        unit = "save" if r["kind"] == "save" else "repeat"
        of = "" if cut.get("planned") is None else f" of {cut['planned']}"
        return f"cut short after {cut['finished']}{of} {unit}s (its process is gone, no end on record: killed?)"
    if r["status"] == "running":
        return "running (its process is alive)"
    if r["status"] == "unended":
        return "no end on record (its process, on another host, cannot be checked from here)"
    return shown(redact(r["status"]), 20)


def run_line(r: dict) -> str:
    """One run as the line says it: id, kind, date, source, how it was made, repeats, its time, efficiency, status."""
    how = "/".join(x for x in (r["mode"], r["cache"], "no fsync" if r.get("fsync") is False else "") if x) or "-"
    took = "-" if r["figure_s"] is None else human_figure(r["figure"], r["figure_s"])
    if r.get("unseen"):
        took += f" ({UNSEEN})"
    if r.get("held_s") is not None:  # the efficiency is over this: said beside the RTO, or the two do not divide
        took += f" ({human_figure(r['figure'], r['held_s'])} less the model's first step)"
    eff = "" if r["efficiency"] is None else f"  efficiency {human_pct(r['efficiency'])}" + (
        " (over the floor: a ceiling measured low)" if r["efficiency"] > OVER_FLOOR else "") + (
        f" ({SHORT_FLOOR})" if says_little(r.get("floor_s")) else "")
    words = FIGURE_WORDS.get(r["figure"], r["figure"]) + (" after the first save" if r.get("steady") else "")
    unit = "save" if r["kind"] == "save" else "repeat"  # a save run's are saves, as its cut-short line counts them
    repeats = f"{r['repeats']} {unit}{'' if r['repeats'] == 1 else 's'}" + (
        f" (+{r['cancelled']} cancelled)" if r.get("cancelled") else "")
    # one repeat's time is that repeat's, not a median (a 1-repeat run read "median RTO 9.61 ms")
    median = "median " if r.get("median_of", 2) > 1 else ""
    # recorded text is anyone's: an escape in a source path would retitle or wipe the terminal, a `token=` in any
    # field would be shown
    return (f"{shown(redact(r['run_id']), 40)}  {shown(redact(r['kind']), 10):7s}  {shown(redact(r['date'][:19]), 19)}"
            f"  {printable(redact(where(r)))}  {shown(redact(how), 40)}  {repeats}  "
            f"{median}{words} {took}{eff}  {status_words(r)}")


def cmd_history(args) -> int:
    from ckptbench.records.history import runs
    from ckptbench.records.results import NO_RESULTS

    if not os.path.exists(args.results):
        raise CkptbenchError(f"{printable(args.results)}: {NO_RESULTS}")
    if os.path.isdir(args.results):
        raise CkptbenchError(f"{printable(args.results)}: a directory; name a results file run, save or watch wrote")
    found = runs(args.results)
    if args.json:
        emit(redact_all({"results": args.results, "runs": found}))  # escaped by JSON, but credentials go as in text
        return 0
    if not found:
        print(f"{printable(args.results)}: no runs recorded yet")
    for r in found:
        print(run_line(r))
    return 0
