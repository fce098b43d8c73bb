"""A checkpoint on any mounted filesystem (local disk, NFS, Lustre, FUSE), read by fastio's native engine."""

from __future__ import annotations

import errno
import os
from dataclasses import replace

import fastio

from ckptbench.system import pagecache as conditions
from ckptbench.system import probes
from ckptbench.system import readmode
from ckptbench.checkpoint import pointers, resume
from ckptbench.checkpoint import tree
from ckptbench.checkpoint import manifest as mf
from ckptbench.checkpoint.detect import format_of
from ckptbench.core.errors import CkptbenchError
from ckptbench.core.paths import require_checkpoint_dir
from ckptbench.sources.base import Listing, ReadOptions


class LocalReadHandle:
    """fastio's handle, with the answers every source's handle gives (live concurrency, error classes)."""

    live_concurrency = True

    def __init__(self, handle: fastio.ReadHandle):
        self._h = handle

    def snapshot(self) -> fastio.Snapshot:
        return self._h.snapshot()

    def set_concurrency(self, n: int) -> int:
        self._h.set_concurrency(n)
        return n

    def cancel(self) -> None:
        self._h.cancel()

    def wait(self, timeout: float | None = None) -> fastio.ReadResult | None:
        return self._h.wait(timeout)

    def completed(self, start: int = 0) -> list[int]:
        return self._h.completed(start)

    def buffer(self, i: int):
        return self._h.buffer(i)

    def scan_counts(self, i: int) -> list[int] | None:
        return self._h.scan_counts(i)

    def error_classes(self, result: fastio.ReadResult) -> dict[str, int]:
        out: dict[str, int] = {}
        for f in result.failed:
            name = errno.errorcode.get(f.error.errno, "error")
            out[name] = out.get(name, 0) + 1
        return out

    def __enter__(self) -> "LocalReadHandle":
        return self

    def __exit__(self, *exc) -> bool:
        return self._h.__exit__(*exc)


def _inside(path: str, directory: str) -> bool:
    return path.startswith(directory.rstrip(os.sep) + os.sep)


def _selected(directory: str, files: list[fastio.FileSpec], pick: str | None, odd: dict[str, str]):
    """The directory of the one checkpoint a resume loads (resume.choose: the largest step, the iteration a pointer
    names…), its files, and the Layout saying which and why."""
    rels = [os.path.relpath(f.path, directory).replace(os.sep, "/") for f in files]
    lay = resume.choose(directory, rels, pick=pick, odd=odd)
    if lay.root is not None:
        directory = os.path.join(directory, lay.root)
        prefix = lay.root + "/"
        inside = [(f, r[len(prefix):]) for f, r in zip(files, rels) if r.startswith(prefix)]
        files, rels = [f for f, _ in inside], [r for _, r in inside]
    keep = set(lay.files)
    chosen = [(f, r) for f, r in zip(files, rels) if r in keep]
    pointers.check_sizes(directory, [(r, f.size) for f, r in chosen])
    return directory, [f for f, _ in chosen], lay


def _target_files(target: str, skipped: list[tuple[str, str]], odd: dict[str, str],
                  passed: list[tuple[str, str]]) -> list[fastio.FileSpec]:
    if os.path.isdir(target):
        before = len(passed)
        found = [fastio.FileSpec(p, os.stat(p).st_size) for p in tree.files(target, skipped, odd, passed)]
        if not found and not skipped:
            raise tree.nothing_to_read(target, passed[before:])
        return found
    if os.path.isfile(target):  # a link the user names is followed here, once: the read opens what it names
        return [fastio.FileSpec(os.path.realpath(target) if os.path.islink(target) else target,
                                os.stat(target).st_size)]
    if os.path.exists(target):
        raise CkptbenchError(f"{target}: not a regular file or directory")
    raise CkptbenchError(f"{target}: no such file or directory; point at a checkpoint directory")


def _beneath(directory: str | None, files) -> str | None:
    """The folder the engine opens `files` below, so that a folder of the listing swapped for a link since is not
    read through: the directory as given, whose names the listing joined, or its real path, under which
    confine.resolve put a manifest's or a rank's members. None for files named one by one."""
    if directory is None:
        return None
    for root in (directory, os.path.realpath(directory)):
        prefix = root.rstrip("/") + "/"
        if all(f.path.startswith(prefix) and len(f.path) > len(prefix) for f in files):
            return root
    return None


class LocalSource:
    """One checkpoint directory, or (for a plain read) any files and directories named together."""

    scheme = None
    has_page_cache = True
    files_on_disk = True

    def __init__(self, targets: str | list[str], *, checkpoint: bool = False, pick: str | None = None):
        self.pick = pick
        self.targets = [targets] if isinstance(targets, str) else list(targets)
        if not self.targets:
            raise CkptbenchError("nothing to read: name a directory or files")
        if checkpoint:  # a restore needs one directory; say so before anything is read
            require_checkpoint_dir(self.targets[0])
        self.url = self.targets[0] if len(self.targets) == 1 else ", ".join(self.targets)
        self.directory = self.targets[0] if len(self.targets) == 1 and os.path.isdir(self.targets[0]) else None

    def list(self) -> Listing:
        """Every regular file (stat'ed) of the checkpoint its layout names, the manifest when there is one, and the
        format ("unknown" if none)."""
        skipped: list[tuple[str, str]] = []
        odd: dict[str, str] = {}
        passed: list[tuple[str, str]] = []
        files = [spec for t in self.targets for spec in _target_files(t, skipped, odd, passed)]
        if self.directory is None:
            if self.pick is not None:
                raise CkptbenchError(f"--pick {self.pick[:80]!r}: chooses within one checkpoint directory; name one "
                                     "directory, or leave --pick out")
            return Listing(self.url, files, None, "unknown", tuple(skipped), passed=tuple(passed))
        directory, files, lay = _selected(self.directory, files, self.pick, odd)
        man = mf.read(directory)
        fmt = format_of(man, [f.path for f in files], directory)
        mine = tuple((p, w) for p, w in passed if _inside(p, directory))  # another step's symlink is not this one's
        lay = replace(lay, skipped=lay.skipped + tuple((os.path.relpath(p, self.directory), w) for p, w in mine))
        return Listing(directory, files, man, fmt, tuple(skipped), resume.with_unloaded(lay, fmt), passed=mine)

    def _paths(self, listing: Listing) -> list[str]:
        return [f.path for f in listing.files]

    def prepare_cache(self, listing: Listing, cache: str, *, drop_caches: bool = False) -> conditions.CacheCondition:
        return conditions.prepare(self._paths(listing), cache, drop_caches=drop_caches)

    def residency(self, listing: Listing) -> float | None:
        return conditions.residency_of(self._paths(listing))

    def choose_read(self, listing: Listing, opts: ReadOptions,
                    resident: float | None = None) -> tuple[ReadOptions, str]:
        """`--read auto` resolved from the files' residency (measured here unless the caller just did, preparing
        the cache) and what their filesystem accepts."""
        if opts.read != readmode.AUTO:
            return opts, f"as asked: --read {opts.read}"  # the short reason (before ": ") is what the dashboard shows
        if any(f.offset is not None and f.offset % 4096 for f in listing.files):  # a rank's byte ranges
            return replace(opts, read="pread"), ("byte ranges: pread at tensor offsets, as O_DIRECT needs "
                                                 "4096-aligned ones")
        if resident is None:
            resident = self.residency(listing)
        choice = readmode.choose([(f.path, f.size or 0) for f in listing.files], resident, opts.block_size)
        return replace(opts, read=choice.mode), choice.why

    def start_read(self, listing: Listing, opts: ReadOptions, *, into: str = "hash",
                   stage_dir: str | None = None, scan: dict | None = None) -> LocalReadHandle:
        if into == "stage":
            raise CkptbenchError(f"{self.url}: the files are already on a filesystem; nothing to stage")
        opts, _ = self.choose_read(listing, opts)
        return LocalReadHandle(fastio.start(
            listing.files, concurrency=opts.concurrency, read=opts.read, hash=opts.hash,
            block_size=opts.block_size, chunk_size=opts.chunk_size, multipart=opts.multipart,
            into_memory=into == "memory", scan=scan if into == "memory" and opts.read != "mmap" else None,
            nofollow=True, beneath=_beneath(self.directory, listing.files)))

    def retry_classes(self) -> dict[str, int]:
        return {}

    def mount(self, root: str = "/") -> probes.Mount | probes.Unknown:
        return probes.mount_of(self.directory or self.targets[0], root)

    def describe(self, root: str = "/") -> dict:
        m = self.mount(root)
        return {"fs_type": m.fs_type if isinstance(m, probes.Mount) else None,
                "mount_point": m.mount_point if isinstance(m, probes.Mount) else None}
