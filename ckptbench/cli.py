"""The command line: the composition root that turns arguments into domain calls."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from ckptbench import __version__
from ckptbench.errors import CkptbenchError

HASHES = ("none", "crc32c", "xxh64", "md5", "sha256")
READ_MODES = ("pread", "mmap", "direct")
CACHE_MODES = ("cold", "hot", "as-is")


def _concurrency(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= n <= 1024:
        raise argparse.ArgumentTypeError(f"must be 1..1024, got {n}")
    return n


def _size(text: str) -> int:
    from ckptbench.units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _add_read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", "-c", type=_concurrency, default=8, help="worker threads (1..1024)")
    p.add_argument("--read", choices=READ_MODES, default="pread", help="read mode")
    p.add_argument("--hash", choices=HASHES, default="crc32c", help="digest computed while reading")
    p.add_argument("--block-size", type=_size, default=1 << 20, metavar="B", help="bytes per read call (1M)")
    p.add_argument("--chunk-size", type=_size, default=64 << 20, metavar="B",
                   help="big files are split into chunks of this size across workers (64M)")
    p.add_argument("--multipart", action="store_true",
                   help="also give per-chunk digests and their digest, as an S3 multipart ETag")
    p.add_argument("--cache", choices=CACHE_MODES, default="as-is",
                   help="cold: evict and verify; hot: pre-read and verify; as-is: measure only")
    p.add_argument("--drop-caches", action="store_true", help="with --cache cold, also drop the whole page cache (root)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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

    p = sub.add_parser("demo", help="generate a small sample file set and read it cold, then hot, live")
    p.add_argument("--dir", help="where the sample lives (default: the user cache directory)")
    p.set_defaults(handler=cmd_demo)
    return parser


def _read_options(args):
    from ckptbench.reading import ReadOptions

    return ReadOptions(
        concurrency=args.concurrency, read=args.read, hash=args.hash, block_size=args.block_size,
        chunk_size=args.chunk_size, multipart=args.multipart, cache=args.cache, drop_caches=args.drop_caches,
    )


def _run_read_live(files, opts):
    from ckptbench.progress import ProgressLine
    from ckptbench.reading import run_read

    line = ProgressLine(sys.stderr)
    cancel = threading.Event()
    try:
        return run_read(files, opts, on_progress=line, cancel=cancel)
    except KeyboardInterrupt:
        cancel.set()
        raise
    finally:
        line.close()


def _print_summary(report) -> None:
    from ckptbench.progress import fmt_us
    from ckptbench.units import human_bytes

    r = report.result
    c = report.cache
    print(f"read {human_bytes(r.bytes)} in {len(r.files)} files: {r.seconds:.3f} s, {r.read_gbps:.2f} GB/s "
          f"({r.read}, {r.hash}, concurrency {r.concurrency}, block {human_bytes(r.block_size)})")
    print(f"cache {c.requested}: residency before {c.residency_before:.1%}"
          f"{'' if c.residency_after is None else f', after {c.residency_after:.1%}'}"
          f"{'' if c.verified else '  [' + c.note + ']'}")
    print(f"read latency p50 {fmt_us(r.final.latency_us(0.5))}, p99 {fmt_us(r.final.latency_us(0.99))}; "
          f"retries {r.retries}; failed files {len(r.failed)}")
    for f in r.failed[:20]:
        print(f"  failed: {f.path}: {f.error.message} (errno {f.error.errno})", file=sys.stderr)
    if len(r.failed) > 20:
        print(f"  ... and {len(r.failed) - 20} more failed files", file=sys.stderr)


def cmd_read(args) -> int:
    from ckptbench.reading import list_files

    files = list_files(args.targets)
    report = _run_read_live(files, _read_options(args))
    if args.json:
        json.dump(report.to_json(), sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _print_summary(report)
    return 1 if report.result.failed else 0


def _cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ckptbench")


def cmd_demo(args) -> int:
    from ckptbench.fileset import DEMO_SHAPE, write_fileset
    from ckptbench.reading import ReadOptions, list_files
    from ckptbench.units import human_bytes

    directory = args.dir or os.path.join(_cache_dir(), "demo-files")
    if not os.path.isdir(directory) or not os.listdir(directory):
        print(f"writing a sample file set ({human_bytes(DEMO_SHAPE.total_bytes)}) to {directory}")
        write_fileset(directory, DEMO_SHAPE)
    files = list_files([directory])
    for cache in ("cold", "hot"):
        print(f"\n== {cache} read of {directory}")
        _print_summary(_run_read_live(files, ReadOptions(concurrency=8, cache=cache)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except CkptbenchError as exc:
        print(f"ckptbench: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ckptbench: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
