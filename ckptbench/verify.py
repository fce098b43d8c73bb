"""Verify: every file against the manifest's size and digest; without a manifest, digests with no reference."""

from __future__ import annotations

import os
from dataclasses import dataclass

import fastio

from ckptbench import manifest as mf
from ckptbench import tree


@dataclass(frozen=True)
class VerifyReport:
    has_reference: bool
    files: int
    bytes: int
    problems: tuple[tuple[str, str], ...]  # (relative path, what is wrong)
    digests: dict[str, str]

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


def verify(directory: str, *, concurrency: int = 8, hash: str = "crc32c") -> VerifyReport:
    man = mf.read(directory)
    if man is None:
        rels = tree.rels(directory)
        alg = hash
    else:
        rels = [e.path for e in man.files]
        alg = man.hash
    res = fastio.read_files([os.path.join(directory, r) for r in rels], hash=alg, concurrency=concurrency)
    by_rel = dict(zip(rels, res.files))
    if man is None:
        problems = tuple((r, f"unreadable: {f.error.message}") for r, f in by_rel.items() if f.error)
    else:
        problems = compare(man, by_rel)
    return VerifyReport(man is not None, len(rels), res.bytes, problems,
                        {r: f.digest for r, f in by_rel.items() if f.digest})
