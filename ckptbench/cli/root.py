"""The command line: the composition root that turns arguments into domain calls."""

from __future__ import annotations

import argparse
import sys

from ckptbench import __version__
from ckptbench.core import concurrency as conc
from ckptbench.core.errors import EXIT_UNCHECKED, printable, redact, translate

HASHES = ("none", "crc32c", "xxh64", "md5", "sha256")
READ_MODES = ("auto", "pread", "mmap", "direct")  # readmode.MODES, kept here so the CLI starts without fastio
READ_HELP = "auto (default): direct for a cold read where the filesystem takes O_DIRECT, pread when cached"
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
_rank_timeout = _number(0.0, 7 * 86400.0)  # a week; far beyond, the process group's timedelta overflowed


def _size(text: str) -> int:
    from ckptbench.core.units import parse_size

    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _lazy(name: str, module: str = "cmds"):
    """A handler from cli/cmds (plain commands), cli/run (timed ones), cli/save or cli/watch, imported only when it runs."""
    def handler(args):
        import importlib

        return getattr(importlib.import_module(f"ckptbench.cli.{module}"), name)(args)

    return handler


PICK_HELP = ("which checkpoint of a folder that holds several: a sub-folder (checkpoint-9, checkpoint/step-9), a .ckpt "
             "file, or '.' for the files at the top (a final model); default: the one a resume loads")


def _add_pick(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pick", metavar="NAME", help=PICK_HELP)


def _add_read_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", "-c", type=_concurrency, default=conc.DEFAULT,
                   help=f"worker threads ({conc.MIN}..{conc.MAX})")
    p.add_argument("--read", choices=READ_MODES, default="auto", help=READ_HELP)
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
    p.add_argument("targets", nargs="+", metavar="DIR|FILE", help="a checkpoint directory (the checkpoint a resume "
                   "loads from it, as every command picks it; see --pick), or files and directories read whole")
    _add_read_options(p)
    _add_pick(p)
    p.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    p.set_defaults(handler=_lazy("cmd_read"))

    p = sub.add_parser("run", help="restore a checkpoint as timed stages, repeated, recorded in results.csv")
    p.add_argument("source", metavar="SOURCE", help="a checkpoint directory on any mount")
    p.add_argument("--mode", choices=("staged", "fused"), default="fused",
                   help="staged: read all, then verify, then load (the reference scripts); fused: one pass")
    p.add_argument("--cache", choices=CACHE_MODES, default="as-is")
    p.add_argument("--drop-caches", action="store_true", help="with --cache cold, also drop the page cache (root)")
    p.add_argument("--concurrency", "-c", type=_concurrency, default=conc.DEFAULT)
    p.add_argument("--read", choices=READ_MODES, default="auto", help=READ_HELP)
    p.add_argument("--hash", choices=HASHES, help="default: the manifest's digest; none without a manifest (there is "
                   "nothing to check a digest against; give one to record digests anyway)")
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
    p.add_argument("--distributed", action="store_true",
                   help="one restore per rank under torchrun (gloo on CPU, nccl with --device cuda), gathered on rank 0")
    p.add_argument("--each-rank", choices=("part", "all"), default="part",
                   help="with --distributed: part (its own files, or its rows of every tensor, as FSDP shards) or "
                        "all (every rank reads everything, as a replicated restore)")
    p.add_argument("--rank-timeout", type=_rank_timeout, default=300.0, metavar="S",
                   help="with --distributed: how long a rank is waited for before the run fails naming it (300)")
    p.add_argument("--tensor-digests", action="store_true",
                   help="with --distributed --json: each rank lists a crc32c of every tensor it holds (after the "
                        "clock): compare restores across world sizes")
    _add_pick(p)
    p.set_defaults(handler=_lazy("cmd_run", "run"))

    p = sub.add_parser("watch", help="watch a restore ckptbench did not start: live figures, phases, a verdict",
                       description="ckptbench watch PID | --match PATTERN | -- COMMAND ...")
    p.add_argument("target", nargs="*", metavar="PID | -- COMMAND", help="a PID, or the job to start after --")
    p.add_argument("--match", metavar="PATTERN", help="the one running process whose command line contains this")
    p.add_argument("--interval", type=_finite, default=0.25, metavar="S", help="seconds between samples (0.25)")
    p.add_argument("--no-verdict", action="store_true", help="skip reading the files afterwards to compare")
    p.add_argument("--results", default="results.csv", metavar="PATH", help="where the watch is recorded (kind watch)")
    p.add_argument("--source", metavar="DIR", help="the checkpoint the job restores: progress, ETA, and what the "
                   "verdict reads (default: the files the job was seen to open)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--tui", action="store_true", help="the live watch screen: rate, phases, then the verdict")
    p.set_defaults(handler=_lazy("cmd_watch", "watch"))

    p = sub.add_parser("inspect", help="what a checkpoint holds and what restoring it will do (headers only)")
    p.add_argument("source", metavar="SOURCE", help="a checkpoint directory")
    p.add_argument("--concurrency", "-c", type=_concurrency, default=conc.DEFAULT, help="the restore's concurrency")
    p.add_argument("--json", action="store_true")
    p.add_argument("--tensors", nargs="?", const="*", metavar="GLOB",
                   help="also list every tensor (name, dtype, shape, bytes, file, group), or those matching GLOB")
    _add_pick(p)
    p.set_defaults(handler=_lazy("cmd_inspect"))

    p = sub.add_parser("sweep", help="read throughput per concurrency level and the knee")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--levels", default="1,8,16,32,64")
    p.add_argument("--s3-client", choices=("threads", "crt"), default=S3_CLIENT_DEFAULT, help="S3 sources only")
    p.add_argument("--repeat", type=_positive, default=3, metavar="N")
    p.add_argument("--cache", choices=CACHE_MODES, default="cold")
    p.add_argument("--read", choices=READ_MODES, default="auto", help=READ_HELP)
    p.add_argument("--hash", choices=HASHES, default="none")
    p.add_argument("--block-size", type=_size, default=1 << 20, metavar="B")
    p.add_argument("--part-size", type=_size, default=8 << 20, metavar="B", help="S3: bytes per ranged GET (8M)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--distributed", action="store_true",
                   help="under torchrun: the distributed restore at each level (per rank), the aggregate rate's knee")
    p.add_argument("--each-rank", choices=("part", "all"), default="part", help="with --distributed: as for run")
    p.add_argument("--rank-timeout", type=_rank_timeout, default=300.0, metavar="S", help="with --distributed: as for run")
    _add_pick(p)
    p.set_defaults(handler=_lazy("cmd_sweep", "run"))

    p = sub.add_parser("compare", help="newest run against a baseline; exit 1 on a regression beyond the noise")
    p.add_argument("results", metavar="RESULTS", help="a results.csv written by run")
    p.add_argument("--baseline", metavar="RUN", help="run id to compare against (default: the previous run)")
    p.add_argument("--threshold", type=_finite, default=5.0, metavar="PCT")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_lazy("cmd_compare", "run"))

    p = sub.add_parser("check", help="the troubleshooting checklist: verdict, evidence and fix for every item")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--concurrency", "-c", type=_concurrency, default=conc.DEFAULT,
                   help="the concurrency the restore uses")
    p.add_argument("--quick-sweep", action="store_true", help="measure read throughput per concurrency (cold)")
    p.add_argument("--results", default="results.csv", metavar="PATH",
                   help="where recorded saves are read from (the write-side item uses the newest)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true")
    out.add_argument("--markdown", action="store_true")
    p.set_defaults(handler=_lazy("cmd_check"))

    p = sub.add_parser("plan", help="sizes, files, save bandwidth and restore memory of a checkpoint profile; "
                                    "with --nodes, where a restore on N nodes saturates the storage and its RTO floor")
    p.add_argument("profile", metavar="PROFILE", help="small, medium, large, 7b, 30b, 70b, or a .toml path")
    p.add_argument("--interval", type=_seconds, metavar="S",
                   help="checkpoint interval in seconds: the bandwidth it needs")
    p.add_argument("--scale", type=_scale, default=1.0, help="resize the model by about this factor in bytes")
    p.add_argument("--nodes", type=_whole(1, 1 << 20), metavar="N",
                   help="restore on N nodes: ceilings, saturation, RTO floor")
    p.add_argument("--ranks-per-node", type=_ranks, metavar="K", help="with --nodes: ranks on each node (8)")
    p.add_argument("--storage", metavar="PRESET", help="with --nodes (required): a storage preset (efs, fsx-lustre, "
                   "s3, ...) or a .toml path")
    p.add_argument("--results", default="results.csv", metavar="PATH",
                   help="with --interval: the newest save measured there sets the verdict; with --nodes: the newest "
                        "distributed or restore run there gives the per-rank read rate")
    p.add_argument("--target", metavar="DIR", help="with --interval: only saves measured to this target")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_lazy("cmd_plan"))

    p = sub.add_parser("save", help="save a checkpoint N times into a target, timed (blocking, written, durable), "
                                    "with the page cache and the device sampled; against the interval")
    p.add_argument("what", metavar="PROFILE|SOURCE", help="a profile (its state generated once) or a checkpoint dir")
    p.add_argument("target", metavar="TARGET", help="the directory the saves go into (step-NNNNNN, newest kept)")
    p.add_argument("--format", choices=("safetensors", "torch", "dcp"), default="safetensors")
    p.add_argument("--scale", type=_scale, default=1.0, help="resize a profile's model by about this factor in bytes")
    p.add_argument("--interval", type=_seconds, metavar="S", help="checkpoint interval: saves start every S seconds")
    p.add_argument("--count", type=_positive, default=3, metavar="N", help="saves to write (3)")
    p.add_argument("--keep", type=_positive, default=2, metavar="K", help="newest saves kept, older ones removed (2)")
    p.add_argument("--ranks", type=_ranks, default=1, metavar="N", help="threads, each writing its rank's shards")
    p.add_argument("--stagger", type=_finite, default=0.0, metavar="S", help="rank r starts r × S seconds late")
    p.add_argument("--async", dest="async_save", action="store_true",
                   help="DCP's async_save (with --format dcp): blocking ends once the state is staged")
    p.add_argument("--fsync", action=argparse.BooleanOptionalAction, default=True,
                   help="fsync files and directory before a save counts as durable (default)")
    p.add_argument("--force", action="store_true", help="save even when an essential preflight check fails")
    p.add_argument("--results", default="results.csv", metavar="PATH", help="append-only CSV; '' records nothing")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_lazy("cmd_save", "save"))

    p = sub.add_parser("gen", help="write a real sample checkpoint of a profile (not timed)")
    p.add_argument("profile", metavar="PROFILE")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--format", choices=("safetensors", "torch", "dcp"), help="default: the profile's")
    p.add_argument("--ranks", type=_ranks, help="ranks the state is sharded over (default: the profile's)")
    p.add_argument("--seed", type=_whole(-(1 << 63), (1 << 64) - 1), default=0, help="what torch.manual_seed takes")
    p.add_argument("--scale", type=_scale, default=1.0)
    p.add_argument("--digest", choices=("crc32c", "md5"), default="crc32c", help="manifest digest")
    p.add_argument("--force", action="store_true", help="replace DIR when it holds a checkpoint gen wrote")
    p.set_defaults(handler=_lazy("cmd_gen"))

    p = sub.add_parser("verify", help="check every file against the checkpoint's manifest (exit 0 verified, 1 "
                       f"mismatch, {EXIT_UNCHECKED} nothing to check against: no manifest or no digests)")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--concurrency", "-c", type=_concurrency, default=conc.DEFAULT)
    p.add_argument("--json", action="store_true")
    _add_pick(p)
    p.set_defaults(handler=_lazy("cmd_verify"))

    p = sub.add_parser("load", help="verify, load into model and optimizer, and check one step (untimed)")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("--no-verify", action="store_true")
    p.add_argument("--optimizer-step", action="store_true", help="also run one optimizer step")
    p.add_argument("--json", action="store_true")
    _add_pick(p)
    p.set_defaults(handler=_lazy("cmd_load"))

    p = sub.add_parser("pack", help="pack a checkpoint's small files into a few large pack files")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("out", metavar="OUT")
    p.add_argument("--target-files", type=int, default=4, metavar="N")
    p.set_defaults(handler=_lazy("cmd_pack"))

    p = sub.add_parser("unpack", help="write a packed checkpoint back as separate files")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("out", metavar="OUT")
    p.set_defaults(handler=_lazy("cmd_unpack"))

    p = sub.add_parser("upload", help="put a checkpoint directory under s3://bucket/prefix (multipart, CRC32C)")
    p.add_argument("directory", metavar="DIR")
    p.add_argument("url", metavar="s3://BUCKET/PREFIX")
    p.add_argument("--concurrency", "-c", type=_concurrency, default=conc.DEFAULT)
    p.add_argument("--part-size", type=_size, default=8 << 20, metavar="B")
    p.set_defaults(handler=_lazy("cmd_upload"))

    p = sub.add_parser("tui", help="the live dashboard: restore, concurrency by eye, checklist, sweep, history")
    p.add_argument("source", metavar="SOURCE", nargs="?")
    p.add_argument("--results", default="results.csv", metavar="PATH")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--run", action="store_true", help="start a restore at once")
    start.add_argument("--loop", action="store_true", help="start loop mode at once (read pass after pass)")
    start.add_argument("--watch", type=_whole(1), metavar="PID", help="watch that process (as `watch PID --tui`)")
    start.add_argument("--ranks", action="store_true",
                       help="open the newest distributed run (run --distributed) in --results: a lane per rank")
    p.set_defaults(handler=_lazy("cmd_tui"))

    p = sub.add_parser("demo", help="generate the small sample checkpoint (once) and restore it live in the TUI")
    p.add_argument("--dir", help="where the sample lives (default: the user cache directory)")
    p.add_argument("--headless", action="store_true", help="no TUI: a timed run with a progress line")
    p.add_argument("--scale", type=_scale, default=1.0, help="resize the sample (default: the small profile)")
    p.add_argument("--s3", action="store_true",
                   help="serve the sample from a local S3 server on 127.0.0.1 (moto, with 20 ms first-byte latency)")
    p.set_defaults(handler=_lazy("cmd_demo"))

    p = sub.add_parser("sysinfo", help="the dashboard's system figures, headless")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=_lazy("cmd_sysinfo"))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.reparse = parser.parse_args  # a handler that runs another command (demo --headless)
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
        print(f"ckptbench: error: {printable(redact(str(err)))}", file=sys.stderr)
        return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
