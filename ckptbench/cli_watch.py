"""`ckptbench watch`: the user's own restore, sampled live, its phases and a verdict (domain: watch, verdict)."""

from __future__ import annotations

import json
import os
import sys
import threading

from ckptbench.errors import Cancelled, CkptbenchError


def _target(args):
    """(pid, started process or None, marks path or None) from PID, --match or a command."""
    from ckptbench import procstat, watch

    if args.match and args.target:
        raise CkptbenchError("watch: give a PID or --match PATTERN or -- COMMAND, not several")
    if args.match:
        return procstat.find(args.match), None, None
    if len(args.target) == 1 and args.target[0].isdigit():
        pid = int(args.target[0])
        procstat.sample(pid)  # gone or unreadable: one line now, before anything is shown
        return pid, None, None
    proc, marks = watch.start_job(args.target, stdout_to_stderr=args.json)
    return proc.pid, proc, marks


def _live(interval, sample) -> None:
    from ckptbench.units import human_bytes

    if sys.stderr.isatty():
        print(f"\r{interval.t1:6.1f} s  {interval.phase:13s} {interval.gbps:6.2f} GB/s  CPU {interval.cpu_cores:4.1f} "
              f"cores (busiest thread {interval.top_thread_cores:.0%})  RSS {human_bytes(sample.rss_bytes):>10s}  "
              f"files open {len(sample.files)}", end="", file=sys.stderr, flush=True)


def _print(doc: dict) -> None:
    from ckptbench.units import human_bytes

    print(f"watched {doc['pid']} ({doc['command'][:80]}): {doc['wall_s']:.2f} s, {doc['ended']}"
          + (f", exit {doc['exit_code']}" if doc["exit_code"] is not None else ""))
    print(f"read {human_bytes(doc['bytes'])} in {doc['io_span_s']:.2f} s of reading: {doc['loader_gbps']:.2f} GB/s; "
          f"peak RSS {human_bytes(doc['peak_rss_bytes'])}; CPU {doc['cpu_s']:.2f} s; major faults {doc['majflt']}")
    if doc["marks"]:
        print("marks: " + ", ".join(f"{m['stage']} at {m['t']:.2f} s" for m in doc["marks"]))
    print("phases: " + " → ".join(f"{p['phase']} {p['t1'] - p['t0']:.2f} s" for p in doc["phases"]))
    for path, size in sorted(doc["files"].items())[:10]:
        print(f"  open: {path} ({human_bytes(size)})")
    v = doc.get("verdict")
    if v:
        print(f"verdict: {v['kind']}: {v['summary']}")
        print(f"fix: {v['fix']}")


def cmd_watch(args) -> int:
    from ckptbench import verdict, watch

    pid, proc, marks = _target(args)
    if args.results:
        from ckptbench.results import check_writable

        check_writable(args.results, kind="watch")  # before the job is watched: nothing fails after it
    if args.tui:
        from tui.watch_app import WatchApp  # the UI loads only here

        try:
            WatchApp(pid, proc=proc, marks=marks, interval=args.interval).run()
        finally:
            if marks:
                os.unlink(marks)
        return 0
    cancel = threading.Event()
    w = watch.Watch(pid, interval=args.interval, cancel=cancel, proc=proc, marks_path=marks,
                    on_interval=None if args.json else _live)
    try:
        report = w.run()
    except KeyboardInterrupt:
        cancel.set()
        raise Cancelled("watch interrupted") from None
    finally:
        if marks:
            os.unlink(marks)
        if not args.json and sys.stderr.isatty():
            print(file=sys.stderr)
    doc = report.to_json()
    if not args.no_verdict:
        probe = verdict.probe_storage(sorted(report.files))
        doc["storage"] = {"gbps": probe.gbps, "cache": probe.cache, "files": probe.files, "bytes": probe.bytes}
        doc["verdict"] = verdict.judge(report, probe).to_json()
    if args.results:
        import uuid

        from ckptbench import env as envmod
        from ckptbench import watch_results

        watch_results.record(args.results, uuid.uuid4().hex[:12], doc,
                             envmod.snapshot(watch_results.source_of(sorted(report.files)) or None))
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        _print(doc)
    return 0 if report.exit_code in (None, 0) else 1
