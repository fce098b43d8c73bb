"""Every option a user sets, declared once (flags, type, choices, default, help), and the vocabularies they choose from.

cli/root renders these into argparse, the TUI into its controls, and the domain checks values against the same tuples.
(After Harlequin's options.py.) A command that means something else by a flag gets its own declaration; one that only
says it differently takes `OPTION.but(help=...)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable

import fastio

from ckptbench.core import concurrency as conc
from ckptbench.core.units import parse_size

# the vocabularies, each spelled once; the digests and the read paths are fastio's own
HASHES = fastio.HASHES
AUTO = "auto"  # --read auto: the path is chosen per read (system/readmode)
READ_MODES = (AUTO, *fastio.READ_MODES)
CACHE_MODES = ("cold", "hot", "as-is")
RESTORE_MODES = ("staged", "fused")
FORMATS = ("safetensors", "torch", "dcp")
S3_CLIENTS = ("threads", "crt")  # threads: boto3 + ckptbench's pool (measured faster, bench/s3_bench.py); crt: awscrt
EACH_RANK = ("part", "all")
MANIFEST_DIGESTS = ("crc32c", "md5")
OFF = "none"  # the choice that turns a thing off: a control offers it last


def _plain_digits(text: str) -> str:
    """`text` if it is spelled in ASCII without underscores: int() and float() also take '١٢' and '1_0', which no
    one means as a count, and a typo in a digit group would pass for another number."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    return text


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """A whole number in low..high (no upper bound when high is None); ValueError names what is wrong."""
    def parse(text: str) -> int:
        try:
            n = int(_plain_digits(text))
        except ValueError:
            raise ValueError(f"not a whole number: {text!r} (digits 0-9, e.g. 16)") from None
        if n < low or (high is not None and n > high):
            raise ValueError(f"must be {low}..{high}, got {n}" if high is not None else f"must be at least {low}, got {n}")
        return n

    return parse


def number(above: float | None = None, high: float | None = None) -> Callable[[str], float]:
    """A finite number, greater than `above` and at most `high` where given."""
    def parse(text: str) -> float:
        try:
            x = float(_plain_digits(text))
        except ValueError:
            raise ValueError(f"not a number: {text!r} (digits 0-9, e.g. 2.5)") from None
        if not math.isfinite(x):
            raise ValueError(f"must be a finite number, got {text!r}")
        if (above is not None and x <= above) or (high is not None and x > high):
            span = f"above {above:g}" + (f" and at most {high:g}" if high is not None else "")
            raise ValueError(f"must be {span}, got {text}")
        return x

    return parse


finite = number()
positive = whole(1)
ranks = whole(1, 1024)
scale = number(0.0, 1000.0)  # beyond ~1000x the 70B profile the arithmetic means nothing
seconds = number(0.0)
rank_timeout = number(0.0, 7 * 86400.0)  # a week; far beyond, the process group's timedelta overflowed
size = parse_size


@dataclass(frozen=True)
class Option:
    """One argument as a user meets it: its flags (none for a positional), where the value goes, how text becomes the
    value, the values allowed, the default and the help."""

    flags: tuple[str, ...]
    dest: str
    parse: Callable[[str], Any] | None = None
    choices: tuple | None = None
    default: Any = None
    help: str | None = None
    metavar: str | None = None
    action: str | None = None  # "store_true", "negatable" (--x and --no-x), or None: the flag takes a value
    nargs: str | None = None
    const: Any = None

    def but(self, **changes) -> Option:
        """This option as one command says it: its own default, help or metavar; never other flags or choices."""
        assert not {"flags", "dest", "parse", "choices", "action"} & set(changes), changes
        return replace(self, **changes)

    @property
    def values(self) -> tuple:
        """What a control cycles through: the default first (None: the domain decides), the choices, the off one last."""
        choices = self.choices or ()
        last = (OFF,) if OFF in choices and self.default != OFF else ()
        return (self.default, *(c for c in choices if c != self.default and c != OFF), *last)


def option(*flags: str, dest: str | None = None, **kw) -> Option:
    return Option(flags, dest or flags[0].lstrip("-").replace("-", "_"), **kw)


def switch(flag: str, help: str | None = None, dest: str | None = None) -> Option:
    return option(flag, dest=dest, action="store_true", default=False, help=help)


def argument(dest: str, metavar: str, help: str | None = None, nargs: str | None = None) -> Option:
    return Option((), dest, metavar=metavar, help=help, nargs=nargs)


# what a command acts on
SOURCE = argument("source", "SOURCE", "a checkpoint directory on any mount")
TARGETS = argument("targets", "DIR|FILE", "a checkpoint directory (the checkpoint a resume loads from it, as every "
                   "command picks it; see --pick), or files and directories read whole", nargs="+")
DIRECTORY = argument("directory", "DIR", "a checkpoint directory")
OUT = argument("out", "OUT", "where the result is written (a directory outside DIR)")
PROFILE = argument("profile", "PROFILE", "small, medium, large, 7b, 30b, 70b, or a .toml path")
SAVE_WHAT = argument("what", "PROFILE|SOURCE", "a profile (its state generated once) or a checkpoint dir")
SAVE_TARGET = argument("target", "TARGET", "the directory the saves go into (step-NNNNNN, newest kept)")
WATCHED = argument("target", "PID | [--] COMMAND", "a PID, or the job to start: every word from its first on is the "
                   "job's, its options too (`--` before it is optional)", nargs="*")
RESULTS_FILE = argument("results", "RESULTS", "a results.csv written by run")
S3_URL = argument("url", "s3://BUCKET/PREFIX", "the bucket, and the key prefix every file goes under")

# how bytes are read
CONCURRENCY = option("--concurrency", "-c", parse=whole(conc.MIN, conc.MAX), default=conc.DEFAULT,
                     help=f"worker threads ({conc.MIN}..{conc.MAX})")
READ = option("--read", choices=READ_MODES, default=AUTO,
              help="auto (default): direct for a cold read where the filesystem takes O_DIRECT, pread when cached")
HASH = option("--hash", choices=HASHES, default="crc32c", help="digest computed while reading")
RESTORE_HASH = HASH.but(default=None, help="digest computed while reading and checked against the manifest (default: "
                        "the manifest's; none without a manifest: there is nothing to check a digest against; give one "
                        "to record digests anyway)")
BLOCK_SIZE = option("--block-size", parse=size, default=1 << 20, metavar="B", help="bytes per read call")
CHUNK_SIZE = option("--chunk-size", parse=size, metavar="B",
                    help="big files are split into chunks of this size across workers (about 64M)")
PART_SIZE = option("--part-size", parse=size, default=8 << 20, metavar="B", help="S3: bytes per ranged GET")
MULTIPART = switch("--multipart", "hash chunks in parallel and give their digest as an S3 multipart ETag "
                                  "(multipart_digest; no plain digest for md5, sha256, xxh64 over several chunks)")
CACHE = option("--cache", choices=CACHE_MODES, default="as-is",
               help="cold: evict and verify; hot: pre-read and verify; as-is: measure only")
DROP_CACHES = switch("--drop-caches", "with --cache cold, also drop the whole page cache (root)")
S3_CLIENT = option("--s3-client", choices=S3_CLIENTS, default="threads",
                   help="S3 sources: boto3 with ckptbench's thread pool, or awscrt's native client")
PICK = option("--pick", metavar="NAME", help="which checkpoint of a folder that holds several: a sub-folder "
              "(checkpoint-9, checkpoint/step-9), a .ckpt file, or '.' for the checkpoint at the top (a final model: "
              "its files, and its sub-folders that hold no checkpoint of their own); default: the one a resume loads")

# the restore
MODE = option("--mode", choices=RESTORE_MODES, default="fused",
              help="staged: read all, then verify, then load (the reference scripts); fused: one pass")
DEVICE = option("--device", default="cpu", help="cpu, or cuda[:N] to move the state to a GPU")
REPEAT = option("--repeat", parse=positive, default=3, metavar="N", help="independent repeats (medians reported)")
OPTIMIZER_STEP = switch("--optimizer-step", "also run one optimizer step in the check (where it steps a model: "
                        "ckptbench's own checkpoints; otherwise the check says it did not run)")
NO_VERIFY = switch("--no-verify", "load without checking the files against the manifest first")
STAGE_DIR = option("--stage-dir", metavar="DIR", help="S3: download here (temporary names until whole and verified)")
PRICE_PER_HOUR = option("--price-per-hour", parse=finite, metavar="USD", help="instance price: turn the RTO into money")
SPOT_DISCOUNT = option("--spot-discount", parse=finite, default=0.0, metavar="F", help="fraction off on spot, e.g. 0.7")
RESTORES_PER_DAY = option("--restores-per-day", parse=finite, default=1.0, metavar="N",
                          help="restores a day, for the cost of the RTO")
LEVELS = option("--levels", default="1,8,16,32,64", help="the concurrency levels, comma-separated")
THRESHOLD = option("--threshold", parse=finite, default=5.0, metavar="PCT",
                   help="a slowdown beyond this percent (and the noise) is a regression")
BASELINE = option("--baseline", metavar="RUN", help="run id to compare against (default: the previous run)")
NEWEST = option("--newest", metavar="RUN", help="run id to compare (default: the newest run)")
RUN_KIND = option("--kind", metavar="KIND", help="compare the newest run of this kind (restore, save, watch, "
                  "dist), against the last earlier one of that kind")
QUICK_SWEEP = switch("--quick-sweep", "measure read throughput per concurrency (cold)")
TENSORS = option("--tensors", nargs="?", const="*", metavar="GLOB",
                 help="also list every tensor (name, dtype, shape, bytes, file, group), or those matching GLOB")

# distributed
DISTRIBUTED = switch("--distributed", "one restore per rank under torchrun (gloo on CPU, nccl with --device cuda), "
                     "gathered on rank 0")
EACH_RANK_READS = option("--each-rank", choices=EACH_RANK, default="part",
                         help="with --distributed: part (its own files, or its rows of every tensor, as FSDP shards) "
                              "or all (every rank reads everything, as a replicated restore)")
RANK_TIMEOUT = option("--rank-timeout", parse=rank_timeout, default=300.0, metavar="S",
                      help="with --distributed: how long a rank is waited for before the run fails naming it")
TENSOR_DIGESTS = switch("--tensor-digests", "with --distributed --json: each rank lists a crc32c of every tensor it "
                        "holds (after the clock): compare restores across world sizes")

# profiles, plans, saves and samples
SCALE = option("--scale", parse=scale, default=1.0, help="resize the model by about this factor in bytes")
INTERVAL = option("--interval", parse=seconds, metavar="S", help="checkpoint interval in seconds")
NODES = option("--nodes", parse=whole(1, 1 << 20), metavar="N", help="restore on N nodes: ceilings, saturation, RTO floor")
RANKS_PER_NODE = option("--ranks-per-node", parse=ranks, metavar="K", help="with --nodes: ranks on each node (8)")
STORAGE = option("--storage", metavar="PRESET", help="with --nodes (required): a storage preset (efs, fsx-lustre, s3, "
                 "...) or a .toml path")
NODE_MEMORY = option("--node-memory", parse=number(above=0.001, high=100_000), metavar="GB/S",
                     help="with --nodes: each node's fresh-memory rate, the most a node lands bytes in memory it did "
                          "not own (default: this box's, as `ckptbench floor` measured it: run plan on a training node)")
SAVED_TO = option("--target", metavar="DIR", help="with --interval: only saves measured to this target")
FORMAT = option("--format", choices=FORMATS, default="safetensors", help="the checkpoint format written")
COUNT = option("--count", parse=positive, default=3, metavar="N", help="saves to write")
KEEP = option("--keep", parse=positive, default=2, metavar="K", help="newest saves kept, older ones removed")
RANKS = option("--ranks", parse=ranks, default=1, metavar="N", help="threads, each writing its rank's shards")
STAGGER = option("--stagger", parse=finite, default=0.0, metavar="S", help="rank r starts r × S seconds late")
ASYNC_SAVE = switch("--async", "DCP's async_save (with --format dcp): blocking ends once the state is staged",
                    dest="async_save")
FSYNC = option("--fsync", action="negatable", default=True,
               help="fsync files and directory before a save counts as durable (default)")
FORCE = switch("--force")
SEED = option("--seed", parse=whole(-(1 << 63), (1 << 64) - 1), default=0, help="what torch.manual_seed takes")
DIGEST = option("--digest", choices=MANIFEST_DIGESTS, default="crc32c", help="manifest digest")
TARGET_FILES = option("--target-files", parse=whole(1, 10000), default=4, metavar="N", help="pack files to write")

# output and records
JSON = switch("--json", "print one JSON document on stdout")
REMEASURE = switch("--remeasure", "measure again even when this box's figures are cached and fresh")
WRITE_TO = option("--write-to", metavar="DIR", help="also the write figure a save is held against: 256 MiB written "
                  "and fsync'd in DIR (where your saves go), then removed")
MARKDOWN = switch("--markdown", "print the checklist as Markdown")
RESULTS = option("--results", default="results.csv", metavar="PATH", help="the append-only results CSV")

# watching and the TUI
MATCH = option("--match", metavar="PATTERN", help="the one running process whose command line contains this")
SAMPLE_INTERVAL = option("--interval", parse=finite, default=0.25, metavar="S", help="seconds between samples")
NO_VERDICT = switch("--no-verdict", "skip reading the files afterwards to compare")
WATCH_SOURCE = option("--source", metavar="DIR", help="the checkpoint the job restores: progress, ETA, and what the "
                      "verdict reads (default: the files the job was seen to open)")
TUI = switch("--tui", "the live watch screen: rate, phases, then the verdict")
START_RUN = switch("--run", "start a restore at once")
START_LOOP = switch("--loop", "start loop mode at once (read pass after pass)")
START_WATCH = option("--watch", parse=positive, metavar="PID",
                     help="watch that process (as `watch PID --tui`; SOURCE, when given, is the checkpoint it "
                          "restores, as `watch --source`)")
OPEN_RANKS = switch("--ranks", "open the newest distributed run (run --distributed) in --results: a lane per rank")
DEMO_DIR = option("--dir", help="where the sample lives (default: the user cache directory)")
HEADLESS = switch("--headless", "no TUI: a timed run with a progress line")
DEMO_S3 = switch("--s3", "serve the sample from a local S3 server on 127.0.0.1 (moto, with 20 ms first-byte latency)")
