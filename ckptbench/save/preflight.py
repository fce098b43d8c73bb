"""Preflight of a save target: what the filesystem under it can do for an atomic, durable checkpoint, probed with
real calls on a scratch file (rename, fsync of a file and of the directory, O_DIRECT) and the free space."""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import uuid
from dataclasses import dataclass

from ckptbench.system import fuse as fuse_probes
from ckptbench.system import probes
from ckptbench.core.units import human_bytes

ESSENTIAL = ("rename", "free space")  # without these a save cannot be atomic, or cannot finish


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool | None  # None: the probe could not tell
    evidence: str
    consequence: str
    fix: str


def _why(exc: OSError) -> str:
    return f"{errno.errorcode.get(exc.errno, 'error')} ({exc.strerror})" if exc.errno else str(exc)


def _probe_rename(target_dir: str, scratch: str) -> tuple[Check, str | None]:
    """Creates the scratch file and renames it; returns the name it ended with (None when no file was written)."""
    consequence = "a save cannot be atomic: a crash mid-save leaves a half checkpoint under the final name"
    try:
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        return Check("rename", False, f"cannot create a file in {target_dir}: {_why(exc)}",
                     "nothing can be saved here", "choose a writable target (check the mount is rw and the "
                     "permissions)"), None
    try:
        os.write(fd, b"\0" * 4096)
    except OSError as exc:
        os.close(fd)
        return Check("rename", False, f"cannot write a 4 KiB file in {target_dir}: {_why(exc)}",
                     "nothing can be saved here", "free space or choose another target"), None
    os.close(fd)
    renamed = scratch + ".renamed"
    try:
        os.rename(scratch, renamed)
    except OSError as exc:
        return Check("rename", False, f"rename in {target_dir} failed: {_why(exc)}", consequence,
                     "save to a filesystem with atomic rename (local disk, NFS, Lustre) and copy from there"), scratch
    daemon = _object_store_fuse(target_dir)
    if daemon:
        return Check("rename", False, f"a file renamed, but {target_dir} is a {daemon} FUSE mount over an object "
                     "store: renaming the save's directory copies every object and deletes the old ones",
                     consequence, "save to local disk and upload, or write through the S3 API"), renamed
    return Check("rename", True, "a file renamed within the target", "", ""), renamed


def _object_store_fuse(target_dir: str) -> str | None:
    """The daemon's name when `target_dir` is on a FUSE mount of an object store (s3fs, goofys, ...), else None."""
    m = probes.mount_of(target_dir)
    if not isinstance(m, probes.Mount):
        return None
    kind = fuse_probes.fuse_kind(m)
    return kind if isinstance(kind, str) and kind in fuse_probes.FUSE_DAEMONS else None


def _probe_fsync_file(path: str) -> Check:
    consequence = "a save can be reported durable while its bytes are still only in memory"
    try:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return Check("fsync file", False, f"fsync of a file failed: {_why(exc)}", consequence,
                     "mount without options that disable sync (e.g. nobarrier, async on NFS) or save elsewhere")
    return Check("fsync file", True, "fsync of a written file returned 0", "", "")


def _probe_fsync_dir(target_dir: str) -> Check:
    try:
        fd = os.open(target_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        return Check("fsync dir", False, f"fsync of the directory failed: {_why(exc)}",
                     "the rename that publishes a save may be lost in a crash, leaving the previous one",
                     "a filesystem that syncs directories (ext4, xfs); FUSE mounts often do not")
    return Check("fsync dir", True, "fsync of the target directory returned 0", "", "")


def _probe_direct(path: str) -> Check:
    consequence = "writes always go through the page cache, so a big save competes with training for memory"
    buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
    try:
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    except OSError as exc:
        return Check("O_DIRECT", False, f"open with O_DIRECT failed: {_why(exc)}", consequence,
                     "nothing to fix for correctness; for big saves prefer a filesystem that takes O_DIRECT")
    try:
        os.write(fd, buf)
    except OSError as exc:
        return Check("O_DIRECT", False, f"a 4 KiB O_DIRECT write failed: {_why(exc)}", consequence,
                     "nothing to fix for correctness; for big saves prefer a filesystem that takes O_DIRECT")
    finally:
        os.close(fd)
        buf.close()
    return Check("O_DIRECT", True, "a 4 KiB aligned O_DIRECT write succeeded", "", "")


def _free_space(target_dir: str, need_bytes: int) -> Check:
    try:
        free = shutil.disk_usage(target_dir).free
    except OSError as exc:
        return Check("free space", None, f"statvfs failed: {_why(exc)}", "a save may fail half way with ENOSPC",
                     "check the target's free space by hand")
    # in one unit scaled to each (59428.5 MiB free beside 53.2 MiB needed was read a digit at a time)
    evidence = f"{human_bytes(free)} free, {human_bytes(need_bytes)} needed (checkpoint × (keep + 1))"
    if free >= need_bytes:
        return Check("free space", True, evidence, "", "")
    return Check("free space", False, evidence, "a save fails half way with ENOSPC",
                 "free space, lower --keep, or save a smaller checkpoint (--scale)")


def preflight(target_dir: str, need_bytes: int) -> list[Check]:
    """rename, fsync file, fsync dir, O_DIRECT and free space of an existing directory; the scratch file is
    removed whatever happens."""
    scratch = os.path.join(target_dir, f".ckptbench-preflight-{uuid.uuid4().hex[:8]}")
    rename, left = _probe_rename(target_dir, scratch)
    checks = [rename]
    try:
        if left is not None:
            checks.append(_probe_fsync_file(left))
            checks.append(_probe_fsync_dir(target_dir))
            checks.append(_probe_direct(left))
        else:
            for name in ("fsync file", "fsync dir", "O_DIRECT"):
                checks.append(Check(name, None, "not probed: no file could be written", "", ""))
    finally:
        for path in (scratch, scratch + ".renamed"):
            try:
                os.unlink(path)
            except OSError:
                pass
    checks.append(_free_space(target_dir, need_bytes))
    return checks


def blocking(checks: list[Check]) -> list[Check]:
    """The failed essential checks: any of these stops a save unless forced."""
    return [c for c in checks if c.name in ESSENTIAL and c.ok is False]
