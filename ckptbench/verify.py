"""Verify: every file against the manifest's size and digest; without a manifest, digests with no reference."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import fastio

from ckptbench import confine, layouts, tree
from ckptbench import manifest as mf
from ckptbench.errors import CkptbenchError


@dataclass(frozen=True)
class VerifyReport:
    has_reference: bool
    files: int
    bytes: int
    problems: tuple[tuple[str, str], ...]  # (relative path, what is wrong)
    digests: dict[str, str]
    unlisted: tuple[str, ...] = ()  # files a restore would read that the manifest does not list: no reference

    @property
    def ok(self) -> bool:
        return not self.problems


def compare(man: mf.Manifest, results: dict[str, fastio.FileResult]) -> tuple[tuple[str, str], ...]:
    """Problems of read results (keyed by relative path) against the manifest."""
    problems = []
    for e in man.files:
        r = results.get(e.path)
        if r is None:
            problems.append((e.path, "listed in the manifest but not read"))
        elif r.error is not None:
            problems.append((e.path, f"unreadable: {r.error.message}"))
        elif r.bytes != e.bytes:
            problems.append((e.path, f"{r.bytes} bytes, manifest says {e.bytes}"))
        elif r.digest != e.digest:
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


def verify(directory: str, *, concurrency: int = 8, hash: str = "crc32c") -> VerifyReport:
    """Every file against the manifest; files the manifest names are confined to the directory and read no
    further than their declared size. A file or directory that cannot be read is a problem of its own."""
    man = mf.read(directory)
    skipped: list[tuple[str, str]] = []
    problems: list[tuple[str, str]] = []
    if man is None:
        alg = hash
        rels = list(layouts.select(directory, tree.rels(directory, skipped)).files)  # DeepSpeed: `latest`'s step
        if not rels and not skipped:  # nothing was checked: not "OK"
            raise CkptbenchError(f"{directory}: empty: the directory holds no files; point at a checkpoint directory")
        specs = [fastio.FileSpec(os.path.join(directory, r)) for r in rels]
    else:
        alg = man.hash
        listed = {e.path for e in man.files} | {mf.MANIFEST_NAME}
        unlisted = tuple(r for r in layouts.select(directory, tree.rels(directory)).files if r not in listed)
        rels, specs = [], []
        for e in man.files:
            path, problem = _member(directory, e)
            if problem:
                problems.append((e.path, problem))
            else:
                rels.append(e.path)
                specs.append(fastio.FileSpec(path, e.bytes))
    res = fastio.read_files(specs, hash=alg, concurrency=concurrency)
    by_rel = dict(zip(rels, res.files))
    if man is None:
        problems += [(r, f"unreadable: {f.error.message}") for r, f in by_rel.items() if f.error]
    else:
        refused = {p for p, _ in problems}
        problems += [p for p in compare(man, by_rel) if p[0] not in refused]
    problems += [(os.path.relpath(d, directory), f"unreadable directory ({why})") for d, why in skipped]
    return VerifyReport(man is not None, len(man.files) if man is not None else len(rels), res.bytes, tuple(problems),
                        {r: f.digest for r, f in by_rel.items() if f.digest}, unlisted if man is not None else ())
