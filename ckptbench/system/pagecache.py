"""Cache conditions, verified rather than assumed: cold (evicted) and hot (resident)."""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

import fastio

from ckptbench.core.options import CACHE_MODES  # noqa: F401  what restore checks --cache against
from ckptbench.core.units import human_pct

NO_PAGE_CACHE = "no local page cache"  # in the note of a source whose reads all go to a server (S3)
COLD_MAX = 0.05  # a "cold" read with more than this resident is not cold
HOT_MIN = 0.95


@dataclass(frozen=True)
class CacheCondition:
    requested: str
    residency_before: float
    verified: bool
    note: str = ""
    residency_after: float | None = None
    local: bool = True  # False: a source whose reads all go to a server (S3): nothing to evict or read in

    def with_after(self, fraction: float) -> "CacheCondition":
        return CacheCondition(self.requested, self.residency_before, self.verified, self.note, fraction, self.local)

    def to_dict(self) -> dict:
        return asdict(self)


def prepare(paths: list[str], requested: str, *, drop_caches: bool = False) -> CacheCondition:
    """Puts `paths` in the requested cache state and measures that it holds."""
    paths = _present(paths)
    if requested == "cold":
        note = ""
        if drop_caches:
            try:
                fastio.drop_caches()
            except fastio.FastIOError as exc:
                note = f"drop_caches refused ({exc.strerror}); evicted file by file instead. "
        _evict(paths)
        frac = _residency(paths).fraction
        if frac > COLD_MAX:
            return CacheCondition("cold", frac, False, note + f"not cold: {human_pct(frac)} still resident after eviction "
                                  "(tmpfs, or pages mapped by another process)")
        return CacheCondition("cold", frac, True, note.strip())
    if requested == "hot":
        fastio.read_files(paths, concurrency=2, read="pread", hash="none", nofollow=True)
        frac = _residency(paths).fraction
        if frac < HOT_MIN:
            return CacheCondition("hot", frac, False, f"not hot: only {human_pct(frac)} resident after a pre-read "
                                  "(the page cache is smaller than the data)")
        return CacheCondition("hot", frac, True)
    frac = _residency(paths).fraction
    return CacheCondition("as-is", frac, True)


def residency_of(paths: list[str]) -> float:
    return _residency(_present(paths)).fraction


def residency_of_each(paths: list[str], *, held: bool = False) -> tuple[tuple[str, int, int], ...]:
    """(path, bytes resident, bytes) of each file that can be opened. A path that is a symbolic link is not followed
    (one swapped in since the listing points out of the checkpoint), unless `held`: /proc/self/fd names of files
    the caller holds open, which are links to them."""
    return _residency(_present(paths), held=held).per_file


def evict(paths: list[str], *, held: bool = False) -> None:
    """Evicts the files that can be opened; `held` as in residency_of_each."""
    _evict(_present(paths), held=held)


def _residency(paths: list[str], *, held: bool = False) -> fastio.Residency:
    """Residency of the files that can be opened: an unreadable one is its read's error to report, and must
    not sink the measurement of the others."""
    try:
        return fastio.residency(paths, nofollow=not held)
    except fastio.FastIOError:
        parts = []
        for p in paths:
            try:
                parts.append(fastio.residency([p], nofollow=not held))
            except fastio.FastIOError:
                pass
        return fastio.Residency(sum(r.resident for r in parts), sum(r.total for r in parts),
                                tuple(x for r in parts for x in r.per_file))


def _evict(paths: list[str], *, held: bool = False) -> None:
    """Evicts every file it can; the ones it cannot open fail in the read that follows, naming themselves."""
    try:
        fastio.evict(paths, nofollow=not held)
    except fastio.FastIOError:
        pass


def _present(paths: list[str]) -> list[str]:
    """A file that vanished since listing is the read's error to report, not the cache step's."""
    return [p for p in paths if os.path.isfile(p)]
