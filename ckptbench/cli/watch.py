"""`ckptbench watch`: the user's own restore, sampled live, its phases and a verdict (domain: watch, verdict)."""

from __future__ import annotations

import json
import os
import re
import sys
import threading

from ckptbench.cli.show import clauses, efficiency_text, print_recorded
from ckptbench.core.errors import Cancelled, CkptbenchError, printable, redact, redact_all
from ckptbench.system import binding

PID = re.compile(r"[0-9]+")  # ASCII only: int() also reads "٣" and "３" as 3


def _target(args):
    """(pid, started process or None, marks path or None) from PID, --match or a command."""
    from ckptbench.system import procstat
    from ckptbench.watch import sampler as watch

    if args.match and args.target:
        raise CkptbenchError("watch: give a PID or --match PATTERN or -- COMMAND, not several")
    if args.match:
        return procstat.find(args.match), None, None
    if len(args.target) == 1 and PID.fullmatch(args.target[0]):
        pid = int(args.target[0])
        procstat.watchable(pid)  # gone, unreadable or a zombie: one line now, before anything is shown
        return pid, None, None
    if len(args.target) == 1 and args.target[0][:1].isdigit():  # "12ab", or digits of another script: meant as a
        # PID, not a program named so (one started as `-- ./12ab` has a path)
        raise CkptbenchError(f"watch: {args.target[0]!r} is not a PID (a PID is ASCII digits 0-9); give a PID, "
                             "--match PATTERN or -- COMMAND")
    proc, marks = watch.start_job(args.target, stdout_to_stderr=args.json)
    return proc.pid, proc, marks


class _LiveLine:
    """The live line on a terminal: time and phase, the shared progress line over the bytes the job read (with
    --source, against the checkpoint's size, so an ETA), then CPU, RSS and open files."""

    def __init__(self, total: int | None):
        from ckptbench.core.progress import ProgressLine

        self.total = total
        self.line = ProgressLine(sys.stderr)
        self.seen = 0  # bytes since the job started reading
        self.started: float | None = None  # when it started reading: the clock of the average and the ETA

    def __call__(self, interval, sample) -> None:
        from ckptbench.core.units import human_bytes, human_pct

        if interval.phase in ("reading", "faulting") or self.seen:
            if self.started is None:
                self.started = interval.t0
            self.seen += round(interval.gbps * 1e9 * (interval.t1 - interval.t0))  # read calls, mappings or disk
        seconds = interval.t1 - self.started if self.started is not None else 0.0
        self.line.progress(self.seen, self.total, seconds, head=f"{interval.t1:6.1f} s  {interval.phase:13s} ",
                           tail=f"  CPU {interval.cpu_cores:4.1f} cores (busiest thread "
                                f"{human_pct(interval.top_thread_cores)})  RSS {human_bytes(sample.rss_bytes):>10s}  "
                                f"files open {len(sample.files)}")

    def close(self) -> None:
        self.line.close()


def _say(text: str) -> None:
    """One line out: the job's command line, its files and marks are the user's text, made safe to show."""
    print(printable(redact(text)))


def watch_read(doc: dict) -> str:
    """What a watch read and how fast, as the line and the watch screen say it: "read 2.0 MiB in 0.40 s of reading:
    5.00 GB/s", a bound where the count or the time is one, "untimed" where no sample saw the job read."""
    from ckptbench.core.units import human_bytes

    if not doc["bytes"]:  # "0 B in 0.00 s: 0.00 GB/s" gave a rate nothing measured
        return "read: no checkpoint read seen, no reading timed"
    least = "at least " if doc.get("count_note") else ""  # a count known to be short is not given as the rate
    said = f"read {least}{human_bytes(doc['bytes'])}"
    if not doc["io_span_s"]:  # bytes seen and no window: no time, so no rate (a hot resume read "0.00 GB/s")
        return f"{said}, untimed: {doc.get('window_note') or 'no reading window'}"
    if doc.get("window_note"):  # reads inside one sample: its length bounds their time, as the verdict's "at least"
        # says (the line gave the bound as the rate beside the floor's "too short to time")
        return f"{said} in at most {doc['io_span_s']:.2f} s of reading: at least {doc['loader_gbps']:.2f} GB/s"
    return f"{said} in {doc['io_span_s']:.2f} s of reading: {least}{doc['loader_gbps']:.2f} GB/s"


def _print(doc: dict) -> None:
    from ckptbench.core.units import human_bytes

    # the command redacted alone: redacting the whole line took the ")" after a secret as part of its value
    command = printable(redact(doc["command"]))
    command = command if len(command) <= 80 else "…" + command[-79:]  # its end: the arguments, not the venv's path
    print(f"watched {doc['pid']} ({command}): " + printable(redact(
        f"{doc['wall_s']:.2f} s, {doc['ended']}" + (f", exit {doc['exit_code']}" if doc["exit_code"] is not None else ""))))
    least = "at least " if doc.get("count_note") else ""
    _say(f"{watch_read(doc)}; peak RSS {human_bytes(doc['peak_rss_bytes'])}; CPU {doc['cpu_s']:.2f} s; "
         f"major faults {doc['majflt']}")
    if least:
        _say(f"  a lower bound: {doc['count_note']}")
    if doc.get("counted_bytes") is not None and doc["bytes"] > doc["counted_bytes"]:
        _say(f"  counted from the checkpoint files' pages that came into the page cache or its mappings while it ran "
             f"(its own counters saw {human_bytes(doc['counted_bytes'])} in the reading window)")
    if doc["marks"]:
        _say("marks: " + ", ".join(f"{m['stage']} at {m['t']:.2f} s" for m in doc["marks"]))
    _say(phases_line(doc["phases"]))
    if doc.get("gpu_peak_bytes") is not None:
        _say(f"GPU memory (nvidia-smi): peak {human_bytes(doc['gpu_peak_bytes'])}"
             + (f" ({doc['gpu_note']})" if doc.get("gpu_note") else ""))
    elif doc.get("gpu_note"):
        _say(f"GPU memory: {doc['gpu_note']}")
    mapped, unseen = set(doc.get("mapped") or ()), set(doc.get("unseen") or ())
    for path, size in sorted(doc["files"].items())[:10]:
        how = "mapped" if path in mapped else "read between samples" if path in unseen else "open"
        _say(f"  {how}: {path} ({human_bytes(size)})")
    for line in floor_lines(doc):
        _say(line)
    v = doc.get("verdict")
    if v:
        _say(f"verdict: {v['kind']}: {v['summary']}")
        _say(f"fix: {v['fix']}")


def floor_lines(doc: dict) -> list[str]:
    """The watch's floor to the millisecond, as run says it and as its parts beside it are ("0.00 s" stood beside
    "fresh memory 0.003 s + page cache 0.001 s"), then its note's clauses; the note alone where there is no floor."""
    if "floor_s" not in doc:
        return []
    if doc["floor_s"] is None:
        return [f"floor: {doc['floor_note']}"]
    # the efficiency as run says it: with --no-verdict it was in history and --json, and nowhere in the text
    return [f"floor: {doc['floor_s']:.3f} s, bound by {binding.bound(doc)}{efficiency_text(doc)}"] + [
        f"       {c}" for c in clauses(doc["floor_note"] or "")]


def cmd_watch(args) -> int:
    from ckptbench.watch import verdict
    from ckptbench.watch import sampler as watch

    watch.check_interval(args.interval)  # the arguments first: `watch 1 --interval 0` said /proc/1/io was unreadable
    if args.pick is not None and not args.source:
        raise CkptbenchError("--pick chooses among the checkpoints of the folder --source names: give --source DIR too")
    files, total = verdict.source_files(args.source, args.pick)  # a bad --source is one line before anything starts
    if args.results:
        from ckptbench.records.results import check_writable

        check_writable(args.results, kind="watch")  # before the job is started: nothing fails after it
    pid, proc, marks = _target(args)
    if args.tui:
        from ckptbench.cli.ui import run_app

        try:
            run_app("watch", pid, proc=proc, marks=marks, interval=args.interval, source=args.source, pick=args.pick)
        finally:
            if marks:
                os.unlink(marks)
        return 0
    cancel = threading.Event()
    line = None if args.json else _LiveLine(total)
    w = watch.Watch(pid, interval=args.interval, cancel=cancel, proc=proc, marks_path=marks, on_interval=line,
                    source=args.source)
    try:
        report = w.run()
    except KeyboardInterrupt:
        cancel.set()
        raise Cancelled("watch interrupted") from None
    finally:
        if marks:
            os.unlink(marks)
        if line is not None:
            line.close()
    if not args.no_verdict and (files or report.files):  # it changes the box: the user's hot checkpoint is cold
        # after; said on stderr, so --json's stdout stays one document
        print("note: reading the checkpoint's files cold for the verdict (this evicts them from the page cache; "
              "--no-verdict skips it)", file=sys.stderr)
    doc = verdict.document(report, files, judge_it=not args.no_verdict)
    if total is not None:
        doc["checkpoint"] = {"path": args.source, "bytes": total, "files": len(files)}
    doc = redact_all(doc)  # the command is redacted already; its files and marks are the job's text too
    run_id, env = "", {}
    if args.results or args.json:  # the environment goes on record, and in the document --json prints
        from ckptbench.system import env as envmod
        from ckptbench.watch import results as watch_results

        env = envmod.snapshot(watch_results.source_in(doc) or None)
    if args.results:
        import uuid

        run_id = uuid.uuid4().hex[:12]
        watch_results.record(args.results, run_id, doc, env)
    if args.json:  # the document as recorded (run_id, kind, record, schema, status): a CI job names it to compare
        print(json.dumps(watch_results.as_document(run_id or None, doc, env), indent=1))  # imported above: --json
    else:
        _print(doc)
        if run_id:
            print_recorded(args.results, run_id, "watch", comparable=bool(doc["bytes"]))
    return 0 if report.exit_code in (None, 0) else 1


PHASES_SHOWN = 8  # runs of a phase one line shows in order; more (a tiny --interval) are told as each phase's total


def phases_line(phases: list[dict]) -> str:
    """The phases in order, or, when they alternate more often than a line can follow (38 runs at --interval 0.01),
    each phase's total time in the order first seen: every run stays in --json."""
    if len(phases) <= PHASES_SHOWN:
        return "phases: " + " → ".join(f"{p['phase']} {p['t1'] - p['t0']:.2f} s" for p in phases)
    total: dict[str, float] = {}
    for p in phases:
        total[p["phase"]] = total.get(p["phase"], 0.0) + p["t1"] - p["t0"]
    return (f"phases: {len(phases)} runs, in total " + ", ".join(f"{k} {v:.2f} s" for k, v in total.items())
            + " (each run in --json)")
