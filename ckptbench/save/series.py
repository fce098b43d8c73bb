"""`save`: the write side — a checkpoint saved N times into a target, atomically, timed (blocking, written,
durable) while the page cache's dirty pages and the device are sampled; then the sustained durable throughput
against the checkpoint interval."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import threading
import time
from dataclasses import asdict

from ckptbench.save import preflight as pf
from ckptbench.core.staging import reap_stale
from ckptbench.core.errors import Cancelled, CkptbenchError, write_refused_exit
from ckptbench.checkpoint.manifest import MANIFEST_NAME, unlisted
from ckptbench.checkpoint.manifest import read as read_manifest
from ckptbench.checkpoint.profiles import FORMATS
from ckptbench.save.report import SaveOptions, SaveReport, SaveTiming
from ckptbench.system.writeback import WritebackSampler

STEP = re.compile(r"step-([0-9]{6,})")  # ASCII digits: \\d also takes "١٢٣" and fullwidth digits


MAX_WAIT_S = 7 * 86400  # a week: longer waits overflowed the clock (time_t) after the first save was written


def validate(opts: SaveOptions) -> None:
    """Options a user can get wrong, each one line before anything is written."""
    if opts.format not in FORMATS:
        raise CkptbenchError(f"unknown format {opts.format!r}: choose one of {', '.join(FORMATS)}")
    if opts.interval_s is not None and not 0 < opts.interval_s <= MAX_WAIT_S:
        raise CkptbenchError(f"--interval must be above 0 and at most {MAX_WAIT_S} seconds, got {opts.interval_s:g}")
    if opts.count < 1:
        raise CkptbenchError(f"--count must be at least 1, got {opts.count}")
    if opts.keep < 1:
        raise CkptbenchError(f"--keep must be at least 1 (the newest save is always kept), got {opts.keep}")
    if not 1 <= opts.ranks <= 1024:
        raise CkptbenchError(f"--ranks must be 1..1024, got {opts.ranks}")
    if not 0 <= opts.stagger_s <= MAX_WAIT_S:
        raise CkptbenchError(f"--stagger must be 0..{MAX_WAIT_S} seconds, got {opts.stagger_s:g}")
    if opts.async_save and opts.format != "dcp":
        raise CkptbenchError("--async uses torch.distributed.checkpoint's async_save: add --format dcp")
    if opts.stagger_s and opts.ranks == 1:  # rank 0 starts at once: a stagger of one rank was ignored unsaid
        raise CkptbenchError(f"--stagger {opts.stagger_s:g} delays rank r by r × {opts.stagger_s:g} s, and there is one "
                             "rank: add --ranks N, or leave --stagger out")
    if opts.stagger_s and opts.format == "dcp":
        raise CkptbenchError("--stagger offsets the ranks' shard writers of safetensors or torch saves; "
                             "DCP writes with its own threads: drop --stagger or choose another --format")


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def prepare_target(target: str, source: str | None) -> tuple[str, int | None]:
    """The target as an existing directory (created when its parent exists); never inside the source. With it, an
    open descriptor of the directory when this call created it (None when it was already there): the one folder a
    failed run may take away again. Held open, its inode cannot be reused by a folder made in its place."""
    if source is not None and _inside(target, source):
        raise CkptbenchError(f"{target}: inside the source checkpoint {source}; save somewhere else, or the "
                             "saves would become part of what is saved")
    if source is not None and _inside(source, target):
        first = os.path.relpath(os.path.realpath(source), os.path.realpath(target)).split(os.sep)[0]
        if STEP.fullmatch(first):  # pruning the older saves would delete the source
            raise CkptbenchError(f"{source}: is the save {first} in the target {target}, which --keep removes; "
                                 "save to another target")
    if os.path.exists(target) and not os.path.isdir(target):
        raise CkptbenchError(f"{target}: exists and is not a directory; choose a directory")
    made = None
    if not os.path.isdir(target):
        parent = os.path.dirname(os.path.abspath(target))
        if not os.path.isdir(parent):
            raise CkptbenchError(f"{parent}: no such directory; create it first")
        try:
            os.mkdir(target)
        except OSError as exc:
            raise CkptbenchError(f"{target}: cannot create the target directory ({exc.strerror}); choose a "
                                 "writable place", exit_code=write_refused_exit(exc)) from None
        try:
            made = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.rmdir(target)  # ours, made a moment ago
            raise CkptbenchError(f"{target}: cannot open the target directory just created ({exc.strerror}); "
                                 "choose a writable place", exit_code=write_refused_exit(exc)) from None
    return os.path.abspath(target), made


def unmake_target(target: str, made: int | None) -> None:
    """Removes the target a failed run created, while it is still that same empty folder: a refused preflight left
    an empty TARGET behind. A folder that was there before, or that holds anything (a save, the results file, a
    user's file), stays."""
    if made is None:
        return
    try:
        now, ours = os.lstat(target), os.fstat(made)
        if (now.st_dev, now.st_ino) == (ours.st_dev, ours.st_ino):  # not a folder put in its place since
            os.rmdir(target)  # fails on anything not empty: nothing in it is ever deleted
    except OSError:
        pass


def _is_save(target: str, name: str) -> bool:
    """A save ckptbench wrote: a real folder (not a link to one) named step-NNNNNN that holds its manifest, a valid
    one listing everything in the folder."""
    return _not_a_save(target, name) is None


def _not_a_save(target: str, name: str) -> str | None:
    """None for a save ckptbench wrote; else the entry that makes it none, as foreign_entries names it: the folder,
    or its first entry the manifest does not list. A ckptbench.json alone (a '{}', or a save the user has since put
    files into) made --keep delete the folder whole, the user's files with it."""
    path = os.path.join(target, name)
    if STEP.fullmatch(name) is None or not os.path.isdir(path) or os.path.islink(path):
        return name
    try:  # the manifest as save writes it, a regular file: a link to a save's manifest elsewhere makes no save
        if not stat.S_ISREG(os.lstat(os.path.join(path, MANIFEST_NAME)).st_mode):
            return name
        rel = unlisted(path, read_manifest(path))
    except (OSError, CkptbenchError):
        return name
    return None if rel is None else f"{name}/{rel}"


def existing_steps(target: str) -> list[tuple[int, str]]:
    """(step, name) of the saves ckptbench wrote in the target, oldest first: only these are numbered on from
    and pruned."""
    return sorted((int(STEP.fullmatch(n).group(1)), n) for n in os.listdir(target) if _is_save(target, n))


# What else save leaves in a target: its staging directory (`write_save`) and preflight scratch file (`preflight`)
# after a kill, and a mount's own lost+found when TARGET is a filesystem's root
_OURS_TOO = re.compile(r"\.step-[0-9]{6,}\.tmp-.+|\.ckptbench-preflight-[0-9a-f]{8}(\.renamed)?")


def foreign_entries(target: str, also: tuple[str, ...] = ()) -> list[str]:
    """Entries of the target that save did not write, sorted; `also`: paths this run writes (its results file)."""
    mine = {os.path.realpath(p) for p in also}
    foreign = []
    for n in os.listdir(target):
        if (_OURS_TOO.fullmatch(n) or n == "lost+found" and os.path.isdir(os.path.join(target, n))
                or os.path.realpath(os.path.join(target, n)) in mine):
            continue
        why = _not_a_save(target, n)
        if why is not None:
            foreign.append(why)
    return sorted(foreign)


def refuse_foreign(target: str, also: tuple[str, ...] = ()) -> None:
    """One line, before anything is written, when the target holds what save did not write: its step-NNNNNN beside a
    user's checkpoint would become what `inspect`, `verify` and a resume pick. `--force` does not pass this: it
    overrides what the filesystem cannot do, and here the harm is to the user's data, not to the measurement."""
    try:
        foreign = foreign_entries(target, also)
    except OSError as exc:
        raise CkptbenchError(f"{target}: cannot list the target ({exc.strerror}); choose a readable directory",
                             exit_code=1) from None
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise CkptbenchError(f"{target}: holds files save did not write ({shown}); saving beside them would change "
                             "which checkpoint inspect, verify and a resume pick: choose an empty or new directory, "
                             "or a target save wrote before (--force does not apply)")


def next_name(target: str) -> str:
    """The step after the newest save, skipping past any name something else already holds."""
    steps = existing_steps(target)
    n = (steps[-1][0] if steps else 0) + 1
    while os.path.lexists(os.path.join(target, f"step-{n:06d}")):
        n += 1
    return f"step-{n:06d}"


def prune(target: str, keep: int) -> list[str]:
    """Removes all but the newest `keep` saves ckptbench wrote; returns the names removed."""
    steps = existing_steps(target)
    gone = [n for _, n in steps[:-keep]] if len(steps) > keep else []
    for n in gone:
        shutil.rmtree(os.path.join(target, n), ignore_errors=True)
    return gone


def _errno_of(exc: BaseException) -> int | None:
    """The errno behind a failed write: OSError's own (write_save turns a full or read-only target into one), or
    safetensors' "(os error N)"."""
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    m = re.search(r"os error (\d+)", str(exc))
    return int(m.group(1)) if m else None


def _fail_line(exc: BaseException, target: str, name: str, previous: str | None) -> CkptbenchError:
    kept = f"{previous} is intact" if previous else "no earlier save was there"
    code = _errno_of(exc)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
    what = {errno.ENOSPC: "no space left on the device", errno.EROFS: "the filesystem is read-only",
            errno.EDQUOT: "the disk quota is exceeded"}.get(code, os.strerror(code) if code else first)
    fix = {errno.ENOSPC: "free space, lower --keep or use --scale", errno.EROFS: "choose a writable target",
           errno.EDQUOT: "raise the quota or lower --keep"}.get(code, "check the target and its permissions")
    return CkptbenchError(f"{target}: {what} while writing {name}; the partial save was removed and {kept}; {fix}",
                          exit_code=1)


def run_save(what: str, target: str, opts: SaveOptions, *, on_save=None, on_sample=None,
             cancel: threading.Event | None = None, scale: float = 1.0, force: bool = False,
             on_preflight=None, also_ours: tuple[str, ...] = (), pick: str | None = None, on_stop=None,
             on_begin=None) -> SaveReport:
    """Saves the state of `what` (a profile name, or a checkpoint directory: the checkpoint in it a resume loads, as
    run and inspect pick it, or `pick`) `opts.count` times into `target`.

    Runs in any thread; `cancel` stops between saves and between a save's rank writes (the partial save removed).
    `on_save(SaveTiming)` after each save, `on_sample(WritebackSample)` from the sampler's thread every 250 ms;
    `on_stop(SaveReport)` when a Ctrl-C, SIGTERM or `cancel` stops the series after some saves: the report of those
    saves, before the interrupt goes on. `on_begin()` once the preflight has passed, before the first save.
    `also_ours`: files this run writes that may lie in the target (its results file), not counted as the user's."""
    from ckptbench.save.state import checkpoint_of, source_dir

    validate(opts)
    source = source_dir(what)
    if source is None and pick is not None:
        raise CkptbenchError(f"--pick {pick[:80]!r}: chooses a checkpoint within a folder, and {what} is a profile; "
                             "drop --pick")
    listing = checkpoint_of(source, pick) if source is not None else None  # its one line before the target exists
    target, made = prepare_target(target, source)
    try:
        return _save_into(what, target, opts, on_save, on_sample, cancel, scale, force, on_preflight, also_ours,
                          listing, on_stop, on_begin)
    except BaseException:
        unmake_target(target, made)
        raise
    finally:
        if made is not None:
            os.close(made)


def _save_into(what: str, target: str, opts: SaveOptions, on_save, on_sample, cancel: threading.Event | None,
               scale: float, force: bool, on_preflight, also_ours: tuple[str, ...], listing, on_stop,
               on_begin=None) -> SaveReport:
    """run_save's work once the target exists: the load, the preflight and the series of saves."""
    from ckptbench.save.analysis import analyze
    from ckptbench.save.state import load_what

    refuse_foreign(target, also_ours)
    loaded = load_what(what, opts, scale, listing)
    reaped = reap_stale(target, r"step-[0-9]{6,}")
    if reaped:  # told with the report: where a killed save's partial write went
        loaded.notes = [f"removed {len(reaped)} staging folder(s) of a save that was killed before it finished "
                        f"({', '.join(os.path.basename(p) for p in reaped[:2])}{', ...' if len(reaped) > 2 else ''})",
                        *loaded.notes]
    checks = pf.preflight(target, int(loaded.bytes * 1.02) * (opts.keep + 1))
    if on_preflight is not None:
        on_preflight(checks)
    bad = pf.blocking(checks)
    if bad and not force:
        c = bad[0]
        raise CkptbenchError(f"{target}: preflight failed: {c.name}: {c.evidence}; {c.consequence}; {c.fix} "
                             "(--force saves anyway)", exit_code=1)
    if on_begin is not None:
        on_begin()
    sampler = WritebackSampler(target, on_sample=on_sample).start()
    saves: list[SaveTiming] = []
    samples = None

    def report() -> SaveReport:
        return analyze(target, opts, saves, samples, checks, sampler.sectors_written_bytes(), loaded.notes)

    try:
        _series(target, opts, loaded, sampler, saves, on_save, cancel)
        samples = sampler.stop()
        return report()
    except BaseException as exc:
        if samples is None:
            samples = sampler.stop()  # its thread never outlives the series
        if saves and on_stop is not None and isinstance(exc, (KeyboardInterrupt, Cancelled)):
            on_stop(report())  # the saves that finished, analysed as a whole series is
        raise


def _series(target: str, opts: SaveOptions, loaded, sampler: WritebackSampler, saves: list, on_save,
            cancel: threading.Event | None) -> None:
    """The saves themselves, each appended to `saves` and handed to `on_save` as soon as it is durable and timed."""
    from ckptbench.save.analysis import dirty_peak, throttled
    from ckptbench.save.write import write_save

    start, ended = time.perf_counter(), 0.0
    for i in range(opts.count):
        if cancel is not None and cancel.is_set():
            raise Cancelled(f"save cancelled after {len(saves)} save(s)")
        steps = existing_steps(target)
        name = next_name(target)
        try:
            out = write_save(target, name, loaded.state, loaded.assignment, loaded.info,
                             async_save=opts.async_save, stagger_s=opts.stagger_s, fsync=opts.fsync, cancel=cancel)
        except CkptbenchError:
            raise
        except BaseException as exc:  # a writer's failure (OSError, safetensors', torch's, DCP's) is one line
            if not isinstance(exc, Exception) and type(exc).__name__ != "CheckpointException":
                raise  # KeyboardInterrupt, SystemExit (DCP's CheckpointException is a BaseException too)
            raise _fail_line(exc, target, name, steps[-1][1] if steps else None) from None
        now = sampler.clock()
        window, ended = sampler.between(ended, now), now
        timing = SaveTiming(i + 1, name, out.bytes, out.blocking_s if out.blocking_s is not None else out.durable_s,
                            out.written_s, out.durable_s,
                            opts.interval_s is not None and out.durable_s > opts.interval_s,
                            [asdict(s) for s in out.spans], dirty_peak(window), throttled(window) if window else None)
        saves.append(timing)
        if on_save is not None:
            on_save(timing)
        prune(target, opts.keep)
        if opts.interval_s is not None and i + 1 < opts.count:
            wait = start + (i + 1) * opts.interval_s - time.perf_counter()
            if wait > 0 and (cancel.wait(wait) if cancel is not None else time.sleep(wait)):
                raise Cancelled(f"save cancelled after {len(saves)} save(s)")
            start = max(start, time.perf_counter() - (i + 1) * opts.interval_s)  # an overrun shifts the grid
