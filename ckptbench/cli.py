"""The command line: the composition root that turns arguments into domain calls."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from ckptbench import __version__
from ckptbench import concurrency as conc
from ckptbench.errors import CkptbenchError, redact, translate

HASHES = ("none", "crc32c", "xxh64", "md5", "sha256")
READ_MODES = ("pread", "mmap", "direct")
CACHE_MODES = ("cold", "hot", "as-is")
S3_CLIENT_DEFAULT = "threads"  # measured faster than crt in bench/s3_bench.py (see README)


def _whole(low: int, high: int | None = None):
    """An argparse type: a whole number in low..high (no upper bound when high is None)."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
        if n < low or (high is not None and n > high):
            raise argparse.ArgumentTypeError(f"must be {low}..{high}, got {n}" if high is not None
                                             else f"must be at least {low}, got {n}")
        return n

    return parse


_concurrency = _whole(conc.MIN, conc.MAX)
_ranks = _whole(1, 1024)
_positive = _whole(1)


def _number(above: float | None = None, high: float | None = None):
    """An argparse type: a finite number, greater than `above` and at most `high` where given."""
    import math

    def parse(text: str) -> float:
        try:
            x = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not math.isfinite(x):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if (above is not None and x <= above) or (high is not None and x > high):
            span = f"above {above:g}" + (f" and at most {high:g}" if high is not None else "")
            raise argparse.ArgumentTypeError(f"must be {span}, got {text}")
        return x

    return parse


_finite = _number()
_scale = _number(0.0, 1000.0)  # beyond ~1000x the 70B profile the arithmetic means nothing
_seconds = _number(0.0)


def _size(text: str) -> int:
    from ckptbench.units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _lazy(name: str):
    """A handler from cli_run, imported only when its command runs."""
    def handler(args):
        from ckptbench import cli_run

        return getattr(cli_run, name)(args)

    return handler


def _add_read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", "-c", type=_concurrency, default=conc.DEFAULT,
                   help=f"worker threads ({conc.MIN}..{conc.MAX})")
    p.add_argument("--read", choices=READ_MODES, default="pread", help="read mode")
    p.add_argument("--hash", choices=HASHES, default="crc32c", help="digest computed while reading")
    p.add_argument("--block-size", type=_size, default=1 << 20, metavar="B", help="bytes per read call (1M)")
    p.add_argument("--chunk-size", type=_size, metavar="B",
                   help="big files are split into chunks of this size across workers (about 64M)")
    p.add_argument("--part-size", type=_size, default=8 << 20, metavar="B", help="S3: bytes per ranged GET (8M)")
    p.add_argument("--multipart", action="store_true",
                   help="also give per-chunk digests and their digest, as an S3 multipart ETag")
    p.add_argument("--cache", choices=CACHE_MODES, default="as-is",
                   help="cold: evict and verify; hot: pre-read and verify; as-is: measure only")
    p.add_argument("--drop-caches", action="store_true", help="with --cache cold, also drop the whole page cache (root)")
    p.add_argument("--s3-client", choices=("threads", "crt"), default=S3_CLIENT_DEFAULT, help="S3 sources only")


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line, like every other bad input: what, where, and where to read more."""

    def error(self, message: str):
        self.exit(2, f"ckptbench: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ckptbench",
        description="Checkpoint-restore benchmark and live diagnosis for large-model training.",
    )
    parser.add_argument("--version", action="version", version=f"ckptbench {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("read", help="read and hash files in parallel (no deserialization)")
    p.add_argument("targets", nargs="+", metavar="DIR|FILE", help="a directory (read recursively) or files")
    _add_read_options(p)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.set_defaults(handler=cmd_read)

    p = sub.add_parser("run", help="restore a checkpoint as timed stages, repeated, recorded in results.csv")
    p.add_argument("source", metavar="SOURCE", help="a checkpoint directory on any mount")
    p.add_argument("--mode", choices=("staged", "fused"), default="fused",
                   help="staged: read all, then verify, then load (the reference scripts); fused: one pass")
    p.add_argument("--cache", choices=CACHE_MODES, default="as-is")
    p.add_argument("--drop-caches", action="store_true", help="with --cache cold, also drop the page cache (root)")
    p.add_argument("--concurrency", "-c", type=_concurrency, default=conc.DEFAULT)
    p.add_argument("--read", choices=READ_MODES, default="pread")
    p.add_argument("--hash", choices=HASHES, help="default: the manifest's digest (crc32c without one)")
    p.add_argument("--block-size", type=_size, default=1 << 20, metavar="B")
    p.add_argument("--device", default="cpu", help="cpu, or cuda[:N] to move the state to a GPU")
    p.add_argument("--repeat", type=_positive, default=3, metavar="N", help="independent repeats (medians reported)")
    p.add_argument("--optimizer-step", action="store_true", help="the check also runs one optimizer step")
    p.add_argument("--part-size", type=_size, default=8 << 20, metavar="B", help="S3: bytes per ranged GET (8M)")
    p.add_argument("--stage-dir", metavar="DIR", help="S3: download here (temporary names until whole and verified)")
    p.add_argument("--s3-client", choices=("threads", "crt"), default=S3_CLIENT_DEFAULT,
                   help="S3: boto3 with ckptbench's thread pool, or awscrt's native client")
    p.add_argument("--results", default="results.csv", metavar="PATH", help="append-only CSV of every repeat")
    p.add_argument("--price-per-hour", type=_finite, metavar="USD", help="instance price: turn the RTO into money")
    p.add_argument("--spot-discount", type=_finite, default=0.0, metavar="F", help="fraction off on spot (0.7)")
    p.add_argument("--restores-per-day", type=_finite, default=1.0, metavar="N")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_lazy("cmd_run"))

    p = sub.add_parser("sweep", help="read throughput per concurrency level and the knee")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--levels", default="1,8,16,32,64")
    p.add_argument("--s3-client", choices=("threads", "crt"), default=S3_CLIENT_DEFAULT, help="S3 sources only")
    p.add_argument("--repeat", type=_positive, default=3, metavar="N")
    p.add_argument("--cache", choices=CACHE_MODES, default="cold")
    p.add_argument("--read", choices=READ_MODES, default="pread")
    p.add_argument("--hash", choices=HASHES, default="none")
    p.add_argument("--block-size", type=_size, default=1 << 20, metavar="B")
    p.add_argument("--part-size", type=_size, default=8 << 20, metavar="B", help="S3: bytes per ranged GET (8M)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_lazy("cmd_sweep"))

    p = sub.add_parser("compare", help="newest run against a baseline; exit 1 on a regression beyond the noise")
    p.add_argument("results", metavar="RESULTS", help="a results.csv written by run")
    p.add_argument("--baseline", metavar="RUN", help="run id to compare against (default: the previous run)")
    p.add_argument("--threshold", type=_finite, default=5.0, metavar="PCT")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_lazy("cmd_compare"))

    p = sub.add_parser("check", help="the troubleshooting checklist: verdict, evidence and fix for every item")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--concurrency", "-c", type=_concurrency, default=conc.DEFAULT,
                   help="the concurrency the restore uses")
    p.add_argument("--quick-sweep", action="store_true", help="measure read throughput per concurrency (cold)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--markdown", action="store_true")
    p.set_defaults(handler=cmd_check)

    p = sub.add_parser("plan", help="sizes, files, save bandwidth and restore memory of a checkpoint profile")
    p.add_argument("profile", metavar="PROFILE", help="small, medium, large, 7b, 30b, 70b, or a .toml path")
    p.add_argument("--interval", type=_seconds, metavar="S",
                   help="checkpoint interval in seconds: the bandwidth it needs")
    p.add_argument("--scale", type=_scale, default=1.0, help="resize the model by about this factor in bytes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_plan)

    p = sub.add_parser("gen", help="write a real sample checkpoint of a profile (not timed)")
    p.add_argument("profile", metavar="PROFILE")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--format", choices=("safetensors", "torch", "dcp"), help="default: the profile's")
    p.add_argument("--ranks", type=_ranks, help="ranks the state is sharded over (default: the profile's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--scale", type=_scale, default=1.0)
    p.add_argument("--digest", choices=("crc32c", "md5"), default="crc32c", help="manifest digest")
    p.add_argument("--force", action="store_true", help="replace a non-empty DIR")
    p.set_defaults(handler=cmd_gen)

    p = sub.add_parser("verify", help="check every file against the checkpoint's manifest")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--concurrency", "-c", type=_concurrency, default=conc.DEFAULT)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_verify)

    p = sub.add_parser("load", help="verify, load into model and optimizer, and check one step (untimed)")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--optimizer-step", action="store_true", help="also run one optimizer step")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_load)

    p = sub.add_parser("pack", help="pack a checkpoint's small files into a few large pack files")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--target-files", type=int, default=4, metavar="N")
    p.set_defaults(handler=cmd_pack)

    p = sub.add_parser("unpack", help="write a packed checkpoint back as separate files")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("out", metavar="OUT")
    p.set_defaults(handler=cmd_unpack)

    p = sub.add_parser("upload", help="put a checkpoint directory under s3://bucket/prefix (multipart, CRC32C)")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("url", metavar="s3://BUCKET/PREFIX")
    p.add_argument("--concurrency", "-c", type=_concurrency, default=conc.DEFAULT)
    p.add_argument("--part-size", type=_size, default=8 << 20, metavar="B")
    p.set_defaults(handler=cmd_upload)

    p = sub.add_parser("tui", help="the live dashboard: restore, concurrency by eye, checklist, sweep, history")
    p.add_argument("source", metavar="SOURCE", nargs="?")
    p.add_argument("--results", default="results.csv", metavar="PATH")
    p.add_argument("--run", action="store_true", help="start a restore at once")
    p.set_defaults(handler=cmd_tui)

    p = sub.add_parser("demo", help="generate the small sample checkpoint (once) and restore it live in the TUI")
    p.add_argument("--dir", help="where the sample lives (default: the user cache directory)")
    p.add_argument("--headless", action="store_true", help="no TUI: a timed run with a progress line")
    p.add_argument("--scale", type=_scale, default=1.0, help="resize the sample (default: the small profile)")
    p.add_argument("--s3", action="store_true",
                   help="serve the sample from a local S3 server on 127.0.0.1 (moto, with 20 ms first-byte latency)")
    p.set_defaults(handler=cmd_demo)

    p = sub.add_parser("sysinfo", help="the dashboard's system figures, headless")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_sysinfo)
    return parser


def _read_options(args):
    from ckptbench.sources import ReadOptions

    return ReadOptions(concurrency=args.concurrency, read=args.read, hash=args.hash, block_size=args.block_size,
                       chunk_size=args.chunk_size, multipart=args.multipart, part_size=args.part_size,
                       s3_client=args.s3_client)


def _print_summary(report) -> None:
    from ckptbench.progress import fmt_us
    from ckptbench.units import human_bytes

    r = report.result
    c = report.cache
    d = report.driven
    print(f"read {human_bytes(r.bytes)} in {len(r.files)} files: {d.wall_s:.3f} s, {d.read_gbps:.2f} GB/s "
          f"({r.read}, {r.hash}, concurrency {r.concurrency}, block {human_bytes(r.block_size)}); the reader alone "
          f"{d.engine_gbps:.2f} GB/s from first open to last byte")
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


def cmd_read(args) -> int:
    from ckptbench.progress import ProgressLine
    from ckptbench.reading import read_source
    from ckptbench.sources import open_targets

    opts = _read_options(args)
    source = open_targets(args.targets)
    listing = source.list()
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
        _emit(report.to_json())
    else:
        _print_summary(report)
    return 0 if report.ok else 1


def _emit(doc: dict) -> None:
    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def _profile(name: str, scale: float):
    from ckptbench import profiles

    p = profiles.load(name)
    return p if scale == 1.0 else p.scaled(scale)


def cmd_plan(args) -> int:
    from ckptbench.plan import plan
    from ckptbench.units import human_bytes

    doc = plan(_profile(args.profile, args.scale), args.interval)
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
    return 0


def cmd_check(args) -> int:
    from ckptbench.checklist import evaluate, markdown, report
    from ckptbench.checklist_facts import gather

    facts = gather(args.source, concurrency=args.concurrency, quick_sweep=args.quick_sweep)
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
    from ckptbench.generate import generate

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
    from ckptbench.restore import require_dir
    from ckptbench.verify import verify

    require_dir(args.directory)
    rep = verify(args.directory, concurrency=args.concurrency)
    if args.json:
        _emit({"ok": rep.ok, "has_reference": rep.has_reference, "files": rep.files, "bytes": rep.bytes,
               "problems": [{"path": p, "problem": w} for p, w in rep.problems], "digests": rep.digests})
    else:
        if not rep.has_reference:
            print(f"{args.directory}: no manifest, so no reference: digests computed for {rep.files} files")
        for rel, what in rep.problems:
            print(f"  {rel}: {what}", file=sys.stderr)
        print(f"{'OK' if rep.ok else 'MISMATCH'}: {rep.files} files, {rep.bytes / 2**20:.1f} MiB, "
              f"{len(rep.problems)} problem(s)")
    return 0 if rep.ok else 1


def cmd_load(args) -> int:
    from ckptbench.restore import restore_dir

    out = restore_dir(args.directory, verify=not args.no_verify, optimizer_step=args.optimizer_step)
    c = out.check
    if args.json:
        _emit({"format": out.format, "ok": c.ok, "param_count": c.param_count, "dtypes": c.dtypes,
               "finite_output": c.finite_output, "optimizer_step": c.optimizer_step, "problems": list(c.problems),
               "structural_only": c.structural_only, "tail_files": out.tail_files,
               "verified": None if out.verify is None else out.verify.has_reference})
    else:
        ref = "" if out.verify is None or out.verify.has_reference else " (no manifest: digests had no reference)"
        kind = "structural check" if c.structural_only else "check"
        print(f"{out.format}: {c.param_count / 1e6:.2f} M parameters {c.dtypes['weights']}, {out.tail_files} small "
              f"files; {kind} {'passed' if c.ok else 'FAILED'}{ref}")
        for p in c.problems:
            print(f"  {p}", file=sys.stderr)
    return 0 if c.ok else 1


def cmd_pack(args) -> int:
    from ckptbench.packs import pack

    man = pack(args.directory, args.out, args.target_files)
    members = sum(len(i) for i in man.packs.values())
    print(f"packed {members} small files into {len(man.packs)} pack file(s) in {args.out}")
    return 0


def cmd_unpack(args) -> int:
    from ckptbench.packs import unpack

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
    from ckptbench.generate import generate

    if args.s3:
        try:
            import moto  # noqa: F401
        except ImportError:
            raise CkptbenchError("demo --s3 needs the local S3 server, which is an extra: "
                                 "pip install 'ckptbench[s3-demo]'") from None
    directory = args.dir or os.path.join(_cache_dir(), "demo-small")
    if not os.path.isfile(os.path.join(directory, "ckptbench.json")):
        _ensure_dir(os.path.dirname(os.path.abspath(directory)), "cache directory")
        print(f"generating the small sample checkpoint in {directory} (once)…", file=sys.stderr)
        generate(_profile("small", args.scale), directory, force=True,
                 progress=(lambda m: print(f"  {m}", file=sys.stderr)))
    if args.s3:
        from ckptbench.s3local import local_s3
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
        from ckptbench import cli_run

        argv = ["run", source, "--repeat", "1", "--results", results, "--cache", "cold"]
        return cli_run.cmd_run(build_parser().parse_args(argv))
    from ckptbench.pipeline import RunOptions
    from tui.app import CkptbenchApp  # the UI loads only for this command

    # cold, as after a reclaim: the sample was just written, so a restore "as-is" would read the page cache
    CkptbenchApp(source, RunOptions(cache="cold"), results_path=results, autostart=True).run()
    return 0


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
    if args.source is not None:
        from ckptbench.sources import open_source

        open_source(args.source)  # a bad path is one line here, not an error inside the UI
    from tui.app import CkptbenchApp  # the UI loads only for this command

    CkptbenchApp(args.source, results_path=args.results, autostart=args.run).run()
    return 0


def cmd_sysinfo(args) -> int:
    from ckptbench.live import SystemSampler, source_summary

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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        print("ckptbench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
    except Exception as exc:
        err = translate(exc)  # fastio, OS, botocore and torch failures a user can cause: one line
        if err is None:
            raise
        print(f"ckptbench: error: {redact(str(err))}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
