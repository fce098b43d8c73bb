"""Handler of `save`, called by cli.py: preflight shown first, one line per save, then the verdict on the interval."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import uuid

from ckptbench.cli.show import print_recorded
from ckptbench.core.errors import Cancelled, printable, redact
from ckptbench.core.units import human_bytes, human_figure, human_pct

MARK = {True: "ok  ", False: "FAIL", None: " ?  "}


def _say(text: str = "", file=None) -> None:
    """One line out: a path or a mount's options can carry a credential or a terminal escape."""
    print(printable(redact(text)), file=file or sys.stdout)


def print_preflight(checks, stream=None) -> None:
    stream = stream or sys.stdout
    _say("preflight of the target:", stream)
    for c in checks:
        _say(f"  [{MARK[c.ok]}] {c.name:10s} {c.evidence}", stream)
        if c.ok is not True and c.consequence:
            _say(f"         consequence: {c.consequence}; fix: {c.fix}", stream)


def print_save(t, stream=None) -> None:
    late = "  OVERRAN the interval" if t.overran else ""
    _say(f"  {t.name}: {human_bytes(t.bytes)}, blocking {t.blocking_s:.3f} s, written {t.written_s:.3f} s, "
         f"durable {t.durable_s:.3f} s ({t.bytes / t.durable_s / 1e9:.2f} GB/s){late}", stream)


class SaveLine:
    """The live line on a terminal while saves run: which save, the shared progress line over the series' bytes (the
    clock: since the first save began, waits between saves included, so the ETA is the series' end), and the page
    cache's dirty and writeback bytes as the sampler last saw them."""

    def __init__(self, count: int, stream=None):
        from ckptbench.core.progress import ProgressLine

        self.count, self.done, self.each = count, 0, 0
        self.line = ProgressLine(stream or sys.stderr)
        self.start: float | None = None
        self.pending = 0  # dirty + writeback bytes at the last sample

    def begin(self) -> None:
        self.start = time.monotonic()
        self.show()

    def saved(self, t, say) -> None:
        """One save ended: `say()` prints its line above the live one."""
        self.done += t.bytes
        self.each = self.each or t.bytes  # every save writes the same state
        self.line.clear()
        say()
        self.show()

    def sample(self, s) -> None:
        self.pending = s.dirty_bytes + s.writeback_bytes
        self.show()

    def show(self) -> None:
        if self.start is None or not self.line.live:
            return
        n = min(self.count, self.done // self.each + 1) if self.each else 1
        self.line.progress(self.done, self.each * self.count or None, time.monotonic() - self.start,
                           head=f"save {n}/{self.count}  ", tail=f"  dirty+writeback {human_bytes(self.pending)}")

    def close(self) -> None:
        self.line.close()


def _fmt(x, spec: str, unit: str = "") -> str:
    return "unknown" if x is None else f"{x:{spec}}{unit}"


def print_report(r) -> None:
    _say(f"{r.target}: {len(r.saves)} save(s) of {human_bytes(r.bytes)} ({r.format}, {r.options.ranks} rank(s))")
    from ckptbench.save.analysis import steady

    # --no-fsync: the times end at the rename, with the bytes perhaps only in memory; "durable" would claim what
    # was not waited for (the notes say so too, but after the figure a reader quotes)
    what, until, kind = (("sustained durable throughput", "durable", "durable") if r.options.fsync else
                         ("sustained throughput, not durable (--no-fsync)", "renamed into place", "rename"))
    _say(f"{what} {_fmt(r.sustained_gbps, '.3f', ' GB/s')} (bytes over the median time until {until} of "
         f"{steady(r.saves)[1]}); "
         # in the unit that keeps it (a 4 ms interval read "0.00 s" beside saves timed to the millisecond)
         f"shortest safe interval {human_figure('shortest_safe_interval_s', r.shortest_safe_interval_s)} ({kind} "
         "time × 1.25)")
    if r.needed_gbps is not None:
        over = sum(s.overran for s in r.saves)
        enough = r.sustained_gbps is not None and r.sustained_gbps >= r.needed_gbps
        _say(f"every {r.options.interval_s:g} s needs {r.needed_gbps:.3f} GB/s: "
             f"{'met' if enough else 'NOT met'}; {over} save(s) overran into the next")
    peak = "unknown" if r.dirty_peak_fraction is None else human_pct(r.dirty_peak_fraction)
    _say(f"page cache: Dirty + Writeback peaked at {peak} of the dirty limit; "
         f"writers {'were THROTTLED' if r.throttled else 'were not throttled'}")
    _say(f"write amplification (device bytes / checkpoint bytes): {_fmt(r.write_amplification, '.3f', '×')}")
    if r.stagger:
        s = r.stagger
        _say(f"stagger {s['stagger_s']:g} s over {s['ranks']} ranks: at most {s['peak_concurrent_ranks']} rank(s) "
             f"writing at once, overlapping {human_pct(s['overlap_fraction'])} of the writing time; peak application "
             f"write {s['peak_write_gbps']:.2f} GB/s against {s['peak_write_gbps_all_at_once']:.2f} GB/s with every "
             f"rank at once; device peak {_fmt(s['device_peak_write_mbps'], '.0f', ' MB/s')}")
    if r.floor:
        from ckptbench.cli.show import floor_lines

        for line in floor_lines(r.floor):
            _say(line)
    for n in r.notes:
        _say(f"  note: {n}")


def cmd_save(args) -> int:
    from ckptbench.save.results import SaveRecorder
    from ckptbench.records.results import check_writable, jsonl_path
    from ckptbench.save.series import SaveOptions, refuse_foreign, validate

    opts = SaveOptions(format=args.format, interval_s=args.interval, count=args.count, keep=args.keep,
                       ranks=args.ranks, stagger_s=args.stagger, async_save=args.async_save, fsync=args.fsync)
    validate(opts)  # before the results file is touched
    ours = (args.results, jsonl_path(args.results)) if args.results else ()  # `save .` records into its target
    if os.path.isdir(args.target):  # before check_writable's probe file lands in a target that is not ours
        refuse_foreign(args.target, ours)
    if args.results:
        check_writable(args.results, kind="save")
    out = sys.stderr if args.json else sys.stdout
    cancel = threading.Event()
    # each save on record as it ends: a series killed outright keeps the saves it finished
    recorder = SaveRecorder(args.results or None, uuid.uuid4().hex[:12], args.what, os.path.abspath(args.target), opts)
    try:
        return _series(args, opts, recorder, ours, out, cancel)
    except BaseException as exc:
        recorder.life.close(exc)  # ended, with no run document to say so
        raise


def _series(args, opts, recorder, ours, out, cancel) -> int:
    """The saves, each on record as it ends, then the run document (or the save that stopped)."""
    from ckptbench.save.series import run_save

    stopped_report = []
    line = SaveLine(opts.count)

    def on_save(t) -> None:
        recorder.saved(t)
        line.saved(t, lambda: print_save(t, out))

    def on_preflight(checks) -> None:
        print_preflight(checks, out)
        line.begin()

    try:
        report = run_save(args.what, args.target, opts, on_save=on_save, on_sample=line.sample, cancel=cancel,
                          scale=args.scale, force=args.force, on_preflight=on_preflight,
                          also_ours=ours, pick=args.pick, on_stop=stopped_report.append,
                          on_begin=recorder.begin)  # nothing on record of a series refused before its first save
    except BaseException as exc:
        line.close()
        cancel.set()
        if recorder.saves:  # the saves before it are on record already; then the one that stopped
            interrupted = isinstance(exc, (KeyboardInterrupt, Cancelled))
            recorder.stopped("cancelled" if interrupted else "failed")
        if isinstance(exc, KeyboardInterrupt) and recorder.saves:
            return _save_stopped(args, opts, recorder, stopped_report, exc)
        raise
    line.close()
    _show(args, recorder, report)
    if not args.json:
        print_recorded(args.results, recorder.run_id, "save")
    return 0


def _show(args, recorder, report, stopped: dict | None = None) -> None:
    """The run document on record (with --results), then the report in words or, with --json, the document (with
    --results '': as it would be on record, its run id null)."""
    doc = recorder.finish(report, stopped) if args.results or args.json else None
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        print_report(report)


def _save_stopped(args, opts, recorder, stopped_report: list, exc: KeyboardInterrupt) -> int:
    """Ctrl-C (or SIGTERM) after some saves finished: those are the run, on record as an interrupted one with its
    document (as run's), and one line says how many finished and where they are on record (a new user got
    `ckptbench: interrupted` alone, and no run id to name to history or compare); run's exit for it."""
    from ckptbench.cli.root import Terminated

    word = "terminated" if isinstance(exc, Terminated) else "interrupted"
    done = len(recorder.saves)
    if stopped_report:  # none when the interrupt came as the series was being analysed: its saves are on record
        under_way = done + 1 if done < opts.count else None  # None: every save had ended
        _show(args, recorder, stopped_report[0], {"interrupted": {"save": under_way, "saves": opts.count,
                                                                  "finished": done}})
    recorder.life.close(exc)  # no run document was written: the series ended all the same
    where = (f"on record as save run {recorder.run_id} in {printable(args.results)} (`ckptbench history "
             f"{printable(args.results)}`)" if args.results else "not recorded (--results '')")
    during = f"during save {done + 1}" if done < opts.count else f"after save {done}"
    print(f"ckptbench: {word} {during} of {opts.count}: {done} save(s) finished, each shown above, {where}",
          file=sys.stderr)
    return 143 if word == "terminated" else 130  # as main() says an interrupted or terminated command
