"""Peers benchmark: ckptbench's restore against the loaders users pick instead (safetensors load_file,
fastsafetensors, Run:ai Model Streamer), cold and hot, on one foreign safetensors checkpoint.

Every measurement is a fresh process: `ckptbench run DIR --json --repeat 1 --cache cold|hot` with its defaults, or
bench/_loaders.py for a peer. Prints a Markdown report to stdout (progress goes to stderr) and writes
bench/out/peers_bench-<date>.{md,json}. Exit status 0 even when a target is missed (it is a report); 2 when the
checkpoint cannot be made or a peer package is missing. Here: the arguments and the run; the rounds, what is read
from the children, and the report are in bench/_peers_*.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import _floor_agree
import _floor_bench
import _foreign
import _harness
import _loaders
from _floor_c import LAND_C, compile_c
from _harness import GiB, OUT_DIR, ROOT, cache_dir, judge, log, machine, missing, utc_now, write_outputs
from _peers_report import report, targets
from _peers_rounds import Bench


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=None, help="checkpoint size (default 4; 0.25 with --quick)")
    ap.add_argument("--dir", default=None, help="where the checkpoint lives (generated once, reused while its index "
                    "matches); default $XDG_CACHE_HOME or ~/.cache + /ckptbench/bench-peers-SIZEg")
    ap.add_argument("--repeat", type=int, default=None, help="rounds (default 5; 1 with --quick)")
    ap.add_argument("--peers", default=",".join(_loaders.LOADERS), help="comma-separated peers (default all: "
                    + ", ".join(_loaders.LOADERS) + ")")
    ap.add_argument("--floor-runs", type=int, default=None, help="`ckptbench floor` runs for the floor's spread and "
                    "wall time, before fio and the C loop check it (default 5; 2 with --quick; 0 skips the checks)")
    ap.add_argument("--settle", type=float, default=None, help="seconds every timed run and every measurement of "
                    "fresh memory waits after the last free, so that a VM's host has taken the freed memory back for "
                    "every contender alike (default 10; 0 with --quick)")
    ap.add_argument("--no-pair", dest="pair", action="store_false", help="no probe of fresh memory before each repeat "
                    "(about 12 s each with the settle): the rows are held to the floor measured once")
    ap.add_argument("--quick", action="store_true", help="a 256 MiB checkpoint, 1 round")
    args = ap.parse_args(argv)
    args.size_gib = args.size_gib if args.size_gib is not None else (0.25 if args.quick else 4.0)
    args.repeat = args.repeat if args.repeat is not None else (1 if args.quick else 5)
    args.floor_runs = args.floor_runs if args.floor_runs is not None else (2 if args.quick else 5)
    args.settle = args.settle if args.settle is not None else (0.0 if args.quick else _harness.SETTLE_DEFAULT_S)
    args.peers = [p for p in args.peers.split(",") if p]
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if args.size_gib <= 0:
        ap.error("--size-gib must be positive")
    unknown = [p for p in args.peers if p not in _loaders.LOADERS]
    if unknown:
        ap.error(f"unknown peer(s) {', '.join(unknown)}: choose from {', '.join(_loaders.LOADERS)}")
    args.dir = args.dir or cache_dir(f"bench-peers-{args.size_gib:g}g")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _harness.SETTLE_S = args.settle
    modules = {"safetensors": "safetensors", "fastsafetensors": "fastsafetensors", "runai": "runai_model_streamer"}
    problem = missing("peers_bench", modules=("fastio", "torch", *(modules[p] for p in args.peers)),
                      install="pip install -c constraints.txt -e '.[bench]'")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    meta, problem = _foreign.ensure_checkpoint(args.dir, _foreign.layout(int(args.size_gib * GiB)))
    if meta is None:
        print(problem, file=sys.stderr)
        return 2
    date = utc_now()
    stamp = time.strftime("%Y-%m-%dT%H%M%SZ", time.gmtime())
    os.makedirs(OUT_DIR, exist_ok=True)
    results = os.path.join(OUT_DIR, f"peers_bench-{stamp}-results.csv")
    b = Bench(args.dir, meta, args.repeat, args.peers, results, pair=args.pair)
    t0 = time.monotonic()
    agree, agree_record = [], {}
    with tempfile.TemporaryDirectory(prefix="ckptbench-peers-floor-") as floor_cache:
        log("this box's floor, measured on the set's files")
        paths_sizes = [(p, os.path.getsize(p)) for p in b.files]
        b.floor = _floor_bench.measure(paths_sizes, args.dir, floor_cache)
        b.floors = _floor_bench.models(b.floor, b.total, meta["total_size"])  # every tensor of the set is floating
        if args.floor_runs:
            agree, agree_record, others = _floor_agree.agreement(b.floor, paths_sizes, args.dir, args.floor_runs,
                                                                 floor_cache, _floor_agree.pop_bytes())
            # the rows are held to the median of this run's floors: the one above and the `floor` runs'
            b.floors = _floor_bench.median_models([b.floor, *others], b.total, meta["total_size"])
    with tempfile.TemporaryDirectory(prefix="ckptbench-peers-c-") as tmp:
        b.c_loop = compile_c(tmp, LAND_C, "land")
        for i in range(args.repeat):
            log(f"round {i + 1} of {args.repeat}")
            b.round(i)
    elapsed = time.monotonic() - t0
    log(f"done in {elapsed:.0f} s")
    said, c_agree = _floor_bench.c_loop_lines(b.series, b.floors)
    agree += c_agree
    met = _floor_bench.as_met(b.floors, b.runs, b.total)
    verdicts = _floor_bench.targets(b.series, b.floors, args.peers) + said + _floor_bench.met_lines(b.series, met,
                                                                                                    args.peers)
    verdicts += _floor_bench.serial_lines(b.series, b.floor, b.floors.get("cold", {}).get("bytes_read") or b.total,
                                          args.peers)
    verdicts += [judge(t, b.series) for t in targets(b.series, args.peers)]
    print(report(b, verdicts, args, date, agree=agree), end="")
    facts = machine(args.dir) | {"peer_versions": _loaders.versions()}
    record = {"date": date, "elapsed_s": elapsed, "machine": facts, "args": vars(args),
              "checkpoint": {"dir": args.dir, "files": len(b.files), "bytes": b.total, "tensor_bytes": meta["total_size"],
                             **meta["ckptbench_peers"]},
              "measurements": [s.as_dict() | {"floor": _floor_bench.row_model(s.key), "efficiency":
                               _floor_bench.efficiency(b.floors, s.key, s.median),
                               "paired": _floor_bench.paired(b.floors, s)} for s in b.series.values()],
              "targets": verdicts, "floor": b.floor.to_json() | {"models": b.floors, "as_met": met},
              "floor_agreement": agree_record | {"verdicts": agree},
              "ckptbench_runs": b.runs, "read_command": b.read_cmd, "other_work_core_s": b.other.share()[0],
              "results_csv": results, "root": ROOT}
    write_outputs(f"peers_bench-{stamp}", report(b, verdicts, args, date, facts, agree=agree), record)
    log(f"wrote {OUT_DIR}/peers_bench-{stamp}.md and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
