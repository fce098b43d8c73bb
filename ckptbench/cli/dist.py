"""`run --distributed`: the handler every rank runs under torchrun; rank 0 prints and records the result."""

from __future__ import annotations

import json
import sys

from ckptbench.cli.show import digests_line, print_floor, print_recorded, say
from ckptbench.core.stages import STAGES
from ckptbench.core.units import human_bytes, human_pct


def _emit(doc: dict, as_json: bool, printer) -> None:
    """Rank 0's result on stdout, flushed before the other ranks are let go (torchrun may stop it after)."""
    if as_json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        printer(doc)
    sys.stdout.flush()


def print_dist(doc: dict) -> None:
    o = doc["options"]
    say(f"{doc['source']} ({doc['format']}): distributed restore on {doc['world_size']} rank(s), "
        f"{doc['nodes']} node(s), {doc['backend']}; each rank reads {doc['each_rank']}; cache {o['cache']}, "
        f"concurrency {o['concurrency']} per rank; {len(doc['repeats'])} repeat(s)")
    from ckptbench.cli.show import print_pick

    print_pick(doc.get("layout"))
    if doc["saved_world"] is not None:
        print(f"saved by {doc['saved_world']} rank(s)" + (f": resharded to {doc['world_size']}" if doc["resharded"]
                                                          else ": same world size"))
    for p in doc["problems"]:  # a rank's failure names the checkpoint's files, a remote's error a URL
        say(f"  FAILED {p}", sys.stderr)
    if "rto_stats" not in doc:
        return
    done = [r for r in doc["repeats"] if r["status"] == "ok"]
    last = done[-1]
    if len(done) > 1:  # the RTO line below is the median: an unnamed table's "end s" read as contradicting it
        print(f"  per rank, the last repeat ({len(done)} of {len(done)}; the RTO below is the median):")
    print(f"  {'rank':>4s} {'host':12s} " + " ".join(f"{s:>7s}" for s in STAGES)
          + f" {'end s':>7s} {'read GB/s':>9s} {'bytes':>10s} {'reqs':>6s}")
    for r in last["ranks"]:
        mark = "  ← slowest" if r["rank"] == last["slowest_rank"] else ""
        say(f"  {r['rank']:4d} {r['host'][:12]:12s} " + " ".join(f"{r['stages'].get(s, 0):7.3f}" for s in STAGES)
            + f" {r['end_s']:7.3f} {r['read_gbps']:9.2f} {human_bytes(r['bytes_read']):>10s} "
            f"{r['requests']:6d}{mark}")
    rto, agg, skew = doc["rto_stats"], doc["aggregate_gbps_stats"], doc["skew_stats"]
    print(f"RTO (slowest rank) {rto['median']:.3f} s (min {rto['min']:.3f}, max {rto['max']:.3f}); aggregate read "
          f"{agg['median']:.2f} GB/s; skew (last done - first done) {skew['median']:.3f} s; median of "
          f"{len([r for r in doc['repeats'] if r['status'] == 'ok'])}")
    print_floor(doc)  # the node's bytes against the slowest rank's RTO, as a single-process run says it
    say("digests: verified against the manifest on every rank" if doc["verified"] else
        digests_line(doc, _ranks_where(doc, last)))  # FAILED where a rank's digests differed, as `run` says it
    c = doc.get("cache")
    if c:
        flag = "" if c["verified"] else "  NOT VERIFIED"
        notes = f" ({'; '.join(c['notes'])})" if c["notes"] else ""
        say(f"cache {c['requested']}: residency before {_residency(c)}{flag}{notes}")
    print(f"read amplification {doc['amplification']:.2f} ({human_bytes(doc['bytes_read'])} read by all ranks / "
          f"{human_bytes(doc['unique_bytes'])} unique)")
    plan = last["read_plan"]
    files = plan["files_touched_per_rank"]
    few, many = min(files), max(files)
    print(f"read plan: {plan['requests']} request{'' if plan['requests'] == 1 else 's'}, "
          f"{human_bytes(plan['bytes_per_request'])} per request, {plan['backward_seeks']} backward seek"
          f"{'' if plan['backward_seeks'] == 1 else 's'}, {few if few == many else f'{few}–{many}'} "
          f"file{'' if many == 1 else 's'} per rank")
    if doc["resharded"]:
        print(f"resharding {doc['saved_world']} → {doc['world_size']} ranks: rows assembled from several stored "
              f"chunks in {last['assemble_s']:.3f} s on the slowest rank (inside its load stage)")
    if "dcp_reader" in doc:
        d = doc["dcp_reader"]
        print(f"torch's DCP reader, same shares: {human_bytes(d['bytes'])} in {d['requests']} requests "
              f"(amplification {d['amplification']:.2f}, {d['backward_seeks']} backward seeks): it reads every "
              "stored chunk whole for each request")
    warm = max(r.get("warmup_s", 0.0) for r in doc["repeats"][0]["ranks"])
    if warm:
        print(f"one-time warm-up before the first barrier (imports, torch's first operations): up to {warm:.2f} s "
              "per rank, not in the RTO")
    if doc.get("first_collective_s") is not None:
        print(f"first collective ({doc['backend']} all-reduce) after the restore: {doc['first_collective_s']:.3f} s, "
              "not in the RTO")
    for r in last["ranks"][:1]:
        for stage, note in r["notes"].items():
            say(f"  note ({stage}, rank 0): {note}")


def _ranks_where(doc: dict, last: dict) -> str:
    """Which ranks a digests line is about: those that failed a repeat, else those whose last repeat matched nothing
    against a reference ("on some rank" named none, and a user with 64 ranks went looking)."""
    failed = sorted({r["rank"] for rep in doc["repeats"] for r in rep["ranks"] if r["status"] != "ok"})
    ranks = failed or [r["rank"] for r in last["ranks"] if not r.get("verified")]
    if not ranks or len(ranks) == len(last["ranks"]):
        return " on every rank" if ranks else ""
    shown = ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
    return f" on rank{'s' if len(ranks) > 1 else ''} {shown}"


def _residency(c: dict) -> str:
    """The nodes' residency before the clock, as the condition asked reads it: cold holds where the most resident node
    is nearly empty, hot where the least resident one is nearly full ("≤ 100 %" said nothing of a hot run)."""
    hi = c["residency_before"]
    lo = c.get("residency_before_min", hi)
    if c["requested"] == "hot":
        return f"≥ {human_pct(lo)} on every node"
    if c["requested"] == "cold":
        return f"≤ {human_pct(hi)} on every node"
    return human_pct(hi) if lo == hi else f"{human_pct(lo)}–{human_pct(hi)} across the nodes"


class RanksLine:
    """Rank 0's live line on a terminal: how many ranks are in each stage, then the shared progress line over the
    ranks' shares (the clock: since the repeat's start barrier), and the rank furthest behind."""

    ORDER = ("ready", "list", "read", "verify", "load", "device", "check", "done", "failed")

    def __init__(self, stream=None):
        from ckptbench.core.progress import ProgressLine

        self.line = ProgressLine(stream or sys.stderr)

    def __call__(self, repeat: int, s) -> None:
        if not self.line.live:
            return
        counts = " ".join(f"{k} {s.stages[k]}" for k in self.ORDER if s.stages.get(k))
        behind = f"; behind: rank {s.behind} at {human_pct(s.behind_fraction)}" if s.behind is not None else ""
        self.line.progress(s.bytes, s.needed or None, s.seconds, head=f"[{repeat}] ranks: {counts} | ", tail=behind)

    def close(self) -> None:
        self.line.close()


def _stopped_line(doc: dict, results: str | None, word: str) -> str:
    """What an interrupted distributed run kept, in one line (the stopped doc's `interrupted`)."""
    s = doc["interrupted"]
    where = (f"during repeat {s['repeat']} of {s['repeats']}" if s["repeat"] else
             f"after repeat {s['finished']} of {s['repeats']}" if s["finished"] < s["repeats"] else
             f"after its {s['repeats']} repeat(s), before its result was out")
    done = f"{s['finished']} repeat(s) finished"
    if not results:
        return f"ckptbench: {word} {where}: {done}, not recorded (no --results)"
    kept = (f"recorded in {results} as run {doc['run_id']}" + (" (the one under way as cancelled)" if s["repeat"]
                                                               else "") + f"; `ckptbench history {results}` lists it")
    return f"ckptbench: {word} {where}: {done}, {kept}"


def cmd_run_distributed(args) -> int:
    import uuid

    from ckptbench.cli.root import Terminated
    from ckptbench.cli.settings import run_options
    from ckptbench.records import results
    from ckptbench.distributed.driver import DistOptions, run

    from ckptbench.distributed.group import rank_of_env

    opts = run_options(args)
    rank0 = rank_of_env() == 0  # as the group reads RANK: "00" is rank 0 too, which checks --results and speaks
    if args.results and rank0:
        results.check_writable(args.results)
    run_id = uuid.uuid4().hex[:12]  # only rank 0 records, so only its id matters

    def text(doc: dict) -> None:
        print_dist(doc)
        print_recorded(args.results, doc["run_id"])  # where it went on record, as a single-process run says

    def deliver(doc: dict) -> None:
        if args.results:
            from ckptbench.distributed.summary import record

            record(args.results, doc, opts)
        if not doc.get("interrupted"):  # an interrupted run is said in one line, once the ranks are let go
            _emit(doc, args.json, text)

    line = RanksLine() if rank0 else None

    def deliver_after_line(doc: dict) -> None:
        if line is not None:
            line.close()
        deliver(doc)

    dopts = DistOptions(args.each_rank, args.rank_timeout, args.tensor_digests, args.pick)
    try:
        out = run(args.source, opts, dopts, args.repeat, run_id=run_id, deliver=deliver_after_line,
                  show=line if line is not None and line.line.live else None)
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM where driver.run does not keep repeats (joining, leaving)
        if rank0:
            raise  # said once, by main(), for the run
        # another rank: rank 0 says it for the run (CI once had rank 1's bare 'interrupted' beside rank 0's line)
        return 143 if isinstance(exc, Terminated) else 130
    if out.stopped is not None:  # kept, as a single-process run keeps its finished repeats
        if out.doc is None:  # another rank: rank 0 says it; this one exits as driver.run says
            return out.rc
        if line is not None:
            line.close()
        term = isinstance(out.stopped, Terminated)
        say(_stopped_line(out.doc, args.results, "terminated" if term else "interrupted"), sys.stderr)
        return 143 if term else 130  # as main() says an interrupted or terminated single-process run
    if out.doc is None:  # another rank: rank 0 reports the run; this rank's own failure goes on its stderr
        for line in out.errors:
            say(f"ckptbench: {line} (the run's result is rank 0's)", sys.stderr)
        return out.rc
    # an unverified restore finished, as a single-process one does (its NOT VERIFIED is in the document)
    return 0 if out.doc["status"] in ("ok", "unverified") else out.rc or 1


def print_sweep(doc: dict) -> None:
    say(f"{doc['source']}: aggregate read rate of {doc['world_size']} rank(s) by per-rank concurrency (cache "
        f"{doc['cache']}; each rank reads {doc['each_rank']}; median of {doc['repeats']})")
    for p in doc["problems"]:
        say(f"  FAILED {p}", sys.stderr)
    if "knee" not in doc:
        return
    best = doc["aggregate_gbps"][str(doc["best"])]["median"]
    effs = doc.get("efficiency_by_level") or {}
    print(f"  {'level':>6s} {'GB/s':>7s} {'min':>7s} {'max':>7s} {'RTO s':>7s}  of best  of floor")
    for lv in doc["levels"]:
        g, rto = doc["aggregate_gbps"][str(lv)], doc["rto_s"][str(lv)]
        mark = "  ← knee" if lv == doc["knee"] else ""
        eff = effs.get(str(lv))
        print(f"  {lv:6d} {g['median']:7.2f} {g['min']:7.2f} {g['max']:7.2f} {rto['median']:7.3f}  "
              f"{human_pct(g['median'] / best):>6s}  {human_pct(eff) if eff is not None else '—':>8s}{mark}")
    print_floor(doc)  # the fastest level's RTO against the floor, in a run's words
    print(f"knee: {doc['knee']} per rank (smallest level within {human_pct(doc['margin'])} of the best, "
          f"{doc['best']}); recommendation: {doc['recommendation']}")


def cmd_sweep_distributed(args) -> int:
    from ckptbench.cli.settings import run_options
    from ckptbench.distributed.driver import DistOptions, sweep
    from ckptbench.restore.sweep import parse_levels

    levels = parse_levels(args.levels)
    opts = run_options(args, concurrency=levels[0])
    from ckptbench.distributed.group import rank_of_env

    if args.results and rank_of_env() == 0:
        from ckptbench.records import results

        results.check_writable(args.results)

    def deliver(doc: dict) -> None:
        if args.results and "knee" in doc:  # as a single-process sweep records it: `check --results` advises from it
            from ckptbench.restore.sweep import measured_knee, record_knee

            medians = {int(lv): st["median"] for lv, st in doc["aggregate_gbps"].items()}
            record_knee(args.results, measured_knee(doc["source"], medians,
                                                    f"{doc['world_size']}-rank distributed sweep"))
        _emit(doc, args.json, print_sweep)

    def level_done(level: int, gbps: float) -> None:
        if sys.stderr.isatty():
            print(f"  concurrency {level:4d} per rank: {gbps:.2f} GB/s aggregate", file=sys.stderr)

    out = sweep(args.source, opts, DistOptions(args.each_rank, args.rank_timeout, pick=args.pick), levels, args.repeat,
                deliver=deliver, say=level_done)
    for line in ([] if out.doc is not None else out.errors):
        say(f"ckptbench: {line} (the run's result is rank 0's)", sys.stderr)
    return out.rc
