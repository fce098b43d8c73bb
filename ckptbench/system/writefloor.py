"""The save side of the floor: how fast this box makes bytes durable in a directory, and a save held against it.

The figure: WRITE_SAMPLE bytes written in 1 MiB calls over 1 and 4 files at once, each fsync'd, the best level
kept; random bytes, so a compressing or deduplicating filesystem does not report its own trick. The files are ours
(a name no checkpoint has, created exclusively) and are removed whatever happens; nothing else is touched.
Cached beside the restore figures (floor.json, "write", per mount), a day, this box only.
A save's floor is the larger of its bytes over that rate and over the copy rate (serializing moves every byte once);
its efficiency is the floor over the median time until durable of the saves the sustained throughput is taken over.
"""

from __future__ import annotations

import os
import shlex
import shutil
import statistics
import threading
import time
from dataclasses import asdict

from ckptbench.core.errors import CkptbenchError, printable, redact
from ckptbench.system import binding as binding_words
from ckptbench.system import floor as fl
from ckptbench.system import probes
from ckptbench.core.units import human_age

WRITE_SAMPLE = 256 << 20
LEVELS = (1, 4)
_BLOCK = 1 << 20


def mount_key_of(path: str) -> str:
    """The write figure's key: the mount holding `path`, as a restore's storage figure is keyed."""
    m = probes.mount_of(path)
    return fl.mount_key({"mount_point": getattr(m, "mount_point", None), "fs_type": getattr(m, "fs_type", None)})


def _check_directory(directory: str) -> None:
    if not os.path.isdir(directory):
        what = "not a directory" if os.path.lexists(directory) else "no such directory"
        raise CkptbenchError(f"{directory}: {what}; --write-to names the directory your saves go to")


def _write_files(directory: str, level: int, size: int, block: bytes) -> float:
    """Seconds to write `size` bytes over `level` new files in `directory`, each fsync'd; the files are removed."""
    names = [os.path.join(directory, f".ckptbench-floor-write-{os.getpid()}-{i}") for i in range(level)]
    blocks = max(1, size // level // len(block))
    errors: list[OSError] = []
    made: list[str] = []  # only what this call created is removed: a file already at one of the names is not ours

    def one(i: int) -> None:
        try:
            fd = os.open(names[i], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            errors.append(exc)
            return
        made.append(names[i])
        try:
            view = memoryview(block)
            for _ in range(blocks):
                done = 0
                while done < len(view):  # os.write may write less than asked
                    done += os.write(fd, view[done:])
            os.fsync(fd)
        except OSError as exc:
            errors.append(exc)
        finally:
            os.close(fd)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(level)]
    t0 = time.perf_counter()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        seconds = time.perf_counter() - t0
    finally:
        for n in made:
            try:
                os.unlink(n)
            except FileNotFoundError:
                pass
    if errors:
        raise CkptbenchError(f"{directory}: cannot write the floor's sample ({errors[0].strerror or errors[0]}); "
                             f"point --write-to at a directory you can write, with {WRITE_SAMPLE >> 20} MiB free")
    return level * blocks * len(block) / seconds


def write_ceiling(directory: str, size: int = WRITE_SAMPLE, levels: tuple[int, ...] = LEVELS,
                  repeats: int = 1) -> fl.Ceiling:
    """How fast bytes become durable in `directory`, at the best of `levels` files written at once."""
    _check_directory(directory)
    usage = shutil.disk_usage(directory)
    if usage.total == 0:  # procfs, sysfs: "0 MiB free ... free some space" was advice no one could take
        raise CkptbenchError(f"{printable(directory)}: a filesystem that holds no blocks (procfs, sysfs, ...), where "
                             "no save lands; point --write-to at the directory your saves go to")
    free = usage.free
    if free < 2 * size:
        raise CkptbenchError(f"{directory}: {free >> 20} MiB free, the write figure needs {2 * size >> 20} MiB; "
                             "free some space or point --write-to elsewhere on the same filesystem")
    block = os.urandom(_BLOCK)
    best, best_level = [], levels[0]
    for level in levels:
        rates = [_write_files(directory, level, size, block) for _ in range(repeats)]
        if not best or statistics.median(rates) > statistics.median(best):
            best, best_level = rates, level
    c = fl.ceiling_of(best, f"{size >> 20} MiB of random bytes written and fsync'd over {best_level} file(s) at "
                          f"once, best of {', '.join(map(str, levels))}")
    c.sample_bytes = size
    return c


def measure_write(directory: str, *, remeasure: bool = False, path: str | None = None) -> tuple[str, fl.Ceiling]:
    """The write figure of `directory`'s mount: cached when this box's and fresh, else measured and cached."""
    _check_directory(directory)  # first: a cached figure of the same mount must not hide a mistyped directory
    path = path or fl.cache_path()
    mount = mount_key_of(directory)
    if not remeasure and (kept := cached_write(mount, path)) is not None:
        return mount, kept
    c = write_ceiling(directory)
    doc = fl._load_cache(path)
    if doc.get("box") != fl.box_key():  # another box's figures are not kept beside this one's
        doc = {"schema": fl.SCHEMA, "box": fl.box_key(), "ceilings": {}, "storage": {}}
    writes = doc.get("write") if isinstance(doc.get("write"), dict) else {}
    doc["write"] = writes | {mount: asdict(c)}
    if (trouble := fl.write_cache(path, doc)):
        c.method += f" (NOT kept: {path}: {trouble}; a save will not find it)"
    return mount, c


def cached_write(mount: str, path: str | None = None) -> fl.Ceiling | None:
    """`mount`'s cached write figure when this box's and fresh; never measures."""
    doc = fl._load_cache(path or fl.cache_path())
    if doc.get("box") != fl.box_key() or not isinstance(doc.get("write"), dict):
        return None
    return fl.valid_ceiling(doc["write"].get(mount), time.time())


NO_WRITE = "no write figure for this mount: `ckptbench floor --write-to DIR` measures it (256 MiB, seconds)"


def save_fields(target: str, bytes_saved: int, durable_s: list[float], which: str) -> dict:
    """A save's floor fields: its bytes over the cached write rate of the target's mount and over the copy rate,
    against the median time until durable of `durable_s`: the saves the sustained throughput is taken over, which
    `which` says in words ("the 2 save(s) after the first")."""
    write = cached_write(mount_key_of(target))
    box = fl.cached()
    if write is None:  # the command names the target just saved to: the user was left to fill in DIR
        return fl.unmeasured(NO_WRITE.replace("DIR", shlex.quote(printable(redact(target)))))
    times = {"storage write": bytes_saved / (write.gbps * 1e9)}
    if box is not None and "copy" in box.ceilings:
        times["copy"] = bytes_saved / (box.ceilings["copy"].gbps * 1e9)
    binding = max(times, key=times.get)
    floor_s = times[binding]
    measured = statistics.median(durable_s) if durable_s else None
    rate = write if binding == "storage write" else box.ceilings["copy"]
    return {"floor_s": floor_s, "efficiency": fl.efficiency(floor_s, measured), "binding": binding,
            "binding_gbps": rate.gbps, "binding_how": binding_words.how(binding, destination=fl.REUSED, hot=False),
            "floor_times_s": times, "floor_gbps": bytes_saved / floor_s / 1e9,
            "floor_note": f"until durable (median of {which}, as the sustained throughput); the write figure "
                          f"measured {human_age(write.age_s)} ago"}
