"""Handlers of the plain commands (read, inspect, plan, check, gen, verify, load, pack, unpack, upload, demo, tui,
sysinfo), called by cli.py; the timed ones (run, sweep, compare) are in cli_run.py."""

from __future__ import annotations

import json
import os
import sys
import threading

from ckptbench.core.errors import CkptbenchError


def _read_options(args):
    from ckptbench.sources import ReadOptions

    return ReadOptions(concurrency=args.concurrency, read=args.read, hash=args.hash, block_size=args.block_size,
                       chunk_size=args.chunk_size, multipart=args.multipart, part_size=args.part_size,
                       s3_client=args.s3_client)


def _print_summary(report) -> None:
    from ckptbench.core.progress import fmt_us
    from ckptbench.core.units import human_bytes

    r = report.result
    c = report.cache
    d = report.driven
    print(f"read {human_bytes(r.bytes)} in {len(r.files)} files: {d.wall_s:.3f} s, {d.read_gbps:.2f} GB/s "
          f"({r.read}, {r.hash}, concurrency {r.concurrency}, block {human_bytes(r.block_size)}); the reader alone "
          f"{d.engine_gbps:.2f} GB/s from first open to last byte")
    print(f"read path: {r.read} ({report.read_why})")
    print(f"cache {c.requested}: residency before {c.residency_before:.1%}"
          f"{'' if c.residency_after is None else f', after {c.residency_after:.1%}'}"
          f"{'' if c.verified else '  [' + c.note + ']'}")
    print(f"read latency p50 {fmt_us(r.final.latency_us(0.5))}, p99 {fmt_us(r.final.latency_us(0.99))}; "
          f"retries {r.retries}; failed files {len(r.failed)}")
    for f in r.failed[:20]:
        print(f"  failed: {f.path}: {f.error.message} (errno {f.error.errno})", file=sys.stderr)
    if len(r.failed) > 20:
        print(f"  ... and {len(r.failed) - 20} more failed files", file=sys.stderr)
    for d, why in report.skipped:
        print(f"  failed: {d}: directory not readable ({why}); its files were not read", file=sys.stderr)


def cmd_inspect(args) -> int:
    from ckptbench.checkpoint.formats.inert import describe
    from ckptbench.restore.inspect import inspect
    from ckptbench.sources import open_source
    from ckptbench.core.units import human_bytes

    doc = inspect(open_source(args.source, args.pick), concurrency=args.concurrency, tensors=args.tensors)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    lay, plan = doc["layout"], doc["read_plan"]
    ranks = f"{lay['ranks']} rank(s), " if lay["ranks"] else ""
    layout = (f" ({lay['name']}{', step ' + lay['tag'] if lay['tag'] else ''})"
              if lay["name"] not in ("files", doc["format"]) else "")
    if lay["why"]:
        print(f"picked {lay['root'] or 'the files at the top'}: {lay['why']}")
    print(f"{doc['source']}: {doc['format']}{layout}, {ranks}{lay['shards']} shard file(s), tail of {lay['tail_files']} "
          f"small file(s) ({human_bytes(lay['tail_bytes'])}), {'a' if lay['manifest'] else 'no'} manifest")
    print(f"  {'group':10s} {'tensors':>8s} {'params':>14s} {'bytes':>11s}  dtypes")
    for name, g in doc["groups"].items():
        dts = ", ".join(f"{d} {human_bytes(b)}" for d, b in g["dtypes"].items())
        print(f"  {name:10s} {g['tensors']:8d} {g['params']:14,d} {human_bytes(g['bytes']):>11s}  {dts}")
    if lay["other_entries"]:
        print(f"  and {lay['other_entries']} non-tensor entries (scalars, configs, byte entries)")
    for note in lay["notes"]:
        print(f"  note: {note}")
    for skip in lay["not_read"]:
        print(f"  not read: {skip['path']} ({skip['why']})")
    for u in lay["unloaded"]:
        print(f"  read, not loaded: {u['path']} ({u['why']})")
    if lay["kept_as_data"]:
        print(f"  {describe(lay['kept_as_data'])}")
    if args.tensors is not None:
        rows = doc["tensors"]
        print(f"tensors{'' if args.tensors == '*' else ' matching ' + repr(args.tensors)}: {len(rows)}")
        width = min(60, max((len(t["name"]) for t in rows), default=4))
        for t in rows:
            shape = "×".join(map(str, t["shape"])) or "scalar"
            print(f"  {t['name']:{width}s} {t['dtype']:9s} {shape:>16s} {human_bytes(t['bytes']):>10s}  {t['group']:9s} "
                  f"{t['file']}")
    amp = f"{plan['amplification']:.3f}×" if plan["amplification"] else "n/a"
    print(f"read plan: {plan['files']} files, {human_bytes(plan['bytes'])}, largest {plan['largest_file']['path']} "
          f"({human_bytes(plan['largest_file']['bytes'])}); read amplification {amp} (file bytes per tensor byte)")
    print(f"read path: {plan['read']} ({plan['read_why']})")
    print(f"check: {doc['check']}")
    return 0


def cmd_read(args) -> int:
    from ckptbench.core.progress import ProgressLine
    from ckptbench.restore.reading import read_source
    from ckptbench.sources import open_targets

    opts = _read_options(args)
    source = open_targets(args.targets, args.pick)
    listing = source.list()
    lay = listing.layout.describe() if listing.layout is not None else None
    line = ProgressLine(sys.stderr)
    cancel = threading.Event()
    try:
        report = read_source(source, listing, opts, cache=args.cache, drop_caches=args.drop_caches, on_progress=line,
                             cancel=cancel)
    except KeyboardInterrupt:
        cancel.set()
        raise
    finally:
        line.close()
    if args.json:
        _emit(report.to_json() | {"layout": lay})
    else:
        from ckptbench.cli.show import print_pick

        print_pick(lay, verb="read")
        _print_summary(report)
    return 0 if report.ok else 1


def _emit(doc: dict) -> None:
    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _profile(name: str, scale: float):
    from ckptbench.checkpoint import profiles

    p = profiles.load(name)
    return p if scale == 1.0 else p.scaled(scale)


def cmd_plan(args) -> int:
    from ckptbench.plan.shape import plan
    from ckptbench.core.units import human_bytes

    if args.nodes is None and (args.storage or args.ranks_per_node):
        raise CkptbenchError("--storage and --ranks-per-node plan a multi-node restore: add --nodes N")
    if args.nodes is not None:
        return _plan_nodes(args)
    measured = None
    if args.interval:
        from ckptbench.plan.shape import measured_save

        measured = measured_save(args.results, args.target)
    doc = plan(_profile(args.profile, args.scale), args.interval, measured)
    if args.json:
        _emit(doc)
        return 0
    d = doc["dims"]
    print(f"{doc['profile']}: {doc['params'] / 1e9:.3f} B parameters ({d['layers']} layers, hidden {d['hidden']}, "
          f"{d['heads']} heads, vocab {d['vocab']}), {doc['world_size']} ranks")
    for part, n in doc["bytes"].items():
        print(f"  {part:22s} {human_bytes(n):>12s}")
    print(f"  {'total':22s} {human_bytes(doc['total_bytes']):>12s} in {doc['files']} files "
          f"(average {human_bytes(doc['avg_file_bytes'])})")
    mem = doc["restore_memory"]
    print(f"restore memory: {human_bytes(mem['held_bytes'])} held by model and optimizer; peak "
          f"{human_bytes(mem['peak_bytes_full_read'])} when a shard is read whole before deserializing, "
          f"{human_bytes(mem['peak_bytes_mmap_or_safetensors'])} with mmap/safetensors; "
          f"{human_bytes(mem['per_rank_bytes'])} per rank")
    if "save" in doc:
        s = doc["save"]
        print(f"saving every {s['interval_s']:g} s needs {s['required_gbps']:.2f} GB/s sustained "
              f"({s['per_rank_gbps']:.3f} GB/s per rank)")
        m = s.get("measured")
        if m:
            print(f"measured: {m['sustained_gbps']:.3f} GB/s sustained to {m['target']} (save run {m['run_id']}, "
                  f"{m['date']}): a save takes about {m['durable_s_estimate']:.1f} s, so the shortest safe interval "
                  f"is {m['shortest_safe_interval_s']:.1f} s: {'met' if m['meets_interval'] else 'NOT met'}")
        else:
            print(f"no save measured{' to ' + args.target if args.target else ''} in {args.results}: "
                  "run `ckptbench save` to the target for a measured verdict")
    return 0


def _plan_nodes(args) -> int:
    from ckptbench.plan import scale as plan_scale

    if not args.storage:
        raise CkptbenchError("--nodes needs --storage PRESET (efs, fsx-lustre, s3, local-nvme, ...): the ceilings "
                             "come from it")
    if args.interval:
        raise CkptbenchError("--interval plans saves and --nodes plans a restore: run plan once for each")
    preset = plan_scale.load_preset(args.storage)
    doc = plan_scale.scale(_profile(args.profile, args.scale), args.nodes, args.ranks_per_node or 8, preset,
                           plan_scale.measured_rank_read(args.results))
    if args.json:
        _emit(doc)
    else:
        print("\n".join(plan_scale.text(doc)))
    return 0


def cmd_check(args) -> int:
    from ckptbench.checklist.rules import evaluate, markdown, report
    from ckptbench.checklist.facts import gather

    facts = gather(args.source, concurrency=args.concurrency, quick_sweep=args.quick_sweep, results=args.results)
    doc = report(args.source, evaluate(facts))
    if args.json:
        _emit(doc)
    elif args.markdown:
        sys.stdout.write(markdown(doc))
    else:
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "unknown": " ?  "}
        for item in doc["items"]:
            print(f"[{marks[item['verdict']]}] {item['title']}")
            ev = ", ".join(f"{k}={v}" for k, v in item["evidence"].items() if not isinstance(v, (dict, list)))
            print(f"       evidence: {ev}")
            if item["verdict"] != "ok":
                print(f"       why: {item['why']}")
            print(f"       fix: {item['fix']}")
        print(" · ".join(f"{k} {v}" for k, v in doc["summary"].items()))
    return 0 if doc["ok"] else 1


def cmd_gen(args) -> int:
    from ckptbench.checkpoint.generate import generate

    profile = _profile(args.profile, args.scale)
    say = (lambda msg: print(msg, file=sys.stderr)) if sys.stderr.isatty() else None
    cancel = threading.Event()
    try:
        man = generate(profile, args.directory, fmt=args.format, ranks=args.ranks, seed=args.seed,
                       force=args.force, digest=args.digest, progress=say, cancel=cancel)
    except KeyboardInterrupt:
        cancel.set()
        raise
    total = sum(f.bytes for f in man.files)
    print(f"wrote {args.directory}: {man.format}, {man.world_size} rank(s), {len(man.files)} files, "
          f"{total / 2**20:.1f} MiB, {man.param_count / 1e6:.1f} M parameters")
    return 0


def cmd_verify(args) -> int:
    from ckptbench.checkpoint.verify import verify
    from ckptbench.cli.show import print_pick
    from ckptbench.core.errors import EXIT_UNCHECKED
    from ckptbench.restore.load import require_dir
    from ckptbench.sources.local import LocalSource

    require_dir(args.directory)
    listing = LocalSource(args.directory, checkpoint=True, pick=args.pick).list()
    rep = verify(listing, concurrency=args.concurrency)
    lay = listing.layout.describe() if listing.layout is not None else None
    if args.json:
        _emit({"ok": rep.ok, "verified": rep.verified, "has_reference": rep.has_reference, "source": rep.source,
               "why": rep.why, "layout": lay, "files": rep.files, "bytes": rep.bytes,
               "problems": [{"path": p, "problem": w} for p, w in rep.problems], "digests": rep.digests,
               "unlisted": list(rep.unlisted)})
    else:
        print_pick(lay, verb="checking")
        if not rep.has_reference:
            print(f"{rep.source}: no manifest with digests, so no reference: {rep.files} files read and their "
                  "digests computed, nothing checked against them")
        if rep.unlisted:
            print(f"{rep.source}: {len(rep.unlisted)} file(s) not in the manifest, so not verified (first "
                  f"{rep.unlisted[0]})")
        for rel, what in rep.problems:
            print(f"  {rel}: {what}", file=sys.stderr)
        word = "MISMATCH" if not rep.ok else "OK" if rep.verified else "NOT VERIFIED"
        print(f"{word}: {rep.files} files, {rep.bytes / 2**20:.1f} MiB, {len(rep.problems)} problem(s)")
    return 1 if not rep.ok else 0 if rep.verified else EXIT_UNCHECKED


def cmd_load(args) -> int:
    from ckptbench.cli.show import print_pick
    from ckptbench.restore.load import restore_dir

    out = restore_dir(args.directory, verify=not args.no_verify, optimizer_step=args.optimizer_step, pick=args.pick)
    c = out.check
    if args.json:
        _emit({"source": out.source, "format": out.format, "ok": c.ok, "param_count": c.param_count,
               "dtypes": c.dtypes, "finite_output": c.finite_output, "optimizer_step": c.optimizer_step,
               "problems": list(c.problems), "structural_only": c.structural_only, "summary": c.summary,
               "tail_files": out.tail_files,
               "layout": out.layout.describe() if out.layout is not None else None,
               "verified": None if out.verify is None else out.verify.verified})
    else:
        print_pick(out.layout.describe() if out.layout is not None else None)
        ref = "" if out.verify is None or out.verify.has_reference else " (no manifest: digests had no reference)"
        if out.verify is not None and out.verify.unlisted:
            ref = (f" ({len(out.verify.unlisted)} file(s) not in the manifest, so not verified: "
                   f"{out.verify.unlisted[0]})")
        kind = "structural check" if c.structural_only else "check"
        print(f"{out.format}: {c.param_count / 1e6:.2f} M parameters {c.dtypes['weights']}, {out.tail_files} small "
              f"files; {kind} {'passed' if c.ok else 'FAILED'}{ref}")
        if c.summary:
            print(f"  {c.summary}")
        for p in c.problems:
            print(f"  {p}", file=sys.stderr)
    return 0 if c.ok else 1


def cmd_pack(args) -> int:
    from ckptbench.checkpoint.packs import pack

    man = pack(args.directory, args.out, args.target_files)
    members = sum(len(i) for i in man.packs.values())
    print(f"packed {members} small files into {len(man.packs)} pack file(s) in {args.out}")
    return 0


def cmd_unpack(args) -> int:
    from ckptbench.checkpoint.packs import unpack

    man = unpack(args.directory, args.out)
    print(f"unpacked {len(man.files)} files into {args.out}")
    return 0


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ckptbench")


def _ensure_dir(path: str, what: str) -> None:
    """Creates a directory ckptbench owns (the cache), with its parents; one line when it cannot."""
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise CkptbenchError(f"{path}: cannot create the {what} ({exc.strerror}); set XDG_CACHE_HOME or "
                             "pass --dir to a writable place") from None


def cmd_demo(args) -> int:
    from ckptbench.checkpoint.generate import generate

    if args.s3:
        try:
            import moto  # noqa: F401
        except ImportError:
            raise CkptbenchError("demo --s3 needs the local S3 server, which is an extra: "
                                 "pip install 'ckptbench[s3-demo]'") from None
    directory = args.dir or os.path.join(_cache_dir(), "demo-small")
    if not os.path.isfile(os.path.join(directory, "ckptbench.json")):
        if os.path.isdir(directory) and os.listdir(directory):  # replacing it would delete what the user keeps there
            raise CkptbenchError(f"{directory}: not empty and not the sample (no ckptbench.json); demo writes its "
                                 "sample only into a new or empty directory: choose another --dir")
        _ensure_dir(os.path.dirname(os.path.abspath(directory)), "cache directory")
        print(f"generating the small sample checkpoint in {directory} (once)…", file=sys.stderr)
        generate(_profile("small", args.scale), directory, force=True,
                 progress=(lambda m: print(f"  {m}", file=sys.stderr)))
    if args.s3:
        from ckptbench.testing.s3local import local_s3
        from ckptbench.sources import s3

        with local_s3(latency_s=0.020) as server:
            os.environ.update(server.env)  # this process only: the clients read the standard AWS variables
            bucket = server.make_bucket("ckptbench-demo")
            print(f"local S3 at {server.endpoint_url}; uploading the sample to s3://{bucket}/small", file=sys.stderr)
            s3.upload(directory, s3.parse(f"s3://{bucket}/small"))
            return _demo_restore(args, f"s3://{bucket}/small", os.path.dirname(os.path.abspath(directory)))
    return _demo_restore(args, directory, os.path.dirname(os.path.abspath(directory)))


def _demo_restore(args, source: str, results_dir: str) -> int:
    results = os.path.join(results_dir, "demo-results.csv")
    if args.headless or not sys.stdout.isatty():
        from ckptbench.cli import run as cli_run

        argv = ["run", source, "--repeat", "1", "--results", results, "--cache", "cold"]
        return cli_run.cmd_run(args.reparse(argv))
    from ckptbench.cli.ui import run_app
    from ckptbench.restore.runner import RunOptions

    # cold, as after a reclaim: the sample was just written, so a restore "as-is" would read the page cache
    return run_app("dashboard", source, RunOptions(cache="cold"), results_path=results, autostart=True)


def cmd_upload(args) -> int:
    from ckptbench.sources import s3

    url = s3.parse(args.url)
    if args.part_size < 5 << 20:
        raise CkptbenchError(f"--part-size {args.part_size}: S3 multipart parts are at least 5 MiB")
    say = (lambda rel: print(f"  {rel}", file=sys.stderr)) if sys.stderr.isatty() else None
    done = s3.upload(args.directory, url, concurrency=args.concurrency, part_size=args.part_size, progress=say)
    print(f"uploaded {len(done)} files to {url}")
    return 0


def cmd_tui(args) -> int:
    from ckptbench.cli.ui import run_app

    if args.watch is not None:
        from ckptbench.system import procstat

        procstat.sample(args.watch)  # gone or unreadable: one line now, not inside the UI
        return run_app("watch", args.watch)
    if args.source is not None:
        from ckptbench.sources import open_source

        open_source(args.source)  # a bad path is one line here, not an error inside the UI
    ranks = None
    if args.ranks:
        from ckptbench.distributed.history import newest_dist_run

        ranks = newest_dist_run(args.results)  # none on record: one line here, not an empty screen
    return run_app("dashboard", args.source, results_path=args.results,
                   autostart="loop" if args.loop else args.run, ranks=ranks)


def cmd_sysinfo(args) -> int:
    from ckptbench.sources import source_summary
    from ckptbench.system.live import SystemSampler

    from ckptbench.sources import open_source

    open_source(args.source)
    sampler = SystemSampler(args.source)
    sampler.sample()
    import time

    time.sleep(0.5)  # rates need two samples
    doc = source_summary(args.source) | sampler.sample()
    if args.json:
        _emit(doc)
    else:
        for k, v in doc.items():
            print(f"{k:24s} {v}")
    return 0


def cmd_floor(args) -> int:
    from ckptbench.core.units import human_bytes
    from ckptbench.system import floor as fl

    files, mount, listing = None, None, None
    if args.source:
        from ckptbench.sources import open_source

        source = open_source(args.source, args.pick)
        listing = source.list()
        if not source.files_on_disk:
            raise CkptbenchError(f"{listing.source}: the floor reads a checkpoint's own files from a mount; for S3, "
                                 "measure the box without SOURCE (the link's figure is not measured yet)")
        files = [(f.path, f.size or 0) for f in listing.files]
        mount = fl.mount_key(source.describe())
    f = fl.measure(files, mount, remeasure=args.remeasure)
    doc = f.to_json()
    if listing is not None:
        man = listing.manifest
        hash_alg = man.hash if man is not None else "none"  # what a restore computes: the manifest's digest, or none
        doc["restore"] = {"source": listing.source, "bytes": listing.bytes, "hash": hash_alg,
                          **fl.model(f, bytes_read=listing.bytes, floating_bytes=listing.bytes, hash_alg=hash_alg)}
    if args.json:
        _emit(doc)
        return 0
    print(f"this box: {doc['box']['cores']} cores, {human_bytes(doc['box']['memory'])}, kernel {doc['box']['kernel']}"
          f"{' (cached figures)' if f.cached else ''}")
    rows = list(f.ceilings.items()) + ([("storage", f.storage)] if f.storage else [])
    for name, c in rows:
        print(f"  {name:14s} {c.gbps:7.2f} GB/s  ({c.min_gbps:.2f}..{c.max_gbps:.2f}, {c.age_s:5.0f} s old)  {c.method}")
    for note in f.notes:
        print(f"  note: {note}")
    r = doc.get("restore")
    if r and r["floor_s"] is not None:
        parts = ", ".join(f"{k} {v:.3f} s" for k, v in r["times_s"].items())
        print(f"restore of {r['source']} ({human_bytes(r['bytes'])}): floor {r['floor_s']:.3f} s, bound by "
              f"{r['binding']} ({parts})")
    return 0
