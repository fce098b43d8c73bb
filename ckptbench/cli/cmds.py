"""Handlers of the plain commands (read, plan, check, gen, pack, unpack, upload, demo, tui,
sysinfo), called by cli.py; the timed ones (run, sweep, compare) are in cli_run.py."""

from __future__ import annotations

import os
import sys
import threading
import time

from ckptbench.cli.show import emit as _emit, say
from ckptbench.core.errors import CkptbenchError, write_refused_exit


def _print_summary(report) -> None:
    from ckptbench.core.progress import fmt_us
    from ckptbench.core.units import human_bytes, human_pct

    r = report.result
    c = report.cache
    d = report.driven
    files = f"{len(r.files)} file{'' if len(r.files) == 1 else 's'}"  # "in 1 files" read as a typo
    print(f"read {human_bytes(r.bytes)} in {files}: {d.wall_s:.3f} s, {d.read_gbps:.2f} GB/s "
          f"({r.read}, {r.hash}, concurrency {r.concurrency}, block {human_bytes(r.block_size)}); the reader alone "
          f"{d.engine_gbps:.2f} GB/s from first open to last byte")
    say(f"read path: {r.read} ({report.read_why})")  # a filesystem's refusal, in its words
    say(f"cache {c.requested}: residency before {human_pct(c.residency_before)}"
        f"{'' if c.residency_after is None else f', after {human_pct(c.residency_after)}'}"
        f"{'' if c.verified else '  [' + c.note + ']'}")
    print(f"read latency p50 {fmt_us(r.final.latency_us(0.5))}, p99 {fmt_us(r.final.latency_us(0.99))}; "
          f"retries {r.retries}; failed files {len(r.failed)}")
    for f in r.failed[:20]:  # an object's URL and its store's error: redacted where they carry one
        say(f"  failed: {f.path}: {f.error.message} (errno {f.error.errno})", sys.stderr)
    if len(r.failed) > 20:
        print(f"  ... and {len(r.failed) - 20} more failed files", file=sys.stderr)
    for d, why in report.skipped:
        say(f"  failed: {d}: directory not readable ({why}); its files were not read", sys.stderr)
    for p, why in report.passed[:8]:
        say(f"  not read: {p} ({why})")
    if len(report.passed) > 8:
        print(f"  not read: ... and {len(report.passed) - 8} more (--json lists them)")


TARGETS_FIX = "point at a checkpoint directory or its files"


def _check_targets(targets: list[str]) -> None:
    """read's local paths each there and each named once, said in one line before anything is read: a missing one
    was told to point at a checkpoint directory when the user had named files, and a file named twice (or inside a
    directory also named) was read twice and counted twice."""
    if any(t.startswith("s3://") for t in targets):
        return  # open_targets says what an s3:// prefix takes
    for t in targets:
        try:
            os.stat(t)
        except (FileNotFoundError, NotADirectoryError):
            what = "a symbolic link to nothing" if os.path.islink(t) else "no such file or directory"
            raise CkptbenchError(f"{t}: {what}; {TARGETS_FIX}") from None
        except OSError:
            pass  # there but not reachable: the listing says why
    real = [os.path.realpath(t) for t in targets]
    for i, (t, r) in enumerate(zip(targets, real)):
        for t0, r0 in zip(targets[:i], real[:i]):
            if r == r0:
                also = "" if t == t0 else f" (as {t0} too)"
                raise CkptbenchError(f"{t}: named twice{also}, so its bytes would be read and counted twice; "
                                     "name each file or directory once")
            common = os.path.commonpath([r, r0])
            if common in (r, r0):
                inner, outer = (t, t0) if common == r0 else (t0, t)
                raise CkptbenchError(f"{inner}: inside {outer}, also named, so its bytes would be read and counted "
                                     f"twice; name {outer} alone, or its files one by one")


class _Unnamed:
    """A read of no one checkpoint (files, several paths, a folder of none) as the floor's note names it: not at all,
    so its command keeps the SOURCE placeholder (`ckptbench floor 'a, b'` and `ckptbench floor FILE` are refused)."""

    url = None

    def __init__(self, source):
        self._source = source

    def __getattr__(self, name):
        return getattr(self._source, name)


def cmd_read(args) -> int:
    from ckptbench.core.progress import ProgressLine
    from ckptbench.restore.reading import read_source
    from ckptbench.sources import open_targets

    from ckptbench.cli.settings import check_drop_caches, check_s3_only, read_options

    check_drop_caches(args)
    opts = read_options(args)
    check_s3_only(args, args.targets)
    _check_targets(args.targets)
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
    from ckptbench.restore import efficiency

    one = len(args.targets) == 1 and listing.format != "unknown"  # one checkpoint: `floor SOURCE` takes it
    floor = efficiency.of_read(source if one else _Unnamed(source), report, opts.hash)
    if args.json:
        _emit(report.to_json() | {"layout": lay} | floor)
    else:
        from ckptbench.cli.show import print_floor, print_pick

        print_pick(lay, verb="read")
        if len(args.targets) > 1 and any(os.path.isdir(t) for t in args.targets):  # no checkpoint chosen: said, or it read as one
            say(f"read as named: every file of the {len(args.targets)} paths, no checkpoint chosen in them (what a "
                "resume loads is chosen in one checkpoint directory: name it alone)")
        _print_summary(report)
        print_floor(floor)
    return 0 if report.ok else 1


def _profile(name: str, scale: float):
    from ckptbench.checkpoint import profiles

    p = profiles.load(name)
    return p if scale == 1.0 else p.scaled(scale)


def cmd_plan(args) -> int:
    from ckptbench.plan.shape import plan
    from ckptbench.core.units import human_bytes, human_count, human_gbps

    if args.nodes is None and (args.storage or args.ranks_per_node or args.node_memory):
        raise CkptbenchError("--storage, --ranks-per-node and --node-memory plan a multi-node restore: add --nodes N")
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
    print(f"{doc['profile']}: {human_count(doc['params'])} parameters ({d['layers']} layers, hidden {d['hidden']}, "
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
        print(f"saving every {s['interval_s']:g} s needs {human_gbps(s['required_gbps'])} GB/s sustained "
              f"({human_gbps(s['per_rank_gbps'])} GB/s per rank)")
        m = s.get("measured")
        if m and m.get("size_mismatch"):
            say(f"measured: {m['sustained_gbps']:.3f} GB/s sustained to {m['target']} (save run {m['run_id']}, "
                f"{m['date']}), {m['size_mismatch']}; at that rate a save would take about "
                f"{m['durable_s_estimate']:.1f} s")
        elif m:
            size = (f"measured on a {human_bytes(m['bytes'])} save, this plan is for {human_bytes(m['planned_bytes'])}"
                    if m.get("bytes") else "the measured save's size is not recorded")
            say(f"measured: {m['sustained_gbps']:.3f} GB/s sustained to {m['target']} (save run {m['run_id']}, "
                f"{m['date']}; {size}): a save takes about {m['durable_s_estimate']:.1f} s, so the shortest safe "
                f"interval is {m['shortest_safe_interval_s']:.1f} s: {'met' if m['meets_interval'] else 'NOT met'}")
        elif s.get("measured_unknown"):  # a save on record that measured no durable throughput: why, not "no save"
            say(f"no measured verdict: {s['measured_unknown']}")
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
    from ckptbench.system import floor, storage

    preset = storage.load(args.storage)
    measured, why = plan_scale.rank_read_on(args.results, preset)
    doc = plan_scale.scale(_profile(args.profile, args.scale), args.nodes, args.ranks_per_node or 8, preset,
                           measured, memory=plan_scale.box_memory(floor.cached(), args.node_memory), unmeasured_why=why)
    if args.json:
        _emit(doc)
    else:
        print("\n".join(plan_scale.text(doc)))
    return 0


def cmd_check(args) -> int:
    from ckptbench.checklist.rules import evaluate, evidence_line, markdown, report
    from ckptbench.checklist.facts import gather

    from ckptbench.cli.box import again
    from ckptbench.cli.show import print_pick

    facts = gather(args.source, concurrency=args.concurrency, quick_sweep=args.quick_sweep, results=args.results,
                   floor=True, pick=args.pick)
    # it changed the box: said, as watch and floor say it (an object store's files leave no page cache)
    if not args.json and not args.markdown and facts.page_cache:
        # the checkpoint checked: a Trainer's output_dir named here kept its older checkpoints' pages, which the note
        # had said were gone with the rest of "/out's files"
        say(f"note: {facts.checkpoint or args.source}'s files were read cold for the checklist: they have left the "
            "page cache (a job restoring from them now reads from storage)", sys.stderr)
    lay = facts.layout
    doc = report(args.source, evaluate(facts), lay, facts.checkpoint if args.pick else None)
    if args.json:
        _emit(doc)
    elif args.markdown:  # the evidence names the checkpoint's files, its mount, an endpoint: each line clean
        for line in markdown(doc, lambda n: again(n, args)).splitlines():
            say(line)
    else:
        print_pick(lay, verb="checked")  # a folder of several checkpoints: which one the items are about
        marks = {"ok": "ok  ", "warn": "WARN", "fail": "FAIL", "unknown": " ?  "}
        for item in doc["items"]:
            say(f"[{marks[item['verdict']]}] {item['title']}")
            say(f"       evidence: {evidence_line(item['evidence'])}")
            for note in item["evidence"].get("notes") or []:  # the floor's: a busy box, a figure kept (the line
                # above leaves lists to the JSON, and a busy box's low ceilings went unsaid)
                say(f"       note: {again(note, args)}")
            if item["verdict"] != "ok":
                say(f"       why: {item['why']}")
            say(f"       fix: {item['fix']}")
        print(" · ".join(f"{k} {v}" for k, v in doc["summary"].items()))
    return 0 if doc["ok"] else 1


def cmd_gen(args) -> int:
    from ckptbench.checkpoint.generate import generate
    from ckptbench.core.units import human_bytes, human_count

    profile = _profile(args.profile, args.scale)
    tell = (lambda msg: print(msg, file=sys.stderr)) if sys.stderr.isatty() else None
    cancel = threading.Event()
    try:
        man = generate(profile, args.directory, fmt=args.format, ranks=args.ranks, seed=args.seed,
                       force=args.force, digest=args.digest, progress=tell, cancel=cancel,
                       on_reaped=lambda path: say(f"removed {path}: the staging folder of a gen that was killed "
                                                  "before it finished", sys.stderr))
    except KeyboardInterrupt:
        cancel.set()
        raise
    total = sum(f.bytes for f in man.files)
    # "+ the manifest": `run` lists every file the directory holds, the manifest (ckptbench.json) too
    print(f"wrote {args.directory}: {man.format}, {man.world_size} rank(s), {len(man.files)} files + the manifest, "
          f"{human_bytes(total)}, {human_count(man.param_count)} parameters")
    return 0


def cmd_pack(args) -> int:
    from ckptbench.checkpoint.packs import pack

    man = pack(args.directory, args.out, args.target_files)
    members = sum(len(i) for i in man.packs.values())
    kept = [e.path for e in man.files if e.kind == "small"]
    print(f"packed {members} small files into {len(man.packs)} pack file(s) in {args.out}; ckptbench run, load and "
          "verify read them from the packs, a trainer only after `ckptbench unpack`")
    if kept:  # what from_pretrained and a resume open by name: said, so nobody unpacks to find them
        print(f"kept as files, where a loader opens them by name: {len(kept)} small file(s) "
              f"({', '.join(kept[:3])}{', …' if len(kept) > 3 else ''})")
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
                             "pass --dir to a writable place", exit_code=write_refused_exit(exc)) from None


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
    from ckptbench.core.units import human_bytes, human_gbps

    tell = (lambda rel: say(f"  {rel}", sys.stderr)) if sys.stderr.isatty() else None  # the checkpoint's names
    start = time.monotonic()
    done = s3.upload(args.directory, url, concurrency=args.concurrency, part_size=args.part_size, progress=tell)
    seconds = time.monotonic() - start
    nbytes = sum(os.path.getsize(os.path.join(args.directory, rel)) for rel in done)
    print(f"uploaded {len(done)} files ({human_bytes(nbytes)}) to {url} in {seconds:.3f} s, "
          f"{human_gbps(nbytes / seconds / 1e9)} GB/s")
    return 0


def cmd_tui(args) -> int:
    from ckptbench.cli.ui import run_app

    if args.pick is not None and args.source is None:
        raise CkptbenchError("--pick chooses among the checkpoints of the folder SOURCE names: give SOURCE too")

    if args.watch is not None:
        from ckptbench.system import procstat

        procstat.sample(args.watch)  # gone or unreadable: one line now, not inside the UI
        if args.source is not None:  # `tui SOURCE --watch PID`: SOURCE is the checkpoint the job restores
            from ckptbench.watch.verdict import source_files

            source_files(args.source, args.pick)  # a bad one is one line here, as `watch --source` says it
        return run_app("watch", args.watch, source=args.source, pick=args.pick)
    if args.source is not None:
        from ckptbench.cli.settings import require_checkpoint
        from ckptbench.sources import open_source

        # a bad path, or one that holds no checkpoint, is one line here (run's), not an error inside the UI
        require_checkpoint(open_source(args.source, args.pick).list())
    ranks = None
    if args.ranks:
        from ckptbench.distributed.history import newest_dist_run

        ranks = newest_dist_run(args.results)  # none on record: one line here, not an empty screen
    return run_app("dashboard", args.source, results_path=args.results,
                   autostart="loop" if args.loop else args.run, ranks=ranks, pick=args.pick)
