"""The command line: the composition root that turns arguments into domain calls. Every argument is a declaration
of core/options, rendered here; a command lists the ones it takes."""

from __future__ import annotations

import argparse
import difflib
import sys
from dataclasses import dataclass
from typing import Callable

from ckptbench import __version__
from ckptbench.core import options as o
from ckptbench.core.errors import EXIT_UNCHECKED, printable, redact, translate

def _lazy(name: str, module: str = "cmds"):
    """A handler from cli/cmds (plain commands), cli/run (timed ones), cli/save or cli/watch, imported only when it runs."""
    def handler(args):
        import importlib

        return getattr(importlib.import_module(f"ckptbench.cli.{module}"), name)(args)

    return handler


def _typed(parse):
    """An argparse type from an option's parse: its ValueError becomes the one-line argument error."""
    def typed(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return typed


def _with_default(opt: o.Option) -> str | None:
    """The help with the value an option takes when not given, where its help does not say it already (a new user
    could not tell --concurrency's or --repeat's default without running the command)."""
    shown = opt.default
    if (opt.help is None or opt.action or shown is None or shown == "" or "default" in opt.help
            or opt.help == argparse.SUPPRESS):
        return opt.help
    if isinstance(shown, int) and opt.parse is o.size:  # a size as one types it
        shown = f"{shown >> 20}M" if shown % (1 << 20) == 0 else f"{shown >> 10}K" if shown % 1024 == 0 else shown
    return f"{opt.help} (default: {shown:g})" if isinstance(shown, float) else f"{opt.help} (default: {shown})"


def add_option(p, opt: o.Option) -> argparse.Action:
    """Renders one declaration into a parser (or a group of one)."""
    if opt.action == "negatable":
        kw = {"action": argparse.BooleanOptionalAction, "default": opt.default}
    elif opt.action:
        kw = {"action": opt.action}
    else:
        kw = {"type": opt.parse and _typed(opt.parse), "choices": opt.choices, "default": opt.default,
              "metavar": opt.metavar, "nargs": opt.nargs, "const": opt.const}
        kw = {k: v for k, v in kw.items() if v is not None}  # a positional given default=None is no longer required
    if opt.flags:
        return p.add_argument(*opt.flags, dest=opt.dest, help=_with_default(opt), **kw)
    return p.add_argument(opt.dest, help=opt.help, **kw)


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    handler: Callable
    args: tuple  # Options in --help order; a tuple of Options is a group whose members exclude each other
    description: str | None = None
    # the first word that is not one of its options starts a command line, all of it the job's, as `time` and
    # `strace` take one: `--` before it is optional
    job_follows: bool = False

    def takes_value(self) -> dict[str, bool]:
        """Each flag it knows (-h too), and whether it takes the next word as its value."""
        flags = {"-h": False, "--help": False}
        for arg in self.args:
            for opt in arg if isinstance(arg, tuple) else (arg,):
                flags |= {flag: opt.action is None for flag in opt.flags}
        return flags


_READ_OPTIONS = (o.CONCURRENCY, o.READ, o.HASH, o.BLOCK_SIZE, o.CHUNK_SIZE, o.PART_SIZE, o.MULTIPART, o.CACHE,
                 o.DROP_CACHES, o.S3_CLIENT)
_RESTORE_CONCURRENCY = o.CONCURRENCY.but(help="the concurrency the restore uses")

COMMANDS = (
    Command("read", "read and hash files in parallel (no deserialization)", _lazy("cmd_read"),
            (o.TARGETS, *_READ_OPTIONS, o.PICK, o.JSON)),
    Command("run", "restore a checkpoint as timed stages, repeated, recorded in results.csv", _lazy("cmd_run", "run"),
            (o.SOURCE, o.MODE, o.CACHE, o.DROP_CACHES, o.CONCURRENCY, o.READ, o.RESTORE_HASH, o.BLOCK_SIZE, o.DEVICE,
             o.REPEAT, o.OPTIMIZER_STEP, o.PART_SIZE, o.STAGE_DIR, o.S3_CLIENT,
             o.RESULTS.but(help="append-only CSV of every repeat"), o.PRICE_PER_HOUR, o.SPOT_DISCOUNT,
             o.RESTORES_PER_DAY, o.JSON, o.DISTRIBUTED, o.EACH_RANK_READS, o.RANK_TIMEOUT, o.TENSOR_DIGESTS, o.PICK)),
    Command("watch", "watch a restore ckptbench did not start: live figures, phases, a verdict",
            _lazy("cmd_watch", "watch"),
            (o.WATCHED, o.MATCH, o.SAMPLE_INTERVAL, o.NO_VERDICT,
             o.RESULTS.but(help="where the watch is recorded (kind watch)"), o.WATCH_SOURCE,
             o.PICK.but(help="with --source: which checkpoint of a folder that holds several the job restores (a "
                             "sub-folder or a file name, as run's --pick)"), (o.JSON, o.TUI)),
            description="ckptbench watch PID | --match PATTERN | [--] COMMAND ...", job_follows=True),
    Command("inspect", "what a checkpoint holds and what restoring it will do (headers only)",
            _lazy("cmd_inspect", "checkpoints"),
            (o.SOURCE, _RESTORE_CONCURRENCY, o.JSON, o.TENSORS, o.PICK)),
    Command("sweep", "read throughput per concurrency level and the knee", _lazy("cmd_sweep", "run"),
            (o.SOURCE, o.LEVELS, o.S3_CLIENT, o.REPEAT, o.CACHE.but(default="cold"), o.READ, o.HASH.but(default="none"),
             o.BLOCK_SIZE, o.PART_SIZE, o.JSON,
             o.DISTRIBUTED.but(help="under torchrun: the distributed restore at each level (per rank), the aggregate "
                                    "rate's knee"),
             o.EACH_RANK_READS, o.RANK_TIMEOUT, o.PICK,
             o.RESULTS.but(default="", help="a results CSV whose documents (PATH.jsonl; a knee is no CSV row) the "
                                            "knee is recorded in: `check --results PATH` then advises from it, not "
                                            "from a preset"))),
    Command("compare", "newest run against a baseline; exit 1 on a regression beyond the noise",
            _lazy("cmd_compare", "run"),
            (o.RESULTS_FILE.but(nargs="?", default=o.RESULTS.default, help="a results.csv written by run, save or "
                                                                           "watch (default: results.csv)"),
             (o.NEWEST, o.RUN_KIND),
             o.BASELINE.but(help="run id to compare against (default: the last earlier run of the same kind made the "
                                 "same way; for a watch, of the same command)"),
             o.THRESHOLD, o.JSON)),
    Command("history", "the runs a results file holds, one line each, oldest first", _lazy("cmd_history", "history"),
            (o.RESULTS_FILE.but(nargs="?", default=o.RESULTS.default, help="a results.csv written by run, save or "
                                                                           "watch (default: results.csv)"), o.JSON)),
    Command("check", "the troubleshooting checklist: verdict, evidence and fix for every item (it reads SOURCE's "
                     "files cold: they leave the page cache)", _lazy("cmd_check"),
            (o.SOURCE, _RESTORE_CONCURRENCY, o.QUICK_SWEEP,
             o.RESULTS.but(help="where recorded knees (`sweep --results`, kept in PATH.jsonl) and saves are read "
                                "from: the concurrency item advises from the newest knee, the write-side item from "
                                "the newest save"),
             o.PICK, (o.JSON, o.MARKDOWN))),
    Command("plan", "sizes, files, save bandwidth and restore memory of a checkpoint profile; with --nodes, where a "
                    "restore on N nodes saturates the storage and its RTO floor", _lazy("cmd_plan"),
            (o.PROFILE, o.INTERVAL.but(help="checkpoint interval in seconds: the bandwidth it needs"), o.SCALE, o.NODES,
             o.RANKS_PER_NODE, o.STORAGE, o.NODE_MEMORY,
             o.RESULTS.but(help="with --interval: the newest save measured there sets the verdict; with --nodes: the "
                                "newest distributed or restore run there gives the per-rank read rate"),
             o.SAVED_TO, o.JSON)),
    Command("save", "save a checkpoint N times into a target, timed (blocking, written, durable), with the page cache "
                    "and the device sampled; against the interval", _lazy("cmd_save", "save"),
            (o.SAVE_WHAT, o.SAVE_TARGET, o.FORMAT, o.SCALE,
             o.INTERVAL.but(help="checkpoint interval: saves start every S seconds"), o.COUNT, o.KEEP, o.RANKS,
             o.STAGGER, o.ASYNC_SAVE, o.FSYNC, o.FORCE.but(help="save even when an essential preflight check fails"),
             o.RESULTS.but(help="append-only CSV; '' records nothing"), o.JSON, o.PICK)),
    Command("gen", "write a real sample checkpoint of a profile (not timed)", _lazy("cmd_gen"),
            (o.PROFILE, o.DIRECTORY.but(help="where the checkpoint is written (a new or empty directory; --force "
                                             "replaces one gen wrote)"), o.FORMAT.but(default=None, help="the checkpoint format written (default: the profile's)"),
             o.RANKS.but(default=None, help="ranks the state is sharded over (default: the profile's)"), o.SEED,
             o.SCALE, o.DIGEST, o.FORCE.but(help="replace DIR when it holds a checkpoint gen wrote"))),
    Command("verify", "check every file against the checkpoint's manifest (exit 0 verified, 1 mismatch, "
                      f"{EXIT_UNCHECKED} nothing to check against: no manifest or no digests)", _lazy("cmd_verify", "checkpoints"),
            (o.DIRECTORY, o.CONCURRENCY, o.JSON, o.PICK)),
    Command("load", "verify, load into model and optimizer, and check one step (untimed)", _lazy("cmd_load", "checkpoints"),
            (o.DIRECTORY, o.NO_VERIFY, o.OPTIMIZER_STEP, o.JSON, o.PICK)),
    Command("pack", "pack a checkpoint's small files into a few large pack files", _lazy("cmd_pack"),
            (o.DIRECTORY, o.OUT.but(help="where the packed checkpoint is written (a directory outside DIR)"),
             o.TARGET_FILES)),
    Command("unpack", "write a packed checkpoint back as separate files", _lazy("cmd_unpack"),
            (o.DIRECTORY.but(help="a checkpoint `ckptbench pack` wrote"),
             o.OUT.but(help="where the checkpoint is written back as separate files (a directory outside DIR)"))),
    Command("upload", "put a checkpoint directory under s3://bucket/prefix (multipart, CRC32C)", _lazy("cmd_upload"),
            (o.DIRECTORY.but(help="a checkpoint directory: every file under it is put"), o.S3_URL, o.CONCURRENCY,
             o.PART_SIZE.but(help="multipart part size: a larger file goes up in parts of this size (5 MiB at "
                                  "least)"))),
    Command("tui", "the live dashboard: restore, concurrency by eye, checklist, sweep, history", _lazy("cmd_tui"),
            (o.SOURCE.but(nargs="?", help="a checkpoint directory on any mount, or an s3:// URL (optional: the "
                                          "dashboard opens without one)"), o.RESULTS, o.PICK, (o.START_RUN, o.START_LOOP, o.START_WATCH, o.OPEN_RANKS))),
    Command("demo", "generate the small sample checkpoint (once) and restore it live in the TUI", _lazy("cmd_demo"),
            (o.DEMO_DIR, o.HEADLESS, o.SCALE.but(help="resize the sample (default: the small profile)"), o.DEMO_S3)),
    Command("sysinfo", "the dashboard's system figures, headless", _lazy("cmd_sysinfo", "box"),
            (o.SOURCE.but(nargs="?", help="a checkpoint directory on any mount, or an s3:// URL (optional: without "
                                          "one, the box's figures and the current directory's mount)"), o.JSON, o.PICK)),
    Command("floor", "what this box can physically do for a restore (storage, fresh memory, copy, hashing, scanning), "
                     "measured in seconds and cached per box; with SOURCE, that checkpoint's floor (its files "
                     "are read cold when its mount's storage figure is measured: they leave the page cache)",
            _lazy("cmd_floor", "box"), (o.SOURCE.but(nargs="?", help="a checkpoint: its files give its mount's storage "
                                                                  "figure (kept per mount; --remeasure reads them "
                                                                  "again)"),
                                 o.REMEASURE, o.JSON, o.PICK, o.S3_CLIENT, o.WRITE_TO)),
)


def job_after_dashes(argv: list[str]) -> list[str]:
    """`watch python train.py --resume` as `watch -- python train.py --resume`: without the `--`, argparse took the
    job's options as ckptbench's (`-c pass` refused as unrecognized, a `--json` or `--source` of the job's silently
    ckptbench's). A first word of digits is left as it is: a PID, or said not to be one."""
    cmd = next((c for c in COMMANDS if c.job_follows and argv[:1] == [c.name]), None)
    if cmd is None:
        return argv
    flags = cmd.takes_value()
    i = 1
    while i < len(argv):
        word = argv[i]
        if word == "--" or word[:1].isdigit():
            return argv
        if word == "-" or not word.startswith("-"):
            return [*argv[:i], "--", *argv[i:]]
        flag = word.split("=", 1)[0]
        known = [flag] if flag in flags else [f for f in flags if flag.startswith("--") and f.startswith(flag)]
        if len(known) != 1:  # unknown or ambiguous: argparse says so, in its one line
            return argv
        i += 2 if flags[known[0]] and "=" not in word else 1
    return argv


def _near(word: str, known) -> str | None:
    """The one known word a typo most likely meant, or None when none is close."""
    match = difflib.get_close_matches(word, [k for k in known if isinstance(k, str)], n=1)
    return match[0] if match else None


class _Parser(argparse.ArgumentParser):
    """Bad arguments are one line, like every other bad input: what, where, and where to read more; a typo also
    names the command, option or value it most likely meant."""

    flags: dict[str | None, list[str]] = {}  # long options by command (None: the top), set by build_parser

    def error(self, message: str):
        self.exit(2, f"ckptbench: error: {message} (see {self.prog} --help)\n")

    def _check_value(self, action, value):
        """As argparse's, with the near miss named: `ckptbench rn` listed all twenty commands and no hint of run.
        (argparse's own hook for a value outside an argument's choices; a command name is one too.)"""
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError:
            meant = _near(value, action.choices) if isinstance(value, str) else None
            if meant is None:
                raise
            choices = ", ".join(map(repr, action.choices))
            raise argparse.ArgumentError(action, f"invalid choice: {value!r}; did you mean {meant!r}? (choose from "
                                                 f"{choices})") from None

    def parse_args(self, args=None, namespace=None):
        """As argparse's, but an option no command knows is sent to the command's own help, not the top's (a new
        user's `run --concurency 4` was told to read `ckptbench --help`, which lists no run option), with the option
        it most likely meant."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            cmd = getattr(parsed, "command", None)
            known = self.flags.get(cmd, [])
            typos = (word.split("=", 1)[0] for word in extras if word.startswith("--") and word != "--")
            meant = next((m for m in (_near(t, known) for t in typos) if m is not None), None)
            hint = f"; did you mean {meant}?" if meant else ""  # a known option: never the user's text (a secret)
            self.exit(2, f"ckptbench: error: unrecognized arguments: {printable(redact(' '.join(extras)))[:200]}"
                         f"{hint} (see {self.prog}{' ' + cmd if cmd else ''} --help)\n")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="ckptbench",
        description="Checkpoint-restore benchmark and live diagnosis for large-model training.",
    )
    # not an option of core/options: it takes no value
    version = parser.add_argument("--version", action="version", version=f"ckptbench {__version__}")
    flags = {None: ["--help", *version.option_strings]}
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for cmd in COMMANDS:
        p = sub.add_parser(cmd.name, help=cmd.help, description=cmd.description)
        actions = []
        for arg in cmd.args:
            if isinstance(arg, tuple):
                group = p.add_mutually_exclusive_group()
                actions += [add_option(group, opt) for opt in arg]
            else:
                actions.append(add_option(p, arg))
        p.set_defaults(handler=cmd.handler)
        flags[cmd.name] = ["--help", *(f for a in actions for f in a.option_strings if f.startswith("--"))]
    parser.flags = flags
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where Ctrl-C is: every command's cancel path and its `finally` run (a watch ended with SIGTERM
    left its marks file in the temp folder, and a run its engine's threads reading)."""


def _terminate(signum, frame):
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    import signal
    import threading

    for stream in (sys.stdout, sys.stderr):  # a line printed bare (not through printable) with a lone surrogate in
        # it is shown escaped, never a UnicodeEncodeError after the work is done
        if hasattr(stream, "reconfigure") and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")
    parser = build_parser()
    args = parser.parse_args(job_after_dashes(sys.argv[1:] if argv is None else list(argv)))
    args.reparse = parser.parse_args  # a handler that runs another command (demo --headless)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    previous = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        previous = signal.signal(signal.SIGTERM, _terminate)  # only where nobody else set a handler (an embedder)
    try:
        return args.handler(args)
    except Terminated:
        print("ckptbench: terminated", file=sys.stderr)
        return 143
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
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
