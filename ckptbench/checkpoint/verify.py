"""Verify: every file against the manifest's size and digest; without a manifest, digests with no reference."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import fastio

from ckptbench.checkpoint import confine
from ckptbench.checkpoint import manifest as mf
from ckptbench.core.errors import CkptbenchError


@dataclass(frozen=True)
class VerifyReport:
    has_reference: bool
    files: int
    bytes: int
    problems: tuple[tuple[str, str], ...]  # (relative path, what is wrong)
    digests: dict[str, str]
    unlisted: tuple[str, ...] = ()  # files a restore would read that the manifest does not list: no reference
    source: str = ""  # the checkpoint checked (resume.choose's pick below the directory given)
    why: str = ""  # why that one, where the directory held several

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def verified(self) -> bool:
        """Every file's digest computed and matched against a reference: only then is anything verified."""
        return self.has_reference and self.ok and not self.unlisted


def compare(man: mf.Manifest, results: dict[str, fastio.FileResult],
            digests: bool = True) -> tuple[tuple[str, str], ...]:
    """Problems of read results (keyed by relative path) against the manifest; with `digests` false, its files and
    sizes alone (a read that computed no digest of the manifest's kind still owes every file it lists)."""
    problems = []
    for e in man.files:
        r = results.get(e.path)
        if r is None:
            problems.append((e.path, "listed in the manifest but not read"))
        elif r.error is not None:
            problems.append((e.path, f"unreadable: {r.error.message}"))
        elif r.bytes != e.bytes:
            problems.append((e.path, f"{r.bytes} bytes, manifest says {e.bytes}"))
        elif digests and r.digest != e.digest:
            problems.append((e.path, f"{man.hash} {r.digest}, manifest says {e.digest}"))
    return tuple(problems)


def _member(directory: str, e: mf.FileEntry) -> tuple[str | None, str | None]:
    """(real path, None) for a manifest entry that is a regular file of its declared size inside the
    checkpoint, else (None, the problem): a crafted entry is refused before anything opens it."""
    try:
        path = confine.resolve(directory, e.path)
    except CkptbenchError as exc:
        return None, f"refused: {exc}"
    try:
        st = os.lstat(path)
    except OSError as exc:
        return None, f"unreadable: {exc.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return None, "refused: not a regular file"
    if st.st_size != e.bytes:
        return None, f"{st.st_size} bytes, manifest says {e.bytes}"
    return path, None


def verify(listing, *, concurrency: int = 8, hash: str = "crc32c") -> VerifyReport:
    """Every file of a local listing (the checkpoint a resume loads: resume.choose, as every command picks it)
    against its manifest; files the manifest names are confined to the directory and read no further than their
    declared size. A file or directory that cannot be read is a problem of its own. A manifest without digests (hash
    none) is no reference."""
    directory, man = listing.source, listing.manifest
    lay = listing.layout
    problems: list[tuple[str, str]] = []
    reference = man is not None and man.hash != "none"  # digests to match: a manifest that records them
    if not reference:
        alg = hash
        rels = [r for r in listing.rels if r != mf.MANIFEST_NAME]
        if not rels and not listing.skipped:  # nothing was checked: not "OK"
            raise CkptbenchError(f"{directory}: empty: the directory holds no files; point at a checkpoint directory")
        specs = [fastio.FileSpec(os.path.join(directory, r)) for r in rels]
        unlisted: tuple[str, ...] = ()
    else:
        alg = man.hash
        listed = {e.path for e in man.files} | {mf.MANIFEST_NAME}
        unlisted = tuple(r for r in listing.rels if r not in listed)
        rels, specs = [], []
        for e in man.files:
            path, problem = _member(directory, e)
            if problem:
                problems.append((e.path, problem))
            else:
                rels.append(e.path)
                specs.append(fastio.FileSpec(path, e.bytes))
    # below the folder the paths were made in (the manifest's members resolved to real paths): a folder swapped for a
    # link since they were checked is not read through
    res = fastio.read_files(specs, hash=alg, concurrency=concurrency, nofollow=True,
                            beneath=os.path.realpath(directory) if reference else directory)
    by_rel = dict(zip(rels, res.files))
    if not reference:
        problems += [(r, f"unreadable: {f.error.message}") for r, f in by_rel.items() if f.error]
        if man is not None:
            problems += [p for p in compare(man, by_rel) if "manifest says" in p[1] and "bytes" in p[1]]
    else:
        refused = {p for p, _ in problems}
        problems += [p for p in compare(man, by_rel) if p[0] not in refused]
    problems += [(os.path.relpath(d, directory), f"unreadable directory ({why})") for d, why in listing.skipped]
    return VerifyReport(reference, len(man.files) if man is not None else len(rels),
                        res.bytes, tuple(problems), {r: f.digest for r, f in by_rel.items() if f.digest}, unlisted,
                        directory, lay.why if lay is not None else "")
