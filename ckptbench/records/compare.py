"""Compare: the newest run against a baseline, figure by figure, with the run-to-run noise taken into account."""

from __future__ import annotations

from dataclasses import dataclass

from ckptbench.system.env import KEY_FIELDS
from ckptbench.core.errors import CkptbenchError, printable
from ckptbench.records.results import STAGES, read_documents, read_rows
from ckptbench.core.stats import spread
from ckptbench.core.units import human_pct

# figure -> True when higher is better, by kind of run
FIGURES = {"rto_s": False, **{f"{s}_s": False for s in STAGES}, "read_gbps": True, "aggregate_gbps": True,
           "peak_rss_bytes": False, "cpu_s": False}
SAVE_FIGURES = {"write_gbps": True, "durable_s": False, "written_s": False, "blocking_s": False}
# each repeat's efficiency against its run's floor (floor_s from the run document): the time a repeat took per
# kind, and a floor that moved more than this is said, as the box changed under the runs
EFFICIENCY_OF = {"restore": "rto_s", "dist": "rto_s", "save": "durable_s"}
FLOOR_MOVED = 0.10
SHARES = {"efficiency"}  # a fraction in the documents, a percent wherever a person reads it

# runs that differ in these measured different things
SETTINGS = ("source", "format", "mode", "cache", "concurrency", "read", "hash", "block_size", "device")
SAVE_SETTINGS = ("source", "format", "mode", "target", "ranks", "stagger_s")


@dataclass(frozen=True)
class FigureDelta:
    figure: str
    baseline: dict
    newest: dict
    change_pct: float | None
    regression: bool
    beyond_noise: bool  # the two runs' repeats do not overlap, whichever way the change went
    improved: bool = False
    noise_known: bool = True  # each side had two or more repeats: one repeat has no range to be within

    @property
    def verdict(self) -> str:
        """How the text tells it: REGRESSION, improved, within noise, or that one repeat gives no noise to judge."""
        if self.regression:
            return "REGRESSION"
        if self.improved:
            return "improved"
        if not self.noise_known:
            return "one repeat: noise unknown"
        return "" if self.beyond_noise else "within noise"


@dataclass(frozen=True)
class Comparison:
    baseline_id: str
    newest_id: str
    figures: list[FigureDelta]
    env_diff: dict[str, tuple]
    threshold_pct: float

    @property
    def regressed(self) -> list[FigureDelta]:
        return [f for f in self.figures if f.regression]


# restores that ran to the end: "unverified" ones (no reference digest to compare with) are timed all the same
COMPLETED = ("ok", "unverified")


def figure_text(figure: str, value: float) -> str:
    """A compared figure's median as the text shows it: a share as `run` prints it ("82 %"), else 4 digits."""
    return human_pct(value) if figure in SHARES else f"{value:.4g}"


def change_text(change_pct: float | None) -> str:
    return "" if change_pct is None else human_pct(change_pct / 100, signed=True)


def _runs(rows: list[dict]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for r in rows:
        # a watch that saw no checkpoint byte read (a job that slept, one attached too late) measured nothing: as
        # a baseline it made a real watch a +32174 % RSS regression
        if r["status"] in COMPLETED and not (r.get("kind") == "watch" and not r.get("bytes")):
            runs.setdefault(r["run_id"], []).append(r)
    return runs


def _steady(rows: list[dict]) -> list[dict]:
    """A save run's rows after its first save (cold files and page cache), as its sustained figures are taken."""
    if rows[0]["kind"] == "save" and len(rows) > 1:
        return [r for r in rows if r["repeat"] != 1] or rows
    return rows


def _shown(value):
    """A recorded value as it may be shown: results fields are text anyone could have written (a terminal escape in a
    source path or a kernel string would retitle or wipe the terminal)."""
    return printable(value) if isinstance(value, str) else value


def _known(ids: list[str]) -> str:
    return ", ".join(printable(i) for i in ids[-5:])


def _delta(fig: str, base: list, new: list, higher_better: bool, threshold_pct: float) -> FigureDelta | None:
    b, n = spread(base), spread(new)
    if b["median"] is None or n["median"] is None:
        return None
    change = (n["median"] - b["median"]) / b["median"] * 100 if b["median"] else None
    worse = change is not None and (change < -threshold_pct if higher_better else change > threshold_pct)
    better = change is not None and (change > threshold_pct if higher_better else change < -threshold_pct)
    # beyond noise: every repeat of one run is past every repeat of the other (an improvement read "within noise"
    # when only the worse direction was tested); with one repeat a side the threshold alone decides
    beyond = n["max"] < b["min"] or n["min"] > b["max"]
    known = b.get("n", 2) > 1 and n.get("n", 2) > 1
    return FigureDelta(fig, b, n, change, bool(worse and beyond), beyond, bool(better and beyond), known)


def _floors(path: str) -> dict[str, dict]:
    """run_id -> its run document's floor, for the runs held against one (floor_s a positive number)."""
    out = {}
    for d in read_documents(path, "run"):
        f = d.get("floor_s")
        if isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 and isinstance(d.get("run_id"), str):
            out[d["run_id"]] = {"floor_s": float(f)}
    return out


def _efficiency(floor: dict, measured) -> float | None:
    return floor["floor_s"] / measured if isinstance(measured, (int, float)) and measured > 0 else None


def compare(path: str, baseline: str | None = None, threshold_pct: float = 5.0, newest: str | None = None) -> Comparison:
    if threshold_pct < 0:
        raise CkptbenchError(f"--threshold must be ≥ 0, got {threshold_pct}")
    runs = _runs(read_rows(path))
    ids = list(runs)
    if len(ids) < 2:
        raise CkptbenchError(f"{path}: {len(ids)} successful run(s) recorded; compare needs two (run the benchmark again)")
    if newest is None:
        newest = ids[-1]
    elif newest not in runs:
        raise CkptbenchError(f"{path}: no successful run {printable(newest)!r}; known runs: {_known(ids)}")
    kind = runs[newest][0]["kind"]
    if baseline is None:
        same = [i for i in ids[:ids.index(newest)] if runs[i][0]["kind"] == kind]
        if not same:
            raise CkptbenchError(f"{path}: the newest run {printable(newest)} is a {kind} and no earlier {kind} run is "
                                 "recorded; compare needs two of one kind")
        # the last one run the same way (source, cache, read path...): a hot run against the as-is run before it
        # read as a 135 % gain; another one only when none was, and the settings that differ are listed
        keys = SAVE_SETTINGS if kind == "save" else SETTINGS
        alike = [i for i in same if all(runs[i][-1].get(k) == runs[newest][-1].get(k) for k in keys)]
        baseline = (alike or same)[-1]
    elif baseline not in runs:
        raise CkptbenchError(f"{path}: no successful run {printable(baseline)!r}; known runs: {_known(ids)}")
    if baseline == newest:
        raise CkptbenchError(f"--baseline {printable(baseline)} is the newest run; pick an earlier one")
    if runs[baseline][0]["kind"] != kind:
        raise CkptbenchError(f"--baseline {printable(baseline)} is a {runs[baseline][0]['kind']} run and "
                             f"{printable(newest)} a {kind} run; "
                             "compare runs of one kind")
    base_rows, new_rows = _steady(runs[baseline]), _steady(runs[newest])
    figures = []
    for fig, higher_better in (SAVE_FIGURES if kind == "save" else FIGURES).items():
        figures.append(_delta(fig, [r[fig] for r in base_rows], [r[fig] for r in new_rows], higher_better,
                              threshold_pct))
    figures = [f for f in figures if f is not None]
    floors = _floors(path)
    if kind in EFFICIENCY_OF and baseline in floors and newest in floors:
        figures.append(_delta("efficiency", [_efficiency(floors[baseline], r[EFFICIENCY_OF[kind]]) for r in base_rows],
                              [_efficiency(floors[newest], r[EFFICIENCY_OF[kind]]) for r in new_rows], True,
                              threshold_pct))
    env_b, env_n = base_rows[-1]["env"], new_rows[-1]["env"]
    diff = {k: (env_b.get(k), env_n.get(k)) for k in KEY_FIELDS if env_b.get(k) != env_n.get(k)}
    for k in SAVE_SETTINGS if kind == "save" else SETTINGS:
        if base_rows[-1][k] != new_rows[-1][k]:
            diff[k] = (base_rows[-1][k], new_rows[-1][k])
    fb, fn = (floors.get(baseline) or {}).get("floor_s"), (floors.get(newest) or {}).get("floor_s")
    if fb and fn and abs(fn - fb) / fb > FLOOR_MOVED:  # the box itself did more or less: the efficiency says how much
        diff["floor_s"] = (round(fb, 4), round(fn, 4))  # of a change is the restore's
    shown = {printable(k): (_shown(a), _shown(b)) for k, (a, b) in diff.items()}
    return Comparison(printable(baseline), printable(newest), figures, shown, threshold_pct)
