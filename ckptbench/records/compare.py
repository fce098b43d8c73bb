"""Compare: the newest run against a baseline, figure by figure, with the run-to-run noise taken into account."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ckptbench.system.env import KEY_FIELDS
from ckptbench.system.floor import says_little
from ckptbench.core.errors import CkptbenchError, redact, shown
from ckptbench.core.stages import STAGES
from ckptbench.records.results import jsonl_path, read_documents, read_rows
from ckptbench.records.schema import KINDS, in_range
from ckptbench.core.stats import spread, sustained_rate
from ckptbench.records.recorder import life, unended
from ckptbench.records.deltas import MIN_RTO_SHARE, MIN_SECONDS, FigureDelta, delta, setting_value, shown_value

# figure -> True when higher is better, by kind of run
FIGURES = {"rto_s": False, **{f"{s}_s": False for s in STAGES}, "read_gbps": True, "aggregate_gbps": True,
           "peak_rss_bytes": False, "cpu_s": False}
SAVE_FIGURES = {"write_gbps": True, "durable_s": False, "written_s": False, "blocking_s": False}
# each repeat's efficiency against its run's floor (floor_s from the run document): the time a repeat took per
# kind, and a floor that moved more than this is said, as the box changed under the runs; a watch's is its reading
# window (its row's rto_s), the time its document's efficiency is over ("your loader runs at 24 % of this box's floor"
# was said and recorded, and history and compare showed the watch with none)
EFFICIENCY_OF = {"restore": "rto_s", "dist": "rto_s", "save": "durable_s", "watch": "rto_s"}
FLOOR_MOVED = 0.10

# runs that differ in these measured different things
SETTINGS = ("source", "format", "mode", "cache", "concurrency", "read", "hash", "block_size", "device")
SAVE_SETTINGS = ("source", "format", "mode", "target", "ranks", "stagger_s")
# a save's settings its run document keeps, not its rows: a --no-fsync save's "durable" ends at the rename, and one
# held against a durable save read as a +230 % write_gbps improvement, unremarked
SAVE_OPTIONS = ("fsync",)
# what a run measured: a default baseline shares these (its other settings may differ, and are listed)
MEASURED = ("source", "format", "cache")
# what gives a run of each kind the samples a noise estimate needs (a save's first is left out of its figures)
MORE_SAMPLES = {"restore": "--repeat 3 or more on both runs tells a change from noise",
                "dist": "--repeat 3 or more on both runs tells a change from noise",
                "save": "--count 4 or more on both runs (their first save is left out) tells a change from noise",
                "watch": "a watch records one restore, so its noise stays unknown; `ckptbench run SOURCE --repeat 3` "
                         "measures it"}


@dataclass(frozen=True)
class Comparison:
    baseline_id: str
    newest_id: str
    figures: list[FigureDelta]
    env_diff: dict[str, tuple]
    threshold_pct: float
    kind: str
    notes: tuple[str, ...] = ()  # what else a reader must know of the two runs (one cut short, or still running)

    @property
    def regressed(self) -> list[FigureDelta]:
        return [f for f in self.figures if f.regression]


# restores that ran to the end: "unverified" ones (no reference digest to compare with) are timed all the same
COMPLETED = ("ok", "unverified")


def saw_no_read(row: dict) -> bool:
    """A watch's row of a job seen to read no checkpoint byte (one that slept, one attached too late): it timed no
    restore, so it is compared with nothing (as a baseline it made a real watch a +32174 % RSS regression) and
    history gives it no time."""
    return row.get("kind") == "watch" and not row.get("bytes")


def rates_known(rows: list[dict], docs: dict[str, dict]) -> list[dict]:
    """The rows with no read rate where it was a lower bound, and no time where none was taken, as watch records
    them now: a watch recorded before 4c33896 kept "read at least" as its rate in the row, and its document's
    count_note says so (compare called two lower bounds of one loader, of the same run's old row and a new cold
    watch, a change); one recorded before 0afe3a3 of bytes no window timed (its document's window_note, or no
    reading span) kept 0 s, or a sample's length, as its RTO, which history showed as "median RTO 0.000 s"."""
    out = []
    for r in rows:
        doc = docs.get(r["run_id"]) if r.get("kind") == "watch" else None
        if isinstance(doc, dict) and r.get("bytes") and (doc.get("window_note") or not doc.get("io_span_s")):
            r = r | {"read_gbps": None, "rto_s": None, "read_s": None}
        elif isinstance(doc, dict) and doc.get("count_note"):
            r = r | {"read_gbps": None}
        out.append(r)
    return out


def _runs(path: str, rows: list[dict]) -> dict[str, list[dict]]:
    runs: dict[str, list[dict]] = {}
    for r in rows:
        # a kind ckptbench does not write is no run of ours (rows with another were compared as restores)
        if r["status"] in COMPLETED and r.get("kind") in KINDS and not saw_no_read(r):
            run = runs.setdefault(r["run_id"], [])
            if run and run[0]["kind"] != r["kind"]:  # its figures would be compared as the first row's kind
                raise CkptbenchError(f"{path}: run {shown(r['run_id'], 40)!r} is recorded as {run[0]['kind']} and "
                                     f"{r['kind']} rows (a run id used again); repair or move the file")
            run.append(r)
    return runs


def _unseen(rows: list[dict], runs: dict[str, list[dict]]) -> set[str]:
    """The watches _runs left out for seeing no checkpoint read (ended well, of our kind, not compared)."""
    return {r["run_id"] for r in rows if saw_no_read(r) and r["status"] in COMPLETED and r["run_id"] not in runs}


def steady(rows: list[dict]) -> list[dict]:
    """A save run's rows after its first save (cold files and page cache), as its sustained figures are taken."""
    if rows[0]["kind"] == "save" and len(rows) > 1:
        return [r for r in rows if r["repeat"] != 1] or rows
    return rows


def _known(path: str, ids: list[str]) -> str:
    """The runs one may name: the newest twelve, and how many more (a valid id left off read as not there)."""
    import shlex

    named = ", ".join(shown(i) for i in ids[-12:])
    return named + (f" (and {len(ids) - 12} earlier: `ckptbench history {shlex.quote(shown(path, 200))}` lists them "
                    "all)" if len(ids) > 12 else "")


def run_documents(path: str, every: list[dict] | None = None) -> dict[str, dict]:
    """run_id -> its run document (results.csv.jsonl), for the runs that have one; from `every` document of the file
    where the caller has read them already."""
    docs = read_documents(path, "run") if every is None else [d for d in every if d.get("record", "run") == "run"]
    return {d["run_id"]: d for d in docs if isinstance(d.get("run_id"), str)}


def _floors(docs: dict[str, dict]) -> dict[str, dict]:
    """run_id -> its run document's floor, for the runs held against one (floor_s a positive number)
    that gave an efficiency: a run whose floor counts memory and CPU only says "no efficiency is given", and compare
    gave one."""
    out = {}
    for run_id, d in docs.items():
        f = d.get("floor_s")
        # in range: JSON takes Infinity, and an infinite floor printed an efficiency of inf % and a change of nan %;
        # a floor of 1e308 s over any time overflowed to one
        if measured("floor_s", f) and efficiency_of(d) is not None:
            out[run_id] = {"floor_s": float(f)}
    return out


def measured(figure: str, value):
    """`value` where a run can have measured it as `figure` (schema.in_range), else None: compare refuses such a
    figure, and history showed it (a check_s of -1e300 held a run to its floor for 1e300 s)."""
    return value if in_range(figure, value) else None


def efficiency_of(doc: dict | None) -> float | None:
    """A run document's efficiency (its floor over its median time), where it recorded one a run can have had: above
    0 and in range (1e308 read inf %, -5 a negative percent)."""
    e = measured("efficiency", (doc or {}).get("efficiency"))
    return e if e else None


def held_s(doc: dict, rows: list[dict], took: str) -> list:
    """The time each repeat was held to its floor for, as restore/efficiency.of_repeats holds it: its RTO (a save's
    until durable), less the check stage where the check ran the model (its compute, which no ceiling measures). A
    time no run can have taken is None."""
    whole = [measured(took, r.get(took)) for r in rows]
    if doc.get("check") != "model step" or not all(measured("check_s", r.get("check_s")) is not None for r in rows):
        return whole
    return [None if t is None else measured(took, t - r["check_s"]) for t, r in zip(whole, rows)]


def _command(docs: dict[str, dict], run_id: str) -> str | None:
    """The command line a watch watched, as its run document recorded it (redacted); None where none did."""
    command = docs.get(run_id, {}).get("command")
    return command if isinstance(command, str) else None


def _efficiency(floor: dict, took) -> float | None:
    """The floor over the time taken, where it is a share a run can have had (over a time of 5e-324 s: inf)."""
    return measured("efficiency", floor["floor_s"] / took) if measured("held_s", took) else None


def save_option(doc: dict | None, key: str):
    """A save's option as its run document keeps it (SAVE_OPTIONS: its rows do not); None where not on record. The
    one reader of them for compare, history and plan."""
    options = (doc or {}).get("options")
    value = options.get(key) if isinstance(options, dict) else None
    return value if isinstance(value, bool) else None


def _settings(runs: dict[str, list[dict]], docs: dict[str, dict], run_id: str) -> dict:
    """The settings a run was made with: its last row's, and for a save its document's options (SAVE_OPTIONS)."""
    row = runs[run_id][-1]
    if row["kind"] != "save":
        return {k: row.get(k) for k in SETTINGS}
    return {k: row.get(k) for k in SAVE_SETTINGS} | {k: save_option(docs.get(run_id), k) for k in SAVE_OPTIONS}


def _newest(path: str, runs: dict[str, list[dict]], newest: str | None, kind: str | None) -> str:
    """The run compared: `newest` by its id, else the newest of `kind`, else the newest of the file."""
    ids = list(runs)
    if newest is not None:
        if newest not in runs:
            raise CkptbenchError(f"{path}: no successful run {shown(newest)!r} to compare (--newest); known runs: "
                                 f"{_known(path, ids)}")
        return newest
    if kind is None:
        return ids[-1]
    if kind not in KINDS:
        raise CkptbenchError(f"--kind {shown(kind)}: one of {', '.join(KINDS)}")
    of_kind = [i for i in ids if runs[i][0]["kind"] == kind]
    if not of_kind:
        held = ", ".join(sorted({runs[i][0]["kind"] for i in ids}))
        raise CkptbenchError(f"{path}: no successful {shown(kind)} run recorded; it holds {held} runs: name one of "
                             "those with --kind")
    return of_kind[-1]


def _default_baseline(path: str, runs: dict[str, list[dict]], newest: str, docs: dict[str, dict]) -> str:
    ids = list(runs)
    kind = runs[newest][0]["kind"]
    same = [i for i in ids[:ids.index(newest)] if runs[i][0]["kind"] == kind]
    if not same:
        raise CkptbenchError(f"{path}: the run compared, {shown(newest)}, is a {kind} and no earlier {kind} run is "
                             "recorded; compare needs two of one kind")
    if kind == "watch":
        # a watch's settings do not name its loader (only the folder it read): watches of two loaders of one
        # checkpoint were held against each other
        command = _command(docs, newest)
        if command is None:
            raise CkptbenchError(f"{jsonl_path(path)}: no run document of watch {shown(newest)} records its "
                                 "command; name a baseline with --baseline RUN")
        alike = [i for i in same if _command(docs, i) == command]
        if not alike:
            raise CkptbenchError(f"{path}: no watch before {shown(newest)} watched the same command; watch that "
                                 "command again, or name a baseline with --baseline RUN")
        return alike[-1]
    # the last one run the same way (source, cache, read path...): a hot run against the as-is run before it
    # read as a 135 % gain; else the last of the same checkpoint measured the same way, its other settings
    # listed (a change of concurrency is what a user compares); never another checkpoint unasked (a restore of a
    # torch checkpoint against a safetensors one was a +11479 % REGRESSION and failed the build)
    made = _settings(runs, docs, newest)
    alike = [i for i in same if _settings(runs, docs, i) == made]
    what = [i for i in same if all(runs[i][-1].get(k) == runs[newest][-1].get(k) for k in MEASURED)]
    if not alike and not what:
        # "(format, cache as 1fac11ead110)" named neither the values looked for nor what the earlier runs had
        row = runs[newest][-1]
        wanted = " and ".join(f"{k} {_said(row.get(k))}" for k in MEASURED[1:])
        nearest = "; ".join(f"{shown(i)} had " + ", ".join(f"{k} {_said(runs[i][-1].get(k))}" for k in MEASURED
                                                          if runs[i][-1].get(k) != row.get(k)) for i in same[-3:])
        raise CkptbenchError(f"{path}: no earlier {kind} run of {shown(row.get('source'))} with {wanted}, as "
                             f"{shown(newest)} was, to be its default baseline (the earlier ones: {nearest}); name a "
                             "baseline with --baseline RUN")
    return (alike or what)[-1]


def default_baseline(path: str, newest: str) -> str | None:
    """The run `compare PATH` holds `newest` against by default; None where it has none (no earlier run made the same
    way) or `newest` is not one it compares (a failed run). A run's last line offered that command after a first
    run, where it could only fail."""
    try:
        runs = _runs(path, read_rows(path))
        if newest not in runs:
            return None
        return _default_baseline(path, runs, newest, run_documents(path, read_documents(path)))
    except CkptbenchError:
        return None


def _said(value) -> str:
    """A recorded setting in an error line: printable, and an empty one as none."""
    return "none" if value in ("", None) else shown(redact(str(value)), 200)


def _check_figures(path: str, rows: list[dict], names) -> None:
    """The figures compared are ones a run can have measured: a negative RTO or a rate of 1e308 GB/s in one repeat,
    kept, turned a regression into "within noise" and passed the build."""
    for r in rows:
        bad = next((f for f in names if r.get(f) is not None and not in_range(f, r[f])), None)
        if bad is not None:
            repeat = "?" if r["repeat"] is None else f"{r['repeat']:.0f}"
            raise CkptbenchError(f"{path}: run {shown(r['run_id'], 40)!r} repeat {repeat} records {bad} "
                                 f"{r[bad]:g}, out of range (not measured: damaged or edited); repair or move the file")


def compare(path: str, baseline: str | None = None, threshold_pct: float = 5.0, newest: str | None = None,
            kind: str | None = None) -> Comparison:
    """`newest` (default: the newest run, or the newest of `kind`) against `baseline` (default: the last earlier run
    of its kind made the same way; for a watch, of the same command)."""
    if threshold_pct < 0:
        raise CkptbenchError(f"--threshold must be ≥ 0, got {threshold_pct}")
    rows = read_rows(path)
    runs = _runs(path, rows)
    ids = list(runs)
    unseen = _unseen(rows, runs)
    for named, flag in ((newest, "--newest"), (baseline, "--baseline")):
        if named in unseen:  # an ok run of ours, left out on purpose: "no successful run" read as a wrong id
            raise CkptbenchError(f"{path}: {shown(named)} ({flag}) is a watch that saw no checkpoint read: it timed no "
                                 "restore, so there is nothing to compare; name another run (`ckptbench history` "
                                 "lists them)")
    if len(ids) < 2:
        left = (f"; {len(unseen)} watch{'' if len(unseen) == 1 else 'es'} that saw no checkpoint read "
                f"{'is' if len(unseen) == 1 else 'are'} not compared") if unseen else ""
        raise CkptbenchError(f"{path}: {len(ids)} successful run(s) recorded{left}; compare needs two (run the "
                             "benchmark again)")
    newest = _newest(path, runs, newest, kind)
    kind = runs[newest][0]["kind"]
    every = read_documents(path)  # once: the run documents and the runs' ends both come from it
    docs = run_documents(path, every)
    if baseline is None:
        baseline = _default_baseline(path, runs, newest, docs)
    elif baseline not in runs:
        raise CkptbenchError(f"{path}: no successful run {shown(baseline)!r}; known runs: {_known(path, ids)}")
    if baseline == newest:
        raise CkptbenchError(f"--baseline {shown(baseline)} is the run compared; pick an earlier one")
    if runs[baseline][0]["kind"] != kind:
        raise CkptbenchError(f"--baseline {shown(baseline)} is a {runs[baseline][0]['kind']} run and "
                             f"{shown(newest)} a {kind} run; "
                             "compare runs of one kind")
    base_rows, new_rows = (rates_known(steady(runs[run]), docs) for run in (baseline, newest))
    _check_figures(path, base_rows + new_rows, SAVE_FIGURES if kind == "save" else FIGURES)
    figures = []
    rto = spread([r.get("rto_s") for r in base_rows])["median"] if kind != "save" else None
    for fig, higher_better in (SAVE_FIGURES if kind == "save" else FIGURES).items():
        least = 0.0
        if fig.endswith("_s"):  # seconds: a timer's grain, and a stage's sliver of the RTO, change nothing
            least = max(MIN_SECONDS, MIN_RTO_SHARE * rto if rto and fig != "rto_s" else 0.0)
        medians = None
        if kind == "save" and fig == "write_gbps":  # save's one sustained rate (bytes over the median time until
            # durable), as save prints it: the median of the rates differs from it for an even count of saves
            medians = tuple(sustained_rate([r.get("bytes") for r in rows], [r.get("durable_s") for r in rows])
                            for rows in (base_rows, new_rows))
            medians = None if None in medians else medians
        figures.append(delta(fig, [r[fig] for r in base_rows], [r[fig] for r in new_rows], higher_better,
                              threshold_pct, least, medians=medians))
    figures = [f for f in figures if f is not None]
    floors = _floors(docs)
    if kind in EFFICIENCY_OF and baseline in floors and newest in floors:
        took = EFFICIENCY_OF[kind]
        held = {run: held_s(docs[run], rows, took) for run, rows in ((baseline, base_rows), (newest, new_rows))}
        # a run's efficiency is its floor over its median time, as its document says it (the median of the
        # repeats' efficiencies differs from it for an even count: 64 % here, 61 % in the run); the repeats' own
        # still give the range the noise is judged by
        of_median = tuple(_efficiency(floors[run], spread(held[run])["median"]) for run in (baseline, newest))
        eff = None if None in of_median else delta(
            "efficiency", [_efficiency(floors[baseline], t) for t in held[baseline]],
            [_efficiency(floors[newest], t) for t in held[newest]], True, threshold_pct, medians=of_median)
        if eff is not None and any(says_little(floors[run]["floor_s"]) for run in (baseline, newest)):
            # run says such an efficiency says little: it neither fails nor passes a CI job (the RTO's change,
            # under its timer's grain, was "too small to matter" beside an efficiency REGRESSION)
            eff = replace(eff, regression=False, improved=False, too_small=True)
        figures += [eff] if eff is not None else []
    env_b, env_n = base_rows[-1]["env"], new_rows[-1]["env"]
    diff = {k: (env_b.get(k), env_n.get(k)) for k in KEY_FIELDS if env_b.get(k) != env_n.get(k)}
    made_b, made_n = _settings(runs, docs, baseline), _settings(runs, docs, newest)
    for k in made_n:
        if made_b[k] != made_n[k]:
            diff[k] = (setting_value(k, made_b[k]), setting_value(k, made_n[k]))
    if kind == "watch" and _command(docs, baseline) != _command(docs, newest):  # a --baseline of another loader
        diff["command"] = (_command(docs, baseline), _command(docs, newest))
    fb, fn = (floors.get(baseline) or {}).get("floor_s"), (floors.get(newest) or {}).get("floor_s")
    if fb and fn and abs(fn - fb) / fb > FLOOR_MOVED:  # the box itself did more or less: the efficiency says how much
        diff["floor_s"] = (fb, fn)  # of a change is the restore's
        # or the runs held other bytes to it (two watches of loaders that read 40 MiB and 283 MiB of one source were
        # told the box did more or less): said beside it
        bb, bn = (spread([measured("bytes", r.get("bytes")) for r in rows])["median"] for rows in (base_rows, new_rows))
        if bb and bn and bb != bn:
            diff["bytes"] = (bb, bn)
    said = {shown(k): (shown_value(k, a), shown_value(k, b)) for k, (a, b) in diff.items()}
    return Comparison(shown(redact(baseline)), shown(redact(newest)), figures, said, threshold_pct, kind,
                      _unfinished(every, docs, runs, {"baseline": baseline, "newest": newest}))


def _unfinished(every: list[dict], docs: dict[str, dict], runs: dict[str, list[dict]], sides: dict[str, str]) -> tuple:
    """A line for each side that never ended on record (recorder.Lifeline): killed outright, its figures are its
    repeats that finished, fewer than it was to make; still running, those so far. Compared all the same: each row
    is a whole repeat."""
    lives = unended(every, docs)
    out = []
    for side, run_id in sides.items():
        now = life(lives.get(run_id), len(runs[run_id]))
        unit = "saves" if runs[run_id][0]["kind"] == "save" else "repeats"
        if now.get("status") == "cut short":
            cut = now["cut_short"]
            of = f" of {cut['planned']}" if cut["planned"] else ""
            out.append(f"the {side} run {shown(redact(run_id))} was cut short (killed) after {cut['finished']}{of} "
                       f"{unit}: its figures are those that finished")
        elif now.get("status") == "running":
            out.append(f"the {side} run {shown(redact(run_id))} is still running: its figures are its {unit} so far")
    return tuple(out)
