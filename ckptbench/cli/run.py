"""Handlers of the timed commands — run, sweep, compare — called by cli.py."""

from __future__ import annotations

import json
import sys
import threading
import uuid

from ckptbench.core.errors import CkptbenchError, name_source
from ckptbench.cli.show import digests_line, print_floor, print_pick, print_recorded, say, sweep_floor_lines
from ckptbench.core.stages import STAGES
from ckptbench.core.units import human_bytes, human_money, human_pct


class StageProgress:
    """The live line while a restore runs: the repeat and stage, and during the read the shared progress line."""

    def __init__(self, stream=None):
        from ckptbench.core.progress import ProgressLine

        self.line = ProgressLine(stream or sys.stderr)
        self.repeat = 0

    def __call__(self, stage, snap) -> None:
        if not self.line.live:
            return
        from ckptbench.core.progress import progress_line

        self.line.show(f"[{self.repeat}] {stage:6s} " + (progress_line(snap, self.line.rates) if snap is not None
                                                         else ""))

    def close(self) -> None:
        self.line.close()


def print_run(doc: dict) -> None:
    """The run in words; every line through `say`: the source, the notes, the read path's why and the problems name
    the checkpoint's files (a name can hold a terminal escape) and a remote's errors (a URL)."""
    say(f"{doc['source']} ({doc['format']}, {doc['options']['mode']}, cache {doc['options']['cache']}, "
        f"concurrency {doc['options']['concurrency']}): {len(doc['repeats'])} repeat(s), "
        f"{human_bytes(doc['bytes'])} in {doc['files']} file{'' if doc['files'] == 1 else 's'}")
    print_pick(doc.get("layout"))
    rto = doc["rto_stats"]
    say(f"  {'stage':8s} {'median s':>9s} {'min':>8s} {'max':>8s} {'share':>6s}")
    for s in STAGES:
        st = doc["stages_stats"][s]
        if st["median"] is None:
            continue
        share = st["median"] / rto["median"] if rto["median"] else 0
        say(f"  {s:8s} {st['median']:9.3f} {st['min']:8.3f} {st['max']:8.3f} {human_pct(share):>6s}")
    say(f"  {'RTO':8s} {rto['median']:9.3f} {rto['min']:8.3f} {rto['max']:8.3f}")
    print_floor(doc)
    g = doc["read_gbps_stats"]
    say(f"read {g['median']:.2f} GB/s over the read stage (min {g['min']:.2f}, max {g['max']:.2f}; the reader "
        f"alone {doc['engine_gbps']:.2f}); success {human_pct(doc['success_rate'])}; retries {doc['retries']}; "
        f"peak RSS {human_bytes(doc['peak_rss_bytes'])}; CPU {doc['cpu_s']:.2f} s")
    if doc.get("warmup_s"):
        say(f"one-time warm-up before the first clock (imports, torch's first operations): "
            f"{doc['warmup_s']:.2f} s, not in the RTO")
    say(f"read path: {', '.join(doc['read']['modes'])} ({doc['read']['why']})")
    say(digests_line(doc))
    say(cache_line(doc["cache"], len(doc["repeats"])))
    for stage, note in doc["notes"].items():
        say(f"  note ({stage}): {note}")
    if "cost" in doc:
        k = doc["cost"]
        say(f"cost (in --price-per-hour's currency): {human_money(k['per_restore'])} per restore at "
            f"{human_money(k['effective_price_per_hour'])}/h, {human_money(k['per_month'])} per month, "
            f"{k['idle_gpu_hours_per_month']:.1f} idle GPU hours per month")
    for r in doc["repeats"]:
        for p in r["problems"][:5]:
            say(f"  problem: {p}", sys.stderr)


def cache_line(c: dict, repeats: int) -> str:
    """How much of the checkpoint was in the page cache as the repeats started, in words: "residency before ≤ 0.0 %"
    meant nothing to a new user. The figure is the repeat furthest from the condition asked for (a cold run's most
    resident, a hot run's least), so more than one repeat is a bound."""
    r = c["residency_before"]
    bound = "" if repeats <= 1 else "at least " if c["requested"] == "hot" else "at most "
    if r <= 0.0:
        amount = "none of it"
    elif r >= 1.0:
        amount = "all of it"
    elif r < 0.001 or r > 0.999:  # human_pct would round them to none and all
        amount = f"{bound}{r * 100:.4g} % of it"
    else:
        amount = f"{bound}{human_pct(r)} of it"
    local = c.get("local", True)  # S3: nothing was evicted or read in
    how = ({"cold": "cold: evicted first", "hot": "hot: read in first"} if local else
           {"cold": "cold: nothing local to evict", "hot": "hot: nothing local to read in"}).get(c["requested"],
                                                                                               "as-is: as found")
    state = ", verified" if c["verified"] else ", NOT VERIFIED"
    notes = f"; {'; '.join(c['notes'])}" if c["notes"] else ""
    return f"page cache before the restore: {amount} ({how}{state if c['requested'] != 'as-is' else ''}{notes})"


def _distributed_only(args) -> None:
    """--each-rank all and --tensor-digests change a distributed run only: alone they measured something else."""
    given = [flag for flag, on in (("--each-rank all", args.each_rank != "part"),
                                   ("--tensor-digests", getattr(args, "tensor_digests", False))) if on]
    if given and not args.distributed:
        what = " and ".join(given)
        raise CkptbenchError(f"{what}: only with --distributed (under torchrun); add --distributed or leave {what} out")


def cmd_run(args) -> int:
    from ckptbench.cli.settings import check_drop_caches

    _distributed_only(args)
    check_drop_caches(args)
    if args.distributed:
        from ckptbench.cli.dist import cmd_run_distributed

        return cmd_run_distributed(args)
    from ckptbench.system import env as envmod
    from ckptbench.cli.settings import check_cost_options, check_s3_only, run_options
    from ckptbench.records import results
    from ckptbench.records.recorder import Recorder
    from ckptbench.plan.cost import restore_cost
    from ckptbench.sources import open_source

    opts = run_options(args)
    check_s3_only(args, args.source)
    check_cost_options(args)
    if args.results:
        results.check_writable(args.results)
    if args.price_per_hour is not None:
        restore_cost(0, args.price_per_hour, args.spot_discount, args.restores_per_day)  # validate before running
    progress = StageProgress()
    cancel = threading.Event()
    source = open_source(args.source, args.pick)
    listing = source.list()
    recorder = Recorder(args.results, uuid.uuid4().hex[:12], listing.restored, listing.format, opts,
                        envmod.snapshot(args.source))
    try:
        return _run_recorded(args, source, listing, opts, recorder, progress, cancel)
    except BaseException as exc:
        recorder.life.close(exc)  # ended, with no run document to say so
        raise


def _run_recorded(args, source, listing, opts, recorder, progress, cancel) -> int:
    """The repeats, each on record as it ends, then the run document (or the repeat that stopped)."""
    from ckptbench.core.errors import Cancelled
    from ckptbench.restore import runner as pipeline

    current = []

    def on_run(run) -> None:
        progress.repeat += 1
        current[:] = [run]
        recorder.begin(args.repeat)  # from the first repeat on, a run killed outright is told from one that ended

    try:
        reps = pipeline.run(source, opts, repeats=args.repeat, progress=progress, cancel=cancel, on_run=on_run,
                            on_repeat=recorder.repeat, listing=listing)
    except BaseException as exc:
        cancel.set()
        if current:  # the repeat under way is recorded as stopped; finished ones are already in the file
            stopped = isinstance(exc, (KeyboardInterrupt, Cancelled))
            recorder.stopped(current[0].stages, "cancelled" if stopped else "failed", exc)
        if isinstance(exc, KeyboardInterrupt) and recorder.reps:
            progress.close()
            return _run_stopped(args, source, listing, opts, recorder, exc)
        raise
    finally:
        progress.close()
    return _run_done(args, source, listing, opts, recorder, reps)


def _run_stopped(args, source, listing, opts, recorder, exc: KeyboardInterrupt) -> int:
    """Ctrl-C (or SIGTERM) after some repeats ended: those are the run, on record as an interrupted one with its
    document (a new user found only `ckptbench: interrupted`, and no run id to compare), said in one line; the exit
    an interrupted command has."""
    from ckptbench.cli.root import Terminated

    word = "terminated" if isinstance(exc, Terminated) else "interrupted"
    done = len(recorder.reps)
    stopped = {"status": "cancelled", "interrupted": {"repeat": done + 1, "repeats": args.repeat, "finished": done}}
    _run_done(args, source, listing, opts, recorder, recorder.reps, stopped)
    print(f"ckptbench: {word} during repeat {done + 1} of {args.repeat}: the run above is the {done} that finished"
          + (" (on record as interrupted)" if args.results else ""), file=sys.stderr)
    return 143 if word == "terminated" else 130  # as main() says an interrupted or terminated command


def _run_done(args, source, listing, opts, recorder, reps: list, stopped: dict | None = None) -> int:
    """The run document of `reps`, on record and shown (text or JSON); `stopped`: what a run cut short adds."""
    from ckptbench.plan.cost import restore_cost
    from ckptbench.restore import efficiency

    extra = {"layout": listing.layout.describe()} if listing.layout is not None else {}
    if args.price_per_hour is not None:
        from ckptbench.core.stats import spread

        rto = spread([r.rto_s for r in reps])["median"]
        extra["cost"] = restore_cost(rto, args.price_per_hour, args.spot_discount, args.restores_per_day)
    extra |= efficiency.of_repeats(source, listing, opts, reps)
    doc = recorder.finish(reps, extra | (stopped or {}))
    if not args.results:
        doc["run_id"] = None  # --results '': nothing on record, no id to name to compare (as watch says it)
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print_run(doc)
        print_recorded(args.results, doc["run_id"])
    return 0 if doc["status"] in ("ok", "unverified") else 1  # unverified: said above, as NOT VERIFIED


def cmd_sweep(args) -> int:
    _distributed_only(args)
    if args.distributed:
        from ckptbench.cli.dist import cmd_sweep_distributed

        return cmd_sweep_distributed(args)
    from ckptbench.cli.settings import read_options
    from ckptbench.restore.sweep import Sweep, parse_levels

    levels = parse_levels(args.levels)
    opts = read_options(args)

    def level_done(level, gbps):
        if sys.stderr.isatty():  # one write: a Ctrl-C between print's text and its newline ran the next line on
            sys.stderr.write(f"  concurrency {level:4d}: {gbps:.2f} GB/s\n")

    from ckptbench.sources import open_source

    if args.results:
        from ckptbench.records import results

        results.check_writable(args.results)
    sweep = Sweep(open_source(args.source, args.pick), levels, repeats=args.repeat, cache=args.cache, opts=opts)
    from ckptbench.cli.settings import require_checkpoint

    # a folder of text files is no checkpoint: run's line, before a cold read evicts it (it gave a knee, and with
    # --results recorded one that `check` would advise from)
    require_checkpoint(sweep.listing)
    try:
        res = sweep.run(progress=level_done)
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM as the CLI raises it: the reads that finished are kept
        return _sweep_stopped(args, sweep, exc)
    if args.results:  # the checklist and the dashboard advise from the knee measured, not from a preset
        from ckptbench.restore.sweep import measured_knee, record_knee

        record_knee(args.results, measured_knee(res.source, {lv: s["median"] for lv, s in res.gbps.items()}, "sweep"))
    return _show_sweep(args, res)


def _sweep_stopped(args, sweep, exc: KeyboardInterrupt) -> int:
    """A sweep stopped by Ctrl-C or SIGTERM: its levels read so far printed and recorded as a cancelled sweep (no
    knee, so `check` does not advise from it), one line saying so, and the exit an interrupted run has."""
    from ckptbench.cli.root import Terminated
    from ckptbench.restore.sweep import record_interrupted

    res = sweep.result()
    word = "terminated" if isinstance(exc, Terminated) else "interrupted"
    if res is not None:
        if args.results:
            record_interrupted(args.results, res)
        _show_sweep(args, res)
    under = sweep.under
    where = (f"during read {sweep.done + 1} of {sweep.total} (concurrency {under[1]}, repeat {under[0]} of "
             f"{sweep.repeats})" if under else f"after read {sweep.done} of {sweep.total}")
    if res is None:
        kept = "nothing measured, nothing recorded"
    else:
        kept = (f"{sweep.done} read(s) finished, of concurrency {', '.join(map(str, res.levels))}, shown above; "
                + (f"recorded in {args.results} as an interrupted sweep, with no knee (`check` does not advise from "
                   "it)" if args.results else "not recorded (no --results)"))
    say(f"ckptbench: {word} {where}: {kept}", sys.stderr)
    return 143 if word == "terminated" else 130  # as main() says an interrupted or terminated command


def _show_sweep(args, res) -> int:
    """The sweep in words (or its JSON document); an interrupted one says how many reads each level got, and no knee."""
    if res.floor and res.floor.get("floor_note"):  # its commands name this checkpoint, as run's do
        res.floor["floor_note"] = name_source(res.floor["floor_note"], args.source)
    for path, why in res.failed:
        say(f"  failed: {path}: {why} (measured without it)", sys.stderr)  # a file's name, a remote's error
    rc = 1 if res.failed else 0
    if args.json:
        json.dump(res.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
        return rc
    best = res.gbps[res.best]["median"]
    stopped = res.interrupted
    print_pick(res.layout, verb="swept")
    say(f"{res.source}: read throughput by concurrency ({res.cache} cache"
        f"{'' if res.cache_verified else ', NOT verified'}; hash {res.hash}; read path {res.read}; median of "
        + (f"the reads each level finished, {args.repeat} asked; interrupted after {stopped['reads']} of "
           f"{stopped['of']} reads)" if stopped else f"{args.repeat})"))
    effs = (res.floor or {}).get("efficiency_by_level") or {}
    reads = f" {'reads':>5s}" if stopped else ""
    print(f"  {'level':>6s}{reads} {'GB/s':>7s} {'min':>7s} {'max':>7s}  of best  of floor")
    for lv in res.levels:
        s = res.gbps[lv]
        mark = "  ← knee" if lv == res.knee else ""
        eff = f"{human_pct(effs[lv]):>8s}" if effs.get(lv) is not None else f"{'—':>8s}"
        n = f" {s['n']:5d}" if stopped else ""
        # one decimal: the knee's rule is 'within 10 %', and a level at 89.8 % shown as '90 %' was not chosen
        print(f"  {lv:6d}{n} {s['median']:7.2f} {s['min']:7.2f} {s['max']:7.2f}  {s['median'] / best * 100:5.1f} %  "
              f"{eff}{mark}")
    if res.floor:
        for line in sweep_floor_lines(res.floor):
            say(line)
    if stopped:
        missing = f"; concurrency {', '.join(map(str, stopped['not_read']))} not read" if stopped["not_read"] else ""
        print(f"knee: none, the sweep was interrupted (a level read fewer times, or not at all, could move it"
              f"{missing}); run the sweep again for it")
    else:
        # a floor under the fixed costs: the levels differ by opening files and starting threads, not by what the
        # storage gives (a 35 KiB sweep recommended --concurrency 1, and check then advised it as measured)
        from ckptbench.system.floor import SMALL_SWEEP_FIX, SMALL_SWEEP_WHY, says_little

        small = says_little((res.floor or {}).get("floor_s"))
        print(f"knee: {res.knee} (smallest level within {human_pct(res.margin)} of the best, {res.best}); "
              f"recommendation: --concurrency {res.knee}" + (
                  f"; {SMALL_SWEEP_WHY}: {SMALL_SWEEP_FIX}" if small else ""))
    return rc


def cmd_compare(args) -> int:
    from ckptbench.records.compare import MORE_SAMPLES, compare
    from ckptbench.records.deltas import change_text, figure_text, setting_text
    from ckptbench.records.schema import plain

    c = compare(args.results, args.baseline, args.threshold, newest=args.newest, kind=args.kind)
    if args.json:  # plain: anything non-finite left is null, never NaN or Infinity (not JSON)
        json.dump(plain({"kind": c.kind, "baseline": c.baseline_id, "newest": c.newest_id,
                         "threshold_pct": c.threshold_pct, "env_diff": c.env_diff, "notes": list(c.notes),
                         "regressions": [f.figure for f in c.regressed],
                         "figures": [vars(f) | {"verdict": f.verdict or None, "noise_note": f.noise_note or None}
                                     for f in c.figures]}),  # the verdict in the text's words (FigureDelta.verdict)
                  sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    else:
        if c.env_diff:  # recorded settings: compare made them printable; say() again as every line here
            say("WARNING: the runs differ in key environment or settings — the comparison may not be fair:")
            for k, (a, b) in c.env_diff.items():
                say(f"  {setting_text(k, a, b)}")
        for note in c.notes:
            say(f"note: {note}")
        say(f"newest {c.newest_id} against baseline {c.baseline_id} (kind {c.kind}, threshold {c.threshold_pct:g} %)")
        say(f"  {'figure':16s} {'baseline':>10s} {'newest':>10s} {'change':>8s}")
        for f in c.figures:
            flag = f"  ({f.verdict})" if f.verdict else ""
            if f.regression or f.improved:  # with the note a side of one repeat leaves, as the other verdicts say it
                flag = f"  {f.verdict}" + (f" ({f.noise_note})" if f.noise_note else "")
            say(f"  {f.figure:16s} {figure_text(f.figure, f.baseline['median']):>10s} "
                f"{figure_text(f.figure, f.newest['median']):>10s} {change_text(f.change_pct, f.figure, f.baseline['median'], f.newest['median']):>8s}{flag}")
    if c.regressed:
        unsure = any(f.noise_note for f in c.regressed)
        # what gives more samples is the kind's own option: save has --count, not --repeat, and a watch neither
        print(f"regression in {', '.join(f.figure for f in c.regressed)}"
              + (f" (a side of one repeat has no noise estimate: {MORE_SAMPLES.get(c.kind, MORE_SAMPLES['restore'])})"
                 if unsure else ""), file=sys.stderr)
        return 1
    return 0
